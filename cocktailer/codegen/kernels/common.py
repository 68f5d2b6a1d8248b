"""Helpers the kernel renderers share: C literals, shapes and strides, work splitting, and the
broadcast loop nest every elementwise-like op (unary, binary, where, expand, cast) renders to.

Conventions of the generated code: a kernel is one `{ ... }` block; its locals start with `k_`
(the core's names are `w`, `W`, `in`, `cst`, `err`, `ct_*`, ...); shapes and strides are
literals so GCC specializes every loop.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.ir import Value

FLOATS = (torch.float32, torch.float64)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
SUPPORTED_DTYPES = FLOATS + INTS + (torch.bool,)


def is_float(dtype: torch.dtype) -> bool:
    return dtype in FLOATS


def numel(shape: Sequence) -> "int | str":
    """The element count of a shape of numbers and C expressions (see `c_shape`)."""
    return product(*shape)


def c_shape(ctx: KernelContext, shape: Sequence) -> tuple:
    """A type's shape for the generated code: numbers, and the C expression of each symbolic
    size (read at call time). The shape helpers below take such shapes; an expression is never
    1 (sizes 0 and 1 are compiled apart), so broadcasting reads the same either way."""
    return tuple(ctx.size(d) if not isinstance(d, int) else d for d in shape)


def product(*factors) -> "int | str":
    """The product of numbers and C expressions (run-time sizes): a number where all are."""
    number, exprs = 1, []
    for f in factors:
        if isinstance(f, str):
            exprs.append(f)
        else:
            number *= f
    if not exprs or number == 0:
        return number
    return "(" + " * ".join(([str(number)] if number != 1 else []) + exprs) + ")"


def total(*terms) -> "int | str":
    """The sum of numbers and C expressions: a number where all are."""
    number, exprs = sum(t for t in terms if not isinstance(t, str)), [t for t in terms if isinstance(t, str)]
    if not exprs:
        return number
    return "(" + " + ".join(exprs + ([str(number)] if number else [])) + ")"


def ceil_div(n: "int | str", d: int) -> "int | str":
    return -(-n // d) if isinstance(n, int) else f"(({n} + {d - 1}) / {d})"


def hint(sizes: Sequence) -> int:
    """The product of sizes, each symbolic one at the value it had at capture: a number to
    choose code paths by (a choice of speed only: the code is right for every size)."""
    return math.prod(getattr(d, "hint", d) for d in sizes)


def strides_of(shape: Sequence[int]) -> list[int]:
    """Row-major (contiguous) strides (C expressions where sizes are). The outermost dim may
    even be a Sym: no stride counts it."""
    out, s = [], 1
    for k, d in enumerate(reversed(shape)):
        out.append(s)
        if k + 1 < len(shape):
            s = product(s, d)
    return out[::-1]


def lit(value, dtype: torch.dtype) -> str:
    """A C literal of `value` as torch would store it in a tensor of `dtype`."""
    value = torch.tensor(value).to(dtype).item() if not isinstance(value, torch.Tensor) else value.to(dtype).item()
    if dtype is torch.bool:
        return "1" if value else "0"
    if is_float(dtype):
        v = float(value)
        if math.isnan(v):
            return "NAN" if dtype is torch.float32 else "((double)NAN)"
        if math.isinf(v):
            s = "INFINITY" if dtype is torch.float32 else "((double)INFINITY)"
            return s if v > 0 else f"(-{s})"
        return repr(v) + ("f" if dtype is torch.float32 else "")
    v = int(value)
    if v == -(2 ** 63):
        return "(-INT64_C(9223372036854775807) - 1)"
    return f"(({ctype(dtype)})INT64_C({v}))"


def grain(dtype: torch.dtype) -> int:
    """Elements per 64-byte cache line: work is split at line boundaries."""
    return max(1, 64 // dtype.itemsize)


def split(ctx: KernelContext, n: int, g: int, lo: str = "k_lo", hi: str = "k_hi") -> str:
    """Declares this worker's share [lo, hi) of n items, cut at multiples of g where the
    context splits at cache lines (else at single items)."""
    g = g if ctx.line_shares else 1
    return f"int64_t {lo}, {hi}; ck_range({n}, {g}, {ctx.worker}, {ctx.workers}, &{lo}, &{hi});"


def block(*lines: str) -> str:
    return "{\n" + "\n".join(l for l in lines if l) + "\n}"


def convert(expr: str, src: torch.dtype, dst: torch.dtype) -> str:
    """C expression converting `expr` (of src's C type) to dst like Tensor.to(dst)."""
    if src == dst:
        return expr
    if dst is torch.bool:
        return f"(uint8_t)(({expr}) != 0)"
    if dst is torch.uint8 and is_float(src):
        return f"(uint8_t)(int64_t)({expr})"   # torch goes through int64 (negative floats wrap)
    return f"({ctype(dst)})({expr})"


# -- broadcasting --------------------------------------------------------------------------

def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous tensor of `shape` read at `out_shape` (0 where broadcast)."""
    shape = tuple(shape)
    while len(shape) > len(out_shape) and shape[0] == 1:   # leading 1s beyond the output's rank
        shape = shape[1:]
    pad = len(out_shape) - len(shape)
    own = strides_of(shape)
    out = []
    for i, d in enumerate(out_shape):
        j = i - pad
        if j < 0 or shape[j] == 1:
            out.append(0)
        else:
            assert shape[j] == d, (shape, out_shape)
            out.append(own[j])
    return out


def collapse(dims: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours every stride list walks as one dim."""
    keep = [i for i, d in enumerate(dims) if d != 1]   # an expression is never 1
    sizes = [dims[i] for i in keep]
    sts = [[s[i] for i in keep] for s in strides]
    i = len(sizes) - 1
    while i > 0:
        if all(s[i - 1] == product(s[i], sizes[i]) for s in sts):
            sizes[i - 1] = product(sizes[i - 1], sizes[i])
            for s in sts:
                s[i - 1] = s[i]
            del sizes[i]
            for s in sts:
                del s[i]
        i -= 1
    if not sizes:
        sizes, sts = [1], [[0] for _ in sts]
    return sizes, sts


def offset_expr(index: str, sizes: Sequence[int], strides: Sequence[int]) -> str:
    """C expression of the element offset of flat row-major index `index` over `sizes`."""
    terms, after = [], 1
    for d in range(len(sizes) - 1, -1, -1):
        if strides[d] and (isinstance(sizes[d], str) or sizes[d] > 1):
            idx = index if after == 1 else f"({index} / {after})"
            if d > 0:
                idx = f"({idx} % {sizes[d]})"
            terms.append(f"{idx} * {strides[d]}" if strides[d] != 1 else idx)
        after = product(after, sizes[d])
    return " + ".join(reversed(terms)) if terms else "0"


def map_kernel(ctx: KernelContext, out: Value, operands: Sequence[Value],
               element: Callable[[list[str]], str], prologue: str = "") -> str:
    """out[i] = element([operand_k[broadcast(i)] ...]) for every i, each worker a block of i.
    `element` gets one C expression per operand (of the operand's C type) and returns the
    result's C expression."""
    out_shape = c_shape(ctx, out.type.shape)
    n = numel(out_shape)
    if n == 0:
        return ""
    sizes, sts = collapse(out_shape, [broadcast_strides(c_shape(ctx, v.type.shape), out_shape) for v in operands])
    inner = sizes[-1]
    decl = [f"{ctype(out.type.dtype)}* k_y = {ctx.ptr(out)};"]
    decl += [f"const {ctype(v.type.dtype)}* k_x{i} = {ctx.ptr(v)};" for i, v in enumerate(operands)]
    lines = [prologue, *decl, split(ctx, n, grain(out.type.dtype))]
    if len(sizes) == 1:
        loads = [f"k_x{i}[k_i]" if s[-1] else f"k_x{i}[0]" for i, s in enumerate(sts)]
        lines += [ctx.simd(), f"for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) k_y[k_i] = {element(loads)};"]
        return block(*lines)
    outer = sizes[:-1]
    row = [f"const int64_t k_r = k_i / {inner}, k_j0 = k_i - k_r * {inner};",
           f"const int64_t k_j1 = CK_MIN({inner}, k_j0 + (k_hi - k_i));"]
    for i, s in enumerate(sts):
        row.append(f"const {ctype(operands[i].type.dtype)}* k_p{i} = k_x{i} + {offset_expr('k_r', outer, s[:-1])};")
    row.append(f"{ctype(out.type.dtype)}* k_q = k_y + k_r * {inner};")
    loads = [f"k_p{i}[k_j]" if s[-1] else f"k_p{i}[0]" for i, s in enumerate(sts)]
    lines += ["for (int64_t k_i = k_lo; k_i < k_hi; ) {", *row, ctx.simd(),
              f"for (int64_t k_j = k_j0; k_j < k_j1; ++k_j) k_q[k_j] = {element(loads)};",
              "k_i += k_j1 - k_j0;", "}"]
    return block(*lines)


def strided_copy(ctx: KernelContext, out: Value, src: str, src_dtype: torch.dtype, base: str,
                 shape: Sequence[int], strides: Sequence[int]) -> str:
    """out (contiguous, of `shape`) = the strided view src[base + sum(i_d * strides[d])]."""
    n = numel(shape)
    if n == 0:
        return ""
    sizes, (sts,) = collapse(shape, [strides])
    inner, outer = sizes[-1], sizes[:-1]
    cty = ctype(out.type.dtype)
    step = "k_j" if sts[-1] == 1 else f"k_j * {sts[-1]}"
    lines = [f"{cty}* k_y = {ctx.ptr(out)};", f"const {ctype(src_dtype)}* k_x = {src};",
             split(ctx, n, grain(out.type.dtype))]
    if not outer:
        lines += [ctx.simd(), f"for (int64_t k_j = k_lo; k_j < k_hi; ++k_j) k_y[k_j] = k_x[{base} + {step}];"]
        return block(*lines)
    lines += ["for (int64_t k_i = k_lo; k_i < k_hi; ) {",
              f"const int64_t k_r = k_i / {inner}, k_j0 = k_i - k_r * {inner};",
              f"const int64_t k_j1 = CK_MIN({inner}, k_j0 + (k_hi - k_i));",
              f"const {ctype(src_dtype)}* k_p = k_x + {base} + {offset_expr('k_r', outer, sts[:-1])};",
              f"{cty}* k_q = k_y + k_r * {inner};",
              ctx.simd(),
              f"for (int64_t k_j = k_j0; k_j < k_j1; ++k_j) k_q[k_j] = k_p[{step}];",
              "k_i += k_j1 - k_j0;", "}"]
    return block(*lines)
