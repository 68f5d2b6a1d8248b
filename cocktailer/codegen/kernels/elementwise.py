"""Sources (SCALAR, FULL, ARANGE) and elementwise ops: unary, CAST, binary with torch's
broadcasting and type promotion, WHERE.

A binary op computes in torch's promoted dtype (`torch.result_type` of its operands, 0-d
tensors included) and converts to the result type: comparisons give bool, DIV of integers
divides in the result's float type, logical ops test each operand against 0 in its own type.
Signed 32/64-bit integer arithmetic goes through unsigned so that overflow wraps as in torch
instead of being undefined in C.
"""
from __future__ import annotations

import torch

from cocktailer.codegen.kernels.common import (block, c_shape, convert, grain, is_float, lit, map_kernel, numel,
                                               split)
from cocktailer.codegen.kernels.context import KernelContext, ctype
from cocktailer.ir import Op, Operation
from cocktailer.ir.ops import UNARY

# -- sources ---------------------------------------------------------------------------


def render_scalar(op: Operation, ctx: KernelContext) -> str:
    out = op.results[0]
    return f"if ({ctx.worker} == 0) {ctx.ptr(out)}[0] = {lit(op.attrs['value'], out.type.dtype)};"


def render_dim(op: Operation, ctx: KernelContext) -> str:
    """A size of the operand's type: a symbolic one is the call's (ctx.size)."""
    x, out = op.operands[0], op.results[0]
    return f"if ({ctx.worker} == 0) {ctx.ptr(out)}[0] = {ctx.size(x.type.shape[op.attrs['dim']])};"


def render_full(op: Operation, ctx: KernelContext) -> str:
    out = op.results[0]
    n = numel(c_shape(ctx, out.type.shape))
    if n == 0:
        return ""
    value = lit(op.attrs["value"], out.type.dtype)
    return block(f"{ctype(out.type.dtype)}* k_y = {ctx.ptr(out)};", split(ctx, n, grain(out.type.dtype)),
                 ctx.simd(), f"for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) k_y[k_i] = {value};")


def render_arange(op: Operation, ctx: KernelContext) -> str:
    """torch's arange: start + step * i in the accumulate type (double for floats, int64 for
    integers), then converted."""
    out = op.results[0]
    dt = out.type.dtype
    n = numel(out.type.shape)
    if n == 0:
        return ""
    acc = torch.float64 if is_float(dt) else torch.int64
    start, step = lit(op.attrs["start"], acc), lit(op.attrs["step"], acc)
    value = convert(f"({start} + {step} * ({ctype(acc)})k_i)", acc, dt)
    return block(f"{ctype(dt)}* k_y = {ctx.ptr(out)};", split(ctx, n, grain(dt)),
                 ctx.simd(), f"for (int64_t k_i = k_lo; k_i < k_hi; ++k_i) k_y[k_i] = {value};")


# -- unary ---------------------------------------------------------------------------------

_F32 = {  # op -> C expression of x (float)
    Op.NEG: "(-{x})", Op.ABS: "fabsf({x})", Op.EXP: "ck_expf({x})", Op.LOG: "logf({x})",
    Op.SQRT: "sqrtf({x})", Op.RSQRT: "(1.0f / sqrtf({x}))", Op.RECIPROCAL: "(1.0f / {x})",
    Op.TANH: "ck_tanhf({x})", Op.SIGMOID: "ck_sigmoidf({x})", Op.RELU: "({x} < 0 ? 0.0f : {x})",
    Op.GELU: "ck_geluf({x})",
    Op.SILU: "({x} / (1.0f + ck_expf(-{x})))", Op.SIN: "sinf({x})", Op.COS: "cosf({x})",
    Op.ERF: "ck_erff({x})", Op.FLOOR: "floorf({x})", Op.CEIL: "ceilf({x})",
}
_F64 = {
    Op.NEG: "(-{x})", Op.ABS: "fabs({x})", Op.EXP: "exp({x})", Op.LOG: "log({x})",
    Op.SQRT: "sqrt({x})", Op.RSQRT: "(1.0 / sqrt({x}))", Op.RECIPROCAL: "(1.0 / {x})",
    Op.TANH: "tanh({x})", Op.SIGMOID: "ck_sigmoid({x})", Op.RELU: "({x} < 0 ? 0.0 : {x})",
    Op.GELU: "(0.5 * {x} * (1.0 + erf({x} * 0.70710678118654752440)))",
    Op.SILU: "({x} / (1.0 + exp(-{x})))", Op.SIN: "sin({x})", Op.COS: "cos({x})",
    Op.ERF: "erf({x})", Op.FLOOR: "floor({x})", Op.CEIL: "ceil({x})",
}
_INT_UNARY = {Op.NEG, Op.ABS, Op.RELU, Op.FLOOR, Op.CEIL}


def _int_unary(kind: Op, x: str, dt: torch.dtype) -> str:
    c = ctype(dt)
    wide = dt in (torch.int32, torch.int64)
    u = "uint64_t" if dt is torch.int64 else "uint32_t"
    neg = f"({c})(0 - ({u}){x})" if wide else f"({c})(-{x})"
    if kind is Op.NEG:
        return neg
    if kind is Op.ABS:
        return f"({x} < 0 ? {neg} : {x})" if dt is not torch.uint8 else x
    if kind is Op.RELU:
        return f"({x} < 0 ? ({c})0 : {x})"
    return x   # FLOOR, CEIL of an integer


def unary_supported(op: Operation) -> bool:
    dst = op.results[0].type.dtype
    if op.op in (Op.CAST, Op.NOT):
        return True
    if is_float(dst):
        return True
    return op.op in _INT_UNARY and dst is not torch.bool


def unary_expr(kind: Op, x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """C expression of a unary op on the element `x` (of src's C type), of dst's C type."""
    if kind is Op.CAST:
        return convert(x, src, dst)
    if kind is Op.NOT:
        return f"(uint8_t)(({x}) == 0)"
    if is_float(dst):
        table = _F32 if dst is torch.float32 else _F64
        return table[kind].format(x=f"({convert(x, src, dst)})")
    return _int_unary(kind, convert(x, src, dst), dst)


def render_unary(op: Operation, ctx: KernelContext) -> str:
    src, dst = op.operands[0].type.dtype, op.results[0].type.dtype
    return map_kernel(ctx, op.results[0], op.operands, lambda xs: unary_expr(op.op, xs[0], src, dst))


# -- binary --------------------------------------------------------------------------------

_ARITH = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*"}
_COMPARE = {Op.EQ: "==", Op.NE: "!=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}
_LOGICAL = {Op.AND: "&", Op.OR: "|", Op.XOR: "^"}


def compute_dtype(op: Operation) -> torch.dtype:
    """The dtype torch computes a binary op in: the promotion of its operands (0-d rules included)."""
    a, b = op.operands[0].type, op.operands[1].type
    return torch.result_type(a.meta(), b.meta())


def binary_supported(op: Operation) -> bool:
    cdt = compute_dtype(op)
    return op.op not in (Op.FLOORDIV, Op.MOD, Op.POW) or cdt is not torch.bool


def int_divides(op: Operation) -> bool:
    """FLOORDIV/MOD on integers: a zero divisor is a run-time error, as in torch."""
    return op.op in (Op.FLOORDIV, Op.MOD) and not is_float(compute_dtype(op))


def binary_expr(kind: Op, a: str, b: str, da: torch.dtype, db: torch.dtype, cdt: torch.dtype,
                dst: torch.dtype) -> str:
    """C expression of a binary op on elements a (da), b (db) computed in cdt, of dst's C type."""
    if kind in _LOGICAL:
        return f"(uint8_t)((({a}) != 0) {_LOGICAL[kind]} (({b}) != 0))"
    x, y = convert(a, da, cdt), convert(b, db, cdt)
    c = ctype(cdt)
    if kind in _COMPARE:
        return f"(uint8_t)(({x}) {_COMPARE[kind]} ({y}))"
    if kind is Op.DIV:
        return convert(f"({convert(a, da, dst)}) / ({convert(b, db, dst)})", dst, dst)
    if is_float(cdt):
        sfx = "f" if cdt is torch.float32 else ""
        t = "float" if cdt is torch.float32 else "double"
        e = {
            Op.ADD: f"({x}) + ({y})", Op.SUB: f"({x}) - ({y})", Op.MUL: f"({x}) * ({y})",
            Op.FLOORDIV: f"ck_floordiv_{t}({x}, {y})", Op.MOD: f"ck_mod_{t}({x}, {y})",
            Op.POW: f"pow{sfx}({x}, {y})",
            Op.MAXIMUM: f"(({x}) > ({y}) || ({x}) != ({x}) ? ({x}) : ({y}))",
            Op.MINIMUM: f"(({x}) < ({y}) || ({x}) != ({x}) ? ({x}) : ({y}))",
        }[kind]
        return convert(f"({e})", cdt, dst)
    # integers and bool
    if kind in _ARITH:
        if cdt in (torch.int32, torch.int64):
            u = "uint64_t" if cdt is torch.int64 else "uint32_t"
            e = f"({c})(({u})({x}) {_ARITH[kind]} ({u})({y}))"
        else:
            e = f"({c})(({x}) {_ARITH[kind]} ({y}))"
        return convert(e, cdt, dst) if cdt is not torch.bool else f"(uint8_t)((({x}) {_ARITH[kind]} ({y})) != 0)"
    e = {
        Op.FLOORDIV: f"({c})ck_floordiv_i64((int64_t)({x}), (int64_t)({y}))",
        Op.MOD: f"({c})ck_mod_i64((int64_t)({x}), (int64_t)({y}))",
        Op.POW: f"({c})ck_powi((int64_t)({x}), (int64_t)({y}))",
        Op.MAXIMUM: f"(({x}) > ({y}) ? ({x}) : ({y}))",
        Op.MINIMUM: f"(({x}) < ({y}) ? ({x}) : ({y}))",
    }[kind]
    return convert(e, cdt, dst)


def render_binary(op: Operation, ctx: KernelContext) -> str:
    a, b = op.operands
    out = op.results[0]
    cdt = compute_dtype(op)
    prologue = ""
    if int_divides(op) and tuple(b.type.shape) != tuple(out.type.shape):
        # Every worker scans the whole (broadcast) divisor, so all agree on failing. A divisor of
        # the result's shape may still be being written by the other workers (a map op of the
        # same partition needs no barrier before this one), so it is not scanned: a zero there
        # gives 0 instead of an error.
        n = numel(b.type.shape)
        prologue = block(f"const {ctype(b.type.dtype)}* k_d = {ctx.ptr(b)};", "int k_zero = 0;",
                         f"for (int64_t k_i = 0; k_i < {n}; ++k_i) k_zero |= k_d[k_i] == 0;",
                         f"if (k_zero) {ctx.fail('integer division by zero')}") if n else ""
    return map_kernel(ctx, out, [a, b], lambda xs: binary_expr(op.op, xs[0], xs[1], a.type.dtype, b.type.dtype,
                                                               cdt, out.type.dtype), prologue=prologue)


def render_where(op: Operation, ctx: KernelContext) -> str:
    types = [v.type for v in op.operands]
    return map_kernel(ctx, op.results[0], op.operands, lambda xs: step_expr(Op.WHERE, xs, types, op.results[0].type))


# -- fused ---------------------------------------------------------------------------------


def step_expr(kind: Op, xs: list[str], types: list, out) -> str:
    """C expression of one elementwise op on element expressions `xs` of operand `types`,
    of the C type of `out` (a TensorType): what render_unary/binary/where compute per element."""
    dst = out.dtype
    if kind in UNARY:
        return unary_expr(kind, xs[0], types[0].dtype, dst)
    if kind is Op.WHERE:
        return f"(({xs[0]}) ? {convert(xs[1], types[1].dtype, dst)} : {convert(xs[2], types[2].dtype, dst)})"
    cdt = torch.result_type(types[0].meta(), types[1].meta())
    return binary_expr(kind, xs[0], xs[1], types[0].dtype, types[1].dtype, cdt, dst)


def render_fused(op: Operation, ctx: KernelContext) -> str:
    """A chain of elementwise ops (`passes.fuse`) as one loop: each element's value computed
    through every step in registers, no intermediate tensor written or read."""
    steps = op.attrs["steps"]
    types = [v.type for v in op.operands] + [out for *_, out in steps]

    def element(loads: list[str]) -> str:
        exprs = list(loads)
        for kind, refs, _, out in steps:
            exprs.append(step_expr(Op[kind], [exprs[r] for r in refs], [types[r] for r in refs], out))
        return exprs[-1]
    return map_kernel(ctx, op.results[0], op.operands, element)
