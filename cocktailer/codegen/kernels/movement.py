"""Data movement: RESHAPE, PERMUTE, EXPAND, CAT, SELECT, UPDATE, GATHER, SCATTER.

SELECT/UPDATE keys are resolved at compile time into a strided view of the operand (a base
offset plus one stride per result dim) -- Python slice semantics via `slice.indices` -- except
for ("dyn",) items, whose index is read at run time from a 0-d integer operand, wrapped like
Python and bounds-checked (every worker checks the same value, so all fail together).
UPDATE copies x and overwrites the region with v broadcast; each worker writes only the
elements in its own block of the result, so no barrier is needed between the two steps.
SCATTER (GATHER's inverse, rows put at an index tensor's positions) is split the same way; both
skip the copy where the result is their first operand's own buffer (written in place).
"""
from __future__ import annotations

import torch

from cocktailer.codegen.kernels.common import (block, broadcast_strides, c_shape, ceil_div, collapse, convert, grain,
                                               map_kernel, numel, offset_expr, product, split, strided_copy,
                                               strides_of, total)
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.ir import Operation, SymbolicSizeError, Value
from cocktailer.ir.infer import takes_whole

INT_INDEX = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _flat_copy(ctx: KernelContext, out: Value, src: str) -> str:
    n = numel(c_shape(ctx, out.type.shape))
    if n == 0:
        return ""
    T = ctype(out.type.dtype)
    return block(f"{T}* k_y = {ctx.ptr(out)}; const {T}* k_x = {src};", split(ctx, n, grain(out.type.dtype)),
                 f"if (k_hi > k_lo && k_y != k_x) memcpy(k_y + k_lo, k_x + k_lo, (size_t)(k_hi - k_lo) * sizeof({T}));")


def render_reshape(op: Operation, ctx: KernelContext) -> str:
    return _flat_copy(ctx, op.results[0], ctx.ptr(op.operands[0]))


def render_expand(op: Operation, ctx: KernelContext) -> str:
    return map_kernel(ctx, op.results[0], op.operands, lambda xs: xs[0])


TILE = 32


def render_permute(op: Operation, ctx: KernelContext) -> str:
    x, out = op.operands[0], op.results[0]
    st = strides_of(c_shape(ctx, x.type.shape))
    strides = [st[d] for d in op.attrs["dims"]]
    shape = c_shape(ctx, out.type.shape)
    sizes, (sts,) = collapse(shape, [strides])
    if len(sizes) >= 2 and sts[-2] == 1 and sts[-1] != 1 and numel(shape) != 0:
        return _transpose(ctx, x, out, sizes, sts)
    return strided_copy(ctx, out, ctx.ptr(x), x.type.dtype, "0", shape, strides)


def _transpose(ctx: KernelContext, x: Value, out: Value, sizes, sts) -> str:
    """out[..., r, c] = x[... + r + c * sc]: tiles of TILE x TILE, so both sides touch whole lines."""
    R, C, sc = sizes[-2], sizes[-1], sts[-1]
    outer, osts = sizes[:-2], sts[:-2]
    tr, tc = ceil_div(R, TILE), ceil_div(C, TILE)
    T = ctype(out.type.dtype)
    return block(f"{T}* k_y = {ctx.ptr(out)}; const {T}* k_x = {ctx.ptr(x)};",
                 split(ctx, product(numel(outer), tr, tc), 1),
                 "for (int64_t k_t = k_lo; k_t < k_hi; ++k_t) {",
                 f"const int64_t k_o = k_t / {product(tr, tc)}, k_rt = (k_t / {tc}) % {tr}, k_ct = k_t % {tc};",
                 f"const {T}* k_p = k_x + {offset_expr('k_o', outer, osts) if outer else '0'};",
                 f"{T}* k_q = k_y + k_o * {product(R, C)};",
                 f"const int64_t k_r1 = CK_MIN({R}, (k_rt + 1) * {TILE}), k_c1 = CK_MIN({C}, (k_ct + 1) * {TILE});",
                 f"for (int64_t k_c = k_ct * {TILE}; k_c < k_c1; ++k_c)",
                 f"for (int64_t k_r = k_rt * {TILE}; k_r < k_r1; ++k_r) k_q[k_r * {C} + k_c] = k_p[k_r + k_c * {sc}];",
                 "}")


def render_cat(op: Operation, ctx: KernelContext) -> str:
    out = op.results[0]
    shape = c_shape(ctx, out.type.shape)
    n = numel(shape)
    if n == 0:
        return ""
    d = op.attrs["dim"] % len(shape)
    if isinstance(shape[d], str):   # the operands' sizes along it would be sums of sizes
        raise SymbolicSizeError(out.type.shape[d], "a concatenation along a symbolic dim")
    inner = numel(shape[d + 1:])
    row = product(shape[d], inner)   # an expression where a dim inside the rows is symbolic
    T = ctype(out.type.dtype)
    lines = [f"{T}* k_y = {ctx.ptr(out)};", split(ctx, n, grain(out.type.dtype)),
             "for (int64_t k_i = k_lo; k_i < k_hi; ) {",
             f"const int64_t k_r = k_i / {row}, k_c = k_i - k_r * {row}, k_e = CK_MIN({row}, k_c + (k_hi - k_i));",
             f"{T}* k_q = k_y + k_r * {row};"]
    off = 0
    for t, v in enumerate(op.operands):
        length = product(v.type.shape[d], inner) if len(v.type.shape) == len(shape) else 0
        if length == 0:
            continue
        src = v.type.dtype
        lines.append(f"{{ const {ctype(src)}* k_s = {ctx.ptr(v)} + k_r * {length};")
        lines.append(f"const int64_t k_a = CK_MAX(k_c, {off}), k_b = CK_MIN(k_e, {total(off, length)});")
        if src == out.type.dtype:
            lines.append(f"if (k_a < k_b) memcpy(k_q + k_a, k_s + (k_a - {off}), (size_t)(k_b - k_a) * sizeof({T})); }}")
        else:
            lines.append(ctx.simd())
            lines.append(f"for (int64_t k_j = k_a; k_j < k_b; ++k_j) k_q[k_j] = {convert(f'k_s[k_j - {off}]', src, out.type.dtype)}; }}")
        off = total(off, length)
    lines += ["k_i += k_e - k_c;", "}"]
    return block(*lines)


# -- SELECT / UPDATE -------------------------------------------------------------------------

def _view(op: Operation, x: Value, dynamic: list[Value], ctx: KernelContext):
    """Resolve the key into (checks: C lines, base: C expr, sizes, strides) of the view x[key].
    An index into a dim of a symbolic size is wrapped and checked at run time, as a ("dyn",)
    one is; a slice of such a dim takes all of it (type inference allows no other). A key over
    lanes (`ir.ops.build_key`) gives lane `k_l`'s view: ("lanes",) and each ("lane",) index, its
    entry for lane k_l (every worker checks every lane's, so all agree), add to the base, and
    the sizes are one lane's region."""
    syms = tuple(x.type.shape)
    shape = c_shape(ctx, syms)
    st = strides_of(shape)
    checks, base, sizes, strides = [], [], [], []
    dim, dyn = 0, iter(dynamic)
    for item in op.attrs["key"]:
        kind = item[0]
        if kind == "slice" and isinstance(shape[dim], str):
            if not takes_whole(item):   # type inference admits no other
                raise SymbolicSizeError(syms[dim], "a slice of part of a dim")
            sizes.append(shape[dim])
            strides.append(st[dim])
            dim += 1
        elif kind == "slice":
            start, stop, step = slice(*item[1:]).indices(shape[dim])
            sizes.append(len(range(start, stop, step)))
            strides.append(product(step, st[dim]))
            base.append(str(product(start, st[dim])))
            dim += 1
        elif kind == "int" and not isinstance(shape[dim], str):
            base.append(str(product(item[1] % shape[dim], st[dim])))
            dim += 1
        elif kind in ("dyn", "int"):
            index = f"(int64_t){ctx.ptr(next(dyn))}[0]" if kind == "dyn" else str(item[1])
            name = ctx.fresh("k_dyn")
            checks.append(f"const int64_t {name} = ck_wrap({index}, {shape[dim]});")
            message = f"index out of range for dimension {dim} of size {str(syms[dim])}"
            checks.append(f"if ({name} < 0) {ctx.fail(message)}")
            base.append(f"{name} * {st[dim]}")
            dim += 1
        elif kind == "lanes":
            base.append(product("k_l", st[dim]))
            dim += 1
        elif kind == "lane":
            index, bad = f"ck_wrap((int64_t){ctx.ptr(next(dyn))}[k_l], {shape[dim]})", ctx.fresh("k_bad")
            checks.append(f"int {bad} = 0; for (int64_t k_l = 0; k_l < {shape[0]}; ++k_l) {bad} |= {index} < 0;")
            checks.append(f"if ({bad}) {ctx.fail(f'index out of range for dimension {dim} of size {syms[dim]}')}")
            base.append(f"{index} * {st[dim]}")
            dim += 1
        elif kind == "new":
            sizes.append(1)
            strides.append(0)
        else:
            raise ValueError(f"bad index item {item!r}")
    sizes += shape[dim:]
    strides += st[dim:]
    return checks, " + ".join(base) if base else "0", sizes, strides


def _render_select_lanes(op: Operation, ctx: KernelContext) -> str:
    """Each lane's own region of its own tensor: a split over the lanes."""
    x, out = op.operands[0], op.results[0]
    checks, base, sizes, strides = _view(op, x, op.operands[1:], ctx)
    lanes, region = c_shape(ctx, x.type.shape)[0], numel(sizes)
    if product(lanes, region) == 0:
        return ""
    read = convert(f"k_x[k_b + {offset_expr('k_r', sizes, strides)}]", x.type.dtype, out.type.dtype)
    return block(*checks, f"const {ctype(x.type.dtype)}* k_x = {ctx.ptr(x)};",
                 f"{ctype(out.type.dtype)}* k_y = {ctx.ptr(out)};",
                 split(ctx, lanes, 1),
                 "for (int64_t k_l = k_lo; k_l < k_hi; ++k_l) {",
                 f"const int64_t k_b = {base};",
                 f"for (int64_t k_r = 0; k_r < {region}; ++k_r) k_y[k_l * {region} + k_r] = {read};",
                 "}")


def _render_update_lanes(op: Operation, ctx: KernelContext) -> str:
    """y = x with each lane's own region written: every worker copies its block of x, then
    writes the elements of every lane's region that fall in that block (no barrier between)."""
    x, v = op.operands[:2]
    out = op.results[0]
    n = numel(c_shape(ctx, out.type.shape))
    checks, base, sizes, strides = _view(op, x, op.operands[2:], ctx)
    lanes, region = c_shape(ctx, x.type.shape)[0], numel(sizes)
    if n == 0 or region == 0:
        return ""
    T = ctype(out.type.dtype)
    v_strides = broadcast_strides(c_shape(ctx, v.type.shape), [lanes, *sizes])
    read = convert(f"k_v[{offset_expr(f'(k_l * {region} + k_r)', [lanes, *sizes], v_strides)}]",
                   v.type.dtype, out.type.dtype)
    return block(*checks, f"{T}* k_y = {ctx.ptr(out)}; const {T}* k_x = {ctx.ptr(x)};",
                 f"const {ctype(v.type.dtype)}* k_v = {ctx.ptr(v)};",
                 split(ctx, n, grain(out.type.dtype)),
                 f"if (k_hi > k_lo && k_y != k_x) memcpy(k_y + k_lo, k_x + k_lo, (size_t)(k_hi - k_lo) * sizeof({T}));",
                 f"for (int64_t k_l = 0; k_l < {lanes}; ++k_l) {{",
                 f"const int64_t k_b = {base};",
                 f"for (int64_t k_r = 0; k_r < {region}; ++k_r) {{",
                 f"const int64_t k_s = k_b + {offset_expr('k_r', sizes, strides)};",
                 f"if (k_s >= k_lo && k_s < k_hi) k_y[k_s] = {read};",
                 "}", "}")


def _over_lanes(op: Operation) -> bool:
    key = op.attrs["key"]
    return bool(key) and key[0][0] == "lanes"


def render_select(op: Operation, ctx: KernelContext) -> str:
    if _over_lanes(op):
        return _render_select_lanes(op, ctx)
    x, out = op.operands[0], op.results[0]
    checks, base, sizes, strides = _view(op, x, op.operands[1:], ctx)
    assert str(numel(sizes)) == str(numel(c_shape(ctx, out.type.shape))), (sizes, out.type.shape)
    return block(*checks, strided_copy(ctx, out, ctx.ptr(x), x.type.dtype, base, sizes, strides))


def render_update(op: Operation, ctx: KernelContext) -> str:
    if _over_lanes(op):
        return _render_update_lanes(op, ctx)
    x, v = op.operands[:2]
    out = op.results[0]
    n = numel(c_shape(ctx, out.type.shape))
    if n == 0:
        return ""
    checks, base, sizes, strides = _view(op, x, op.operands[2:], ctx)
    if v.type.syms or any(isinstance(d, str) for d in (*sizes, *strides)):   # the region written: numbers only
        raise SymbolicSizeError(v.type.syms or x.type.syms, "an update of a region of a symbolic size or stride")
    T = ctype(out.type.dtype)
    lines = [*checks, f"{T}* k_y = {ctx.ptr(out)}; const {T}* k_x = {ctx.ptr(x)};",
             f"const {ctype(v.type.dtype)}* k_v = {ctx.ptr(v)};",
             split(ctx, n, grain(out.type.dtype)),
             f"if (k_hi > k_lo && k_y != k_x) memcpy(k_y + k_lo, k_x + k_lo, (size_t)(k_hi - k_lo) * sizeof({T}));"]
    if numel(sizes):
        rs, (ost, vst) = collapse(sizes, [strides, broadcast_strides(v.type.shape, sizes)])
        L, so, sv = rs[-1], ost[-1] or 1, vst[-1]
        outer = rs[:-1]
        assert so > 0
        lines += [f"const int64_t k_base = {base};",
                  f"for (int64_t k_r = 0; k_r < {numel(outer)}; ++k_r) {{",
                  f"const int64_t k_s = k_base + {offset_expr('k_r', outer, ost[:-1])};",
                  f"if (k_s >= k_hi || k_s + {(L - 1) * so} < k_lo) continue;",
                  f"const int64_t k_j0 = k_s >= k_lo ? 0 : (k_lo - k_s + {so - 1}) / {so};",
                  f"const int64_t k_j1 = CK_MIN({L}, (k_hi - k_s + {so - 1}) / {so});",
                  f"const {ctype(v.type.dtype)}* k_pv = k_v + {offset_expr('k_r', outer, vst[:-1])};",
                  ctx.simd(),
                  f"for (int64_t k_j = k_j0; k_j < k_j1; ++k_j) k_y[k_s + k_j * {so}] = "
                  f"{convert(f'k_pv[k_j * {sv}]', v.type.dtype, out.type.dtype)};",
                  "}"]
    return block(*lines)


# -- GATHER ---------------------------------------------------------------------------------

def render_gather(op: Operation, ctx: KernelContext) -> str:
    x, idx = op.operands
    out = op.results[0]
    d = op.attrs["dim"]
    shape = c_shape(ctx, x.type.shape)
    P, D, Q, NI = numel(shape[:d]), shape[d], numel(shape[d + 1:]), numel(c_shape(ctx, idx.type.shape))
    if product(P, NI, Q) == 0:
        return ""
    T, I = ctype(out.type.dtype), ctype(idx.type.dtype)
    return block(f"const {T}* k_x = {ctx.ptr(x)}; const {I}* k_ix = {ctx.ptr(idx)}; {T}* k_y = {ctx.ptr(out)};",
                 "int k_bad = 0;",   # every worker checks every index, so all agree
                 f"for (int64_t k_i = 0; k_i < {NI}; ++k_i) k_bad |= ck_wrap((int64_t)k_ix[k_i], {D}) < 0;",
                 f"if (k_bad) {ctx.fail(f'index out of range for dimension {d} of size {D}')}",
                 split(ctx, product(P, NI), 1),
                 "for (int64_t k_t = k_lo; k_t < k_hi; ++k_t) {",
                 f"const int64_t k_p = k_t / {NI}, k_i = k_t - k_p * {NI};",
                 f"const int64_t k_s = (k_p * {D} + ck_wrap((int64_t)k_ix[k_i], {D})) * {Q};",
                 f"memcpy(k_y + k_t * {Q}, k_x + k_s, {Q} * sizeof({T}));" if Q != 1 else "k_y[k_t] = k_x[k_s];",
                 "}")


# -- SCATTER --------------------------------------------------------------------------------

def render_scatter(op: Operation, ctx: KernelContext) -> str:
    """y = x with y[p, idx[i], q] = v[p, i, q]. Every worker copies its own block of x and then
    writes the parts of the indexed rows that fall in that block (it walks all of them: there
    are as many as the index has entries), so no barrier is needed between the steps; a
    repeated index keeps its last row."""
    x, idx, v = op.operands
    out = op.results[0]
    d = op.attrs["dim"]
    shape = c_shape(ctx, x.type.shape)
    P, D, Q, NI = numel(shape[:d]), shape[d], numel(shape[d + 1:]), numel(c_shape(ctx, idx.type.shape))
    n = numel(shape)
    if n == 0:
        return ""
    T, I = ctype(out.type.dtype), ctype(idx.type.dtype)
    return block(f"{T}* k_y = {ctx.ptr(out)}; const {T}* k_x = {ctx.ptr(x)}; const {T}* k_v = {ctx.ptr(v)};",
                 f"const {I}* k_ix = {ctx.ptr(idx)};",
                 "int k_bad = 0;",   # every worker checks every index, so all agree
                 f"for (int64_t k_i = 0; k_i < {NI}; ++k_i) k_bad |= ck_wrap((int64_t)k_ix[k_i], {D}) < 0;",
                 f"if (k_bad) {ctx.fail(f'index out of range for dimension {d} of size {D}')}",
                 split(ctx, n, grain(out.type.dtype)),
                 f"if (k_hi > k_lo && k_y != k_x) memcpy(k_y + k_lo, k_x + k_lo, (size_t)(k_hi - k_lo) * sizeof({T}));",
                 f"for (int64_t k_t = 0; k_t < {product(P, NI)}; ++k_t) {{",
                 f"const int64_t k_p = k_t / {NI}, k_i = k_t - k_p * {NI};",
                 f"const int64_t k_s = (k_p * {D} + ck_wrap((int64_t)k_ix[k_i], {D})) * {Q};",
                 f"const int64_t k_a = CK_MAX(k_s, k_lo), k_b = CK_MIN(k_s + {Q}, k_hi);",
                 f"if (k_b > k_a) memcpy(k_y + k_a, k_v + k_t * {Q} + (k_a - k_s), (size_t)(k_b - k_a) * sizeof({T}));",
                 "}")
