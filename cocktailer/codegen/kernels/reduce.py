"""Reductions (SUM MEAN PROD AMAX AMIN ANY ALL over dims, ARGMAX/ARGMIN over one dim or all)
and SOFTMAX/LOG_SOFTMAX.

The input's dims are grouped into runs of kept and reduced dims (size-1 dims dropped). When
the innermost run is reduced, each output element reduces contiguous rows with a
vector-loop reduction ("row" pattern); when it is kept, a chunk of up to 64
neighbouring outputs is accumulated as a vector over the reduced indices ("column" pattern).
Workers split the outputs. NaN propagates through AMAX/AMIN (and ARGMAX/ARGMIN pick the
first NaN) as in torch.
"""
from __future__ import annotations

import torch

from cocktailer.codegen.kernels.common import (block, c_shape, ceil_div, convert, grain, is_float, lit, numel, product,
                                               split, strides_of)
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.ir import Op, Operation

CHUNK = 64   # outputs accumulated together in the column pattern
# A block of lanes (KernelContext.cooperative) splits each output of a row reduction over its
# lanes where there are fewer outputs than this and each reduces at least COOPERATIVE_LENGTH
# elements: a sum of a long vector, a vocabulary's argmax (one lane would do it alone)
COOPERATIVE_OUTPUTS, COOPERATIVE_LENGTH = 64, 256


def _cooperative(ctx: KernelContext, n_out, length) -> bool:
    return (ctx.cooperative and isinstance(n_out, int) and isinstance(length, int)
            and n_out < COOPERATIVE_OUTPUTS and length >= COOPERATIVE_LENGTH)


def _block_outputs(n_out, scratch: str, lane: list[str], publish: str, combine: list[str]) -> list[str]:
    """The protocol of a reduction the block's lanes share, around each of the block's outputs
    k_i (the kernel was given its lane's share, w*CT_LANES + CT_LANE: the block's is w / CT_LANES):
    every lane computes its part (`lane`) and publishes it to the block's scratch (`publish`);
    after a block barrier lane 0 combines the parts (`combine`); a second barrier frees the
    scratch for the next output."""
    return [f"int64_t k_lo, k_hi; ck_range({n_out}, 1, w / CT_LANES, W / CT_LANES, &k_lo, &k_hi);",
            scratch,
            "for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) {",
            *lane,
            publish,
            "CT_BLOCK_BARRIER();",
            "if (CT_LANE == 0) {",
            *combine,
            "}",
            "CT_BLOCK_BARRIER();   /* the scratch is the next output's */",
            "}"]


def _groups(shape, reduced: set[int]) -> list[tuple[int, bool, int]]:
    """(size, is_reduced, stride) runs of a contiguous tensor's dims."""
    st = strides_of(shape)
    out: list[list] = []
    for d, size in enumerate(shape):
        if size == 1:
            continue
        r = d in reduced
        if out and out[-1][1] == r:
            out[-1][0] = product(out[-1][0], size)
            out[-1][2] = st[d]
        else:
            out.append([size, r, st[d]])
    return [tuple(g) for g in out]


def _reduced_dims(op: Operation) -> set[int]:
    rank = len(op.operands[0].type.shape)
    dims = op.attrs.get("dims", op.attrs.get("dim"))
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return set(range(rank))
    if isinstance(dims, int):
        dims = (dims,)
    return {d % max(rank, 1) for d in dims} & set(range(rank))


def _offset(index: str, groups: list[tuple[int, bool, int]]) -> str:
    """Input offset of flat index `index` over the given (size, _, stride) groups."""
    terms, after = [], 1
    for i in range(len(groups) - 1, -1, -1):
        size, _, stride = groups[i]
        idx = index if after == 1 else f"({index} / {after})"
        if i > 0:
            idx = f"({idx} % {size})"
        terms.append(f"{idx} * {stride}")
        after = product(after, size)
    return " + ".join(reversed(terms)) if terms else "0"


def _nested(groups: list[tuple[int, bool, int]], body: list[str], off: str) -> list[str]:
    """Loops over the given groups; inside them `k_o<depth>` holds `off` plus their offset."""
    lines, cur = [], off
    for i, (size, _, stride) in enumerate(groups):
        lines.append(f"for (int64_t k_t{i} = 0; k_t{i} < {size}; ++k_t{i}) {{")
        lines.append(f"const int64_t k_o{i} = {cur} + k_t{i} * {stride};")
        cur = f"k_o{i}"
    lines.append(f"const int64_t k_off = {cur};")
    return lines + body + ["}"] * len(groups)


# -- SUM MEAN PROD AMAX AMIN ANY ALL -----------------------------------------------------------

def _spec(kind: Op, src: torch.dtype, dst: torch.dtype):
    """(accumulator C type, init, update(acc, v) statement, reduction operator, NaN tracking)
    where v is the element converted to the accumulator's type."""
    if kind in (Op.SUM, Op.MEAN, Op.PROD):
        acc_t = ctype(dst) if is_float(dst) else "uint64_t"
        o = "+" if kind is not Op.PROD else "*"
        init = "0" if kind is not Op.PROD else "1"
        return acc_t, init, f"{{a}} {o}= {{v}};", o, None
    if kind in (Op.ANY, Op.ALL):
        o = "|" if kind is Op.ANY else "&"
        return "uint8_t", "0" if kind is Op.ANY else "1", f"{{a}} {o}= (uint8_t)({{v}});", o, None
    # AMAX / AMIN: NaN is tracked apart so the comparison vectorizes as a plain max/min
    cmp = ">" if kind is Op.AMAX else "<"
    mm = "max" if kind is Op.AMAX else "min"
    if is_float(src):
        inf = "INFINITY" if src is torch.float32 else "((double)INFINITY)"
        init = f"-{inf}" if kind is Op.AMAX else inf
        return ctype(src), init, f"{{a}} = {{v}} {cmp} {{a}} ? {{v}} : {{a}};", mm, "nan"
    info = torch.iinfo(src) if src is not torch.bool else None
    lo, hi = (0, 1) if info is None else (info.min, info.max)
    init = lit(lo if kind is Op.AMAX else hi, src if src is not torch.bool else torch.uint8)
    return ctype(src), init, f"{{a}} = {{v}} {cmp} {{a}} ? {{v}} : {{a}};", mm, None


def _element(kind: Op, v: str, src: torch.dtype, acc_t: str, dst: torch.dtype) -> str:
    if kind in (Op.ANY, Op.ALL):
        return f"({v} != 0)"
    if kind in (Op.AMAX, Op.AMIN):
        return v
    if acc_t == "uint64_t":
        return f"(uint64_t)(int64_t)({v})"
    return convert(v, src, dst)


def _finish(kind: Op, acc: str, count: int, dst: torch.dtype, nan: str | None) -> str:
    if kind is Op.MEAN:
        return f"{acc} / ({ctype(dst)}){count}"
    if nan:
        return f"({nan} ? {lit(float('nan'), dst)} : {acc})"
    return f"({ctype(dst)}){acc}"


def render_reduce(op: Operation, ctx: KernelContext) -> str:
    x, out = op.operands[0], op.results[0]
    src, dst, kind = x.type.dtype, out.type.dtype, op.op
    shape = c_shape(ctx, x.type.shape)
    n_out = numel(c_shape(ctx, out.type.shape))
    if n_out == 0:
        return ""
    acc_t, init, update, clause, nan = _spec(kind, src, dst)
    groups = _groups(shape, _reduced_dims(op)) or [(1, False, 1)]
    count = numel([g[0] for g in groups if g[1]]) if numel(shape) != 0 else 0
    head = [f"const {ctype(src)}* k_x = {ctx.ptr(x)};", f"{ctype(dst)}* k_y = {ctx.ptr(out)};"]
    if count == 0 or numel(shape) == 0:   # empty reduction: the identity (MEAN: nan)
        value = lit(float("nan"), dst) if kind is Op.MEAN else f"({ctype(dst)}){init}"
        return block(*head, split(ctx, n_out, grain(dst)),
                     f"for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) k_y[k_i] = {value};")
    kept = [g for g in groups if not g[1]]
    v = _element(kind, "k_p[k_j]", src, acc_t, dst)
    if groups and groups[-1][1]:   # row pattern
        inner = groups[-1][0]
        outer_red = [g for g in groups[:-1] if g[1]]
        nan_decl = "int k_nan = 0;" if nan else ""
        nan_upd = " k_nan |= k_p[k_j] != k_p[k_j];" if nan else ""
        nan_reduction = ("|:k_nan",) if nan else ()
        body = [f"const {ctype(src)}* k_p = k_x + k_off;",
                ctx.simd(f"{clause}:k_acc", *nan_reduction),
                f"for (int64_t k_j = 0; k_j < {inner}; ++k_j) {{ {update.format(a='k_acc', v=v)}{nan_upd} }}"]
        finish = _finish(kind, 'k_acc', count, dst, 'k_nan' if nan else None)
        if _cooperative(ctx, n_out, count):
            return block(*head, *_cooperative_rows(src, n_out, inner, outer_red, kept, acc_t, init, update, v, nan, finish))
        lines = [*head, split(ctx, n_out, grain(dst)),
                 "for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) {",
                 f"{acc_t} k_acc = {init}; {nan_decl}",
                 *_nested(outer_red, body, _offset("k_i", kept)),
                 f"k_y[k_i] = {finish};",
                 "}"]
        return block(*lines)
    # column pattern: the innermost run is kept
    inner = groups[-1][0]
    ch, nch = _chunks(inner)
    outer_kept = kept[:-1]
    reds = [g for g in groups if g[1]]
    n_tasks = product(numel([g[0] for g in outer_kept]), nch)
    nan_decl = f"uint8_t k_nan[{ch}] = {{0}};" if nan else ""
    nan_upd = " k_nan[k_j] |= k_p[k_j] != k_p[k_j];" if nan else ""
    body = [f"const {ctype(src)}* k_p = k_x + k_off + k_j0;",
            ctx.simd(),
            f"for (int64_t k_j = 0; k_j < k_n; ++k_j) {{ {update.format(a='k_acc[k_j]', v=v)}{nan_upd} }}"]
    fin = _finish(kind, "k_acc[k_j]", count, dst, "k_nan[k_j]" if nan else None)
    lines = [*head, split(ctx, n_tasks, 1),
             "for (int64_t k_task = k_lo; k_task < k_hi; ++k_task) {",
             f"const int64_t k_r = k_task / {nch}, k_j0 = (k_task - k_r * {nch}) * {ch};",
             f"const int64_t k_n = CK_MIN({ch}, {inner} - k_j0);",
             f"{acc_t} k_acc[{ch}]; {nan_decl}",
             f"for (int64_t k_j = 0; k_j < {ch}; ++k_j) k_acc[k_j] = {init};",
             *_nested(reds, body, _offset("k_r", outer_kept)),
             f"{ctype(dst)}* k_q = k_y + k_r * {inner} + k_j0;",
             f"for (int64_t k_j = 0; k_j < k_n; ++k_j) k_q[k_j] = {fin};",
             "}"]
    return block(*lines)


def _cooperative_rows(src, n_out, inner, outer_red, kept, acc_t, init, update, v, nan, finish) -> list[str]:
    """Each output reduced by the block's lanes: lane l takes elements l, l + lanes, ... of each
    row (neighbouring lanes, neighbouring elements), its partial result goes to the block's
    scratch, and after a block barrier lane 0 combines them in lane order."""
    nan_upd = " k_nan |= k_p[k_j] != k_p[k_j];" if nan else ""
    body = [f"const {ctype(src)}* k_p = k_x + k_off;",
            f"for (int64_t k_j = CT_LANE; k_j < {inner}; k_j += CT_LANES) {{ {update.format(a='k_acc', v=v)}{nan_upd} }}"]
    combine = update.format(a="k_acc", v="k_part[k_l]") + (" k_nan |= k_nans[k_l];" if nan else "")
    return _block_outputs(
        n_out, f"{acc_t}* k_part = ({acc_t}*)CT_BLOCK_SCRATCH; uint8_t* k_nans = (uint8_t*)(CT_BLOCK_SCRATCH + 8 * CT_LANES);",
        [f"{acc_t} k_acc = {init}; uint8_t k_nan = 0;", *_nested(outer_red, body, _offset("k_i", kept))],
        "k_part[CT_LANE] = k_acc; k_nans[CT_LANE] = k_nan;",
        [f"for (int k_l = 1; k_l < CT_LANES; ++k_l) {{ {combine} }}", f"k_y[k_i] = {finish};"])


# -- ARGMAX / ARGMIN ---------------------------------------------------------------------------

def _chunks(inner) -> tuple[int, "int | str"]:
    """Columns per chunk (a number: the accumulators' array) and the number of chunks."""
    ch = CHUNK if isinstance(inner, str) else min(inner, CHUNK)
    return ch, ceil_div(inner, ch)


def _outer_d_inner(shape, dim: int | None) -> tuple:
    if dim is None:
        return 1, numel(shape), 1
    dim %= max(len(shape), 1)
    if not shape:
        return 1, 1, 1
    return numel(shape[:dim]), shape[dim], numel(shape[dim + 1:])


def render_argreduce(op: Operation, ctx: KernelContext) -> str:
    """First index of the max (min); a NaN counts as larger (smaller) than everything."""
    x, out = op.operands[0], op.results[0]
    src = x.type.dtype
    outer, d, inner = _outer_d_inner(c_shape(ctx, x.type.shape), op.attrs.get("dim"))
    n_out = product(outer, inner)
    if n_out == 0:
        return ""
    cmp = ">" if op.op is Op.ARGMAX else "<"
    better = f"(k_v {cmp} k_b || (k_v != k_v && k_b == k_b))" if is_float(src) else f"(k_v {cmp} k_b)"
    head = [f"const {ctype(src)}* k_x = {ctx.ptr(x)};", f"int64_t* k_y = {ctx.ptr(out)};"]
    if _cooperative(ctx, n_out, d):
        tie = "(k_v == k_b || (k_v != k_v && k_b != k_b))" if is_float(src) else "(k_v == k_b)"
        return block(*head, *_cooperative_arg(ctype(src), n_out, d, inner, better, tie))
    return block(*head, split(ctx, n_out, grain(torch.int64)),
                 "for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) {",
                 f"const int64_t k_r = k_i / {inner}, k_c = k_i - k_r * {inner};",
                 f"const {ctype(src)}* k_p = k_x + k_r * {product(d, inner)} + k_c;",
                 f"{ctype(src)} k_b = k_p[0]; int64_t k_at = 0;",
                 f"for (int64_t k_j = 1; k_j < {d}; ++k_j) {{",
                 f"const {ctype(src)} k_v = k_p[k_j * {inner}];",
                 f"if {better} {{ k_b = k_v; k_at = k_j; }}",
                 "}",
                 "k_y[k_i] = k_at;",
                 "}")


# -- SOFTMAX / LOG_SOFTMAX -----------------------------------------------------------------------

def render_softmax(op: Operation, ctx: KernelContext) -> str:
    """exp(x - max) / sum (LOG: x - max - log(sum)); one row (or chunk of columns) per task."""
    x, out = op.operands[0], op.results[0]
    dt = out.type.dtype
    outer, d, inner = _outer_d_inner(c_shape(ctx, x.type.shape), op.attrs["dim"])
    if product(outer, d, inner) == 0:
        return ""
    f32 = dt is torch.float32
    T = ctype(dt)
    exp, log = ("ck_expf", "logf") if f32 else ("exp", "log")
    one, ninf = ("1.0f", "-INFINITY") if f32 else ("1.0", "-(double)INFINITY")
    log_sm = op.op is Op.LOG_SOFTMAX
    head = [f"const {T}* k_x = {ctx.ptr(x)};", f"{T}* k_y = {ctx.ptr(out)};"]
    if inner == 1:
        rows = _rows_one_by_one(T, outer, d, exp, log, one, ninf, log_sm, ctx)
        if not ctx.engine or (isinstance(d, int) and d >= SHORT_ROW):
            return block(*head, *rows)
        short = _short_rows(T, outer, d, exp, log, one, ninf, log_sm, ctx)
        if isinstance(d, int):
            return block(*head, *short)
        return block(*head, f"if ({d} < {SHORT_ROW}) {{", *short, "} else {", *rows, "}")
    ch, nch = _chunks(inner)
    loop_d = f"for (int64_t k_t = 0; k_t < {d}; ++k_t)"
    at = f"k_t * {inner} + k_j"
    if log_sm:
        last = [f"for (int64_t k_j = 0; k_j < k_n; ++k_j) k_s[k_j] = k_m[k_j] + {log}(k_s[k_j]);",
                loop_d + " {", ctx.simd(), f"for (int64_t k_j = 0; k_j < k_n; ++k_j) k_q[{at}] = k_p[{at}] - k_s[k_j];", "}"]
        store = ""
    else:
        last = [f"for (int64_t k_j = 0; k_j < k_n; ++k_j) k_s[k_j] = {one} / k_s[k_j];",
                loop_d + " {", ctx.simd(), f"for (int64_t k_j = 0; k_j < k_n; ++k_j) k_q[{at}] *= k_s[k_j];", "}"]
        store = f"k_q[{at}] = k_e; "
    return block(*head, split(ctx, product(outer, nch), 1),
                 "for (int64_t k_task = k_lo; k_task < k_hi; ++k_task) {",
                 f"const int64_t k_r = k_task / {nch}, k_j0 = (k_task - k_r * {nch}) * {ch};",
                 f"const int64_t k_n = CK_MIN({ch}, {inner} - k_j0);",
                 f"const {T}* k_p = k_x + k_r * {product(d, inner)} + k_j0;",
                 f"{T}* k_q = k_y + k_r * {product(d, inner)} + k_j0;",
                 f"{T} k_m[{ch}], k_s[{ch}];",
                 f"for (int64_t k_j = 0; k_j < {ch}; ++k_j) {{ k_m[k_j] = {ninf}; k_s[k_j] = 0; }}",
                 loop_d + " {", ctx.simd(),
                 f"for (int64_t k_j = 0; k_j < k_n; ++k_j) k_m[k_j] = k_p[{at}] > k_m[k_j] ? k_p[{at}] : k_m[k_j];", "}",
                 loop_d + " {", ctx.simd(),
                 f"for (int64_t k_j = 0; k_j < k_n; ++k_j) {{ const {T} k_e = {exp}(k_p[{at}] - k_m[k_j]); {store}k_s[k_j] += k_e; }}",
                 "}",
                 *last, "}")


# Rows shorter than this take `_short_rows` on a CPU. Measured (one worker, a [4, n, n] softmax
# over the last dim, on an AVX-512 Xeon): a row at a time cost about 75 ns a row whatever n from
# 8 to 50 (n = 21: 6.3 us), most of it in each row's loop set-up and in the exps of its
# remainder past the last whole vector, computed one float at a time.
SHORT_ROW = 64
_SHORT_CHUNK = 4096   # elements of a chunk of short rows (their maxima: 16 KiB of floats on the stack)


def _short_rows(T, outer, d, exp, log, one, ninf, log_sm, ctx) -> list[str]:
    """Rows of d < SHORT_ROW a chunk at a time: each row's max spread over its elements, the
    exps of the whole chunk in one loop (no row's remainder on its own), then each row's sum
    and scaling. Each exp is the one a row at a time computes."""
    row = f"const {T}* k_pr = k_p + k_r * {d}; {T}* k_qr = k_q + k_r * {d};"
    return [split(ctx, outer, 1),
            f"{T} k_v[{_SHORT_CHUNK}];   /* each element's row max */",
            *([f"{T} k_exps[{_SHORT_CHUNK}];"] if log_sm else []),
            f"const int64_t k_rc = {_SHORT_CHUNK} / {d};",
            "for (int64_t k_r0 = k_lo; k_r0 < k_hi; k_r0 += k_rc) {",
            "const int64_t k_nr = CK_MIN(k_rc, k_hi - k_r0);",
            f"const {T}* k_p = k_x + k_r0 * {d}; {T}* k_q = k_y + k_r0 * {d};",
            f"{T}* k_e = {'k_exps' if log_sm else 'k_q'};   /* the exps (a softmax's: its output, scaled after) */",
            "for (int64_t k_r = 0; k_r < k_nr; ++k_r) {",
            f"const {T}* k_pr = k_p + k_r * {d};",
            f"{T} k_m = {ninf};", ctx.simd("max:k_m"),
            f"for (int64_t k_j = 0; k_j < {d}; ++k_j) k_m = k_pr[k_j] > k_m ? k_pr[k_j] : k_m;",
            ctx.simd(), f"for (int64_t k_j = 0; k_j < {d}; ++k_j) k_v[k_r * {d} + k_j] = k_m;",
            "}",
            ctx.simd(), f"for (int64_t k_i = 0; k_i < k_nr * {d}; ++k_i) k_e[k_i] = {exp}(k_p[k_i] - k_v[k_i]);",
            "for (int64_t k_r = 0; k_r < k_nr; ++k_r) {",
            row, f"const {T}* k_er = k_e + k_r * {d};",
            *([f"const {T} k_m = k_v[k_r * {d}];"] if log_sm else []),
            f"{T} k_s = 0;", ctx.simd("+:k_s"),
            f"for (int64_t k_j = 0; k_j < {d}; ++k_j) k_s += k_er[k_j];",
            *_normalized(T, d, log, one, log_sm, ctx, "k_pr", "k_qr"), "}", "}"]


def _rows_one_by_one(T, outer, d, exp, log, one, ninf, log_sm, ctx) -> list[str]:
    """One row at a time: its max, its exps and their sum, its scaling."""
    store = "" if log_sm else "k_q[k_j] = k_e; "
    return [split(ctx, outer, 1),
            "for (int64_t k_r = k_lo; k_r < k_hi; ++k_r) {",
            f"const {T}* k_p = k_x + k_r * {d}; {T}* k_q = k_y + k_r * {d};",
            f"{T} k_m = {ninf}, k_s = 0;",
            ctx.simd("max:k_m"),
            f"for (int64_t k_j = 0; k_j < {d}; ++k_j) k_m = k_p[k_j] > k_m ? k_p[k_j] : k_m;",
            ctx.simd("+:k_s"),
            f"for (int64_t k_j = 0; k_j < {d}; ++k_j) {{ const {T} k_e = {exp}(k_p[k_j] - k_m); {store}k_s += k_e; }}",
            *_normalized(T, d, log, one, log_sm, ctx, "k_p", "k_q"), "}"]


def _normalized(T, d, log, one, log_sm, ctx, p: str, q: str) -> list[str]:
    """A row's results from its max k_m and its exps' sum k_s: `p` the row's inputs, `q` its
    outputs (a softmax's hold its exps already, scaled here)."""
    if log_sm:
        return [f"const {T} k_ls = {log}(k_s);", ctx.simd(),
                f"for (int64_t k_j = 0; k_j < {d}; ++k_j) {q}[k_j] = {p}[k_j] - k_m - k_ls;"]
    return [f"const {T} k_inv = {one} / k_s;", ctx.simd(), f"for (int64_t k_j = 0; k_j < {d}; ++k_j) {q}[k_j] *= k_inv;"]


def _cooperative_arg(T: str, n_out, d, inner, better: str, tie: str) -> list[str]:
    """The block's lanes share each output: lane l keeps the first best of elements l, l + lanes,
    ...; lane 0 then takes, in lane order, a lane's that is better, or as good at a smaller index."""
    return _block_outputs(
        n_out, f"{T}* k_vals = ({T}*)CT_BLOCK_SCRATCH; int64_t* k_ats = (int64_t*)(CT_BLOCK_SCRATCH + 8 * CT_LANES);",
        [f"const int64_t k_r = k_i / {inner}, k_c = k_i - k_r * {inner};",
         f"const {T}* k_p = k_x + k_r * {product(d, inner)} + k_c;",
         f"{T} k_b = k_p[0]; int64_t k_at = -1;",
         f"for (int64_t k_j = CT_LANE; k_j < {d}; k_j += CT_LANES) {{",
         f"const {T} k_v = k_p[k_j * {inner}];",
         f"if (k_at < 0 || {better}) {{ k_b = k_v; k_at = k_j; }}",
         "}"],
        "k_vals[CT_LANE] = k_b; k_ats[CT_LANE] = k_at;",
        ["for (int k_l = 1; k_l < CT_LANES; ++k_l) {",
         f"const {T} k_v = k_vals[k_l]; const int64_t k_j = k_ats[k_l];",
         f"if (k_j >= 0 && ({better} || ({tie} && k_j < k_at))) {{ k_b = k_v; k_at = k_j; }}",
         "}",
         "k_y[k_i] = k_at;"])
