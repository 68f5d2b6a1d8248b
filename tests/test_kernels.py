"""The C kernels (cocktailer.codegen.kernels), one op at a time, against the ops' torch
semantics (cocktailer.ir.ops.SEMANTICS).

A small harness of its own, independent of the backend core: each case is one Operation
built by hand; the cases are rendered GROUP_SIZE to a C file by
`cocktailer.codegen.kernels.standalone` (PRELUDE + one `run_<i>` per case: a `#pragma omp
parallel` region around the kernel), compiled with the backend's flags (gcc -O3 -march=native
-fopenmp) into a temp dir (cached by source hash, files compiled in parallel), loaded with
ctypes and run on torch tensors bound by data_ptr() with 1, 2 and 3 workers; with 2 and 3 the
kernel runs 4 times, the workers released together and the result poisoned in between, so a
worker writing outside its share has a chance to show. Results must match float32 to rtol
1e-5/atol 1e-6 (contractions and long sums: a bound scaled by sum |terms|), integers and
bools exactly; cases that must fail at run time (index out of range, integer division by a
zero in a broadcast divisor) must report the error. One test builds a few kernels without
AVX-512 (the portable code). At the end a few single-op programs go through the "cpu"
backend, once the core registers it.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import torch

from cocktailer.codegen.kernels import KERNELS, ctype, gemm, matmul, supported
from cocktailer.codegen.kernels.standalone import Library, render
from cocktailer.runtime.compiler import compile_shared_library
from cocktailer.ir import CREATION, SEMANTICS, Op, Operation, TensorType, Value, infer_type
from cocktailer.ir.ops import BINARY

WORKERS = (1, 2, 3)
GROUP_SIZE = 90   # cases per C file

F32, F64, I64, I32, I16, I8, U8, B = (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16,
                                      torch.int8, torch.uint8, torch.bool)
DTYPES = (F32, F64, I64, I32, I16, I8, U8, B)


# -- cases -----------------------------------------------------------------------------------

@dataclass
class Case:
    op: Op
    inputs: list[torch.Tensor]
    attrs: dict = field(default_factory=dict)
    fails: bool = False          # must report a run-time error
    scale: str = "elementwise"   # tolerance model: "elementwise", "matmul", "conv", "sum"
    name: str = ""

    def __post_init__(self):
        self.operands = [Value(TensorType.of(t)) for t in self.inputs]
        rtype = infer_type(self.op, [v.type for v in self.operands], self.attrs)
        self.operation = Operation(self.op, self.operands, [Value(rtype)], dict(self.attrs))

    @property
    def id(self) -> str:
        shapes = ",".join(f"{ctype_name(t.dtype)}{list(t.shape)}" for t in self.inputs)
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs.items() if k != "device")
        return f"{self.op.name}({shapes}{';' + attrs if attrs else ''}){self.name}"


def ctype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


def gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


_seed = iter(range(10 ** 6))


def rand(shape, dtype=F32, lo=-3, hi=4, special=False) -> torch.Tensor:
    g = gen(next(_seed))
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
        if special and t.numel() >= 8:
            flat = t.view(-1)
            flat[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-30], dtype=dtype)
            flat[:] = flat[torch.randperm(flat.numel(), generator=g)]
        return t
    if dtype is B:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype is U8:
        lo = max(lo, 0)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def pos(shape, dtype=F32) -> torch.Tensor:
    return rand(shape, F64).abs().add(0.1).to(dtype)


def cases_creation() -> list[Case]:
    out = []
    for dt, v in [(F32, 1.5), (F64, -2.25), (I64, 7), (I32, -3), (B, True), (U8, 200), (F32, float("inf")),
                  (F32, float("nan")), (I64, -(2 ** 63)), (I8, -128)]:
        out.append(Case(Op.SCALAR, [], {"value": v, "dtype": dt}))
    for shape, v, dt in [((), 3.0, F32), ((5,), 0, I64), ((3, 37), 0.1, F32), ((0, 4), 1, F32), ((2, 3), True, B),
                         ((1000,), -1.5, F64), ((4,), -float("inf"), F32), ((7, 9), 250, U8)]:
        out.append(Case(Op.FULL, [], {"shape": shape, "value": v, "dtype": dt}))
    for a, b, s, dt in [(0, 10, 1, I64), (0, 1, 0.1, F32), (5, -5, -1.5, F32), (2, 300, 7, I32), (0, 0, 1, I64),
                        (-1.0, 1.0, 0.25, F64), (0, 100000, 3, I64), (0.5, 5, 1, I64)]:
        out.append(Case(Op.ARANGE, [], {"start": a, "end": b, "step": s, "dtype": dt}))
    return out


def cases_unary() -> list[Case]:
    out = []
    floats = [Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIPROCAL, Op.TANH, Op.SIGMOID, Op.RELU,
              Op.GELU, Op.SILU, Op.SIN, Op.COS, Op.ERF, Op.FLOOR, Op.CEIL]
    for kind in floats:   # torch's float32 GELU gives nan at +inf (its vectorized erf), so no specials there
        out.append(Case(kind, [rand((7, 37), F32, special=kind is not Op.GELU) * 5]))
        out.append(Case(kind, [rand((129,), F64, special=True) * 5]))
    x = torch.cat([torch.linspace(-110, 100, 2001), torch.tensor([88.72, 88.73, -87.5, -103.5, 1e-4, -1e-4, 0.6249, 0.6251])])
    for kind in (Op.EXP, Op.TANH, Op.SIGMOID, Op.SILU, Op.ERF, Op.GELU):   # (erf, GELU: both sides of 0.5)
        out.append(Case(kind, [x], name="-range"))
    for kind in (Op.EXP, Op.SQRT, Op.SIGMOID, Op.TANH):   # integer inputs compute in float
        out.append(Case(kind, [rand((33,), I64, 0, 9)]))
    for kind, dts in [(Op.NEG, (I64, I32, I16, I8)), (Op.ABS, (I64, I32, I8, U8)), (Op.RELU, (I64, I32)),
                      (Op.FLOOR, (I64,)), (Op.CEIL, (I32,))]:
        for dt in dts:
            t = rand((50,), dt, -128, 128)
            if dt in (I8, I32, I64):
                t[0] = torch.iinfo(dt).min
            out.append(Case(kind, [t]))
    for dt in DTYPES:
        out.append(Case(Op.NOT, [rand((40,), dt, special=True)]))
    for src in DTYPES:
        for dst in DTYPES:
            if src == dst:
                continue
            if src.is_floating_point:
                t = rand((61,), src) * 40
                if dst.is_floating_point or dst is B:
                    t = rand((61,), src, special=True) * 40
            else:
                t = rand((61,), src, -100, 100)
            out.append(Case(Op.CAST, [t], {"dtype": dst}))
    out.append(Case(Op.CAST, [torch.tensor([-1.0, -3.7, 255.9, 3.2])], {"dtype": U8}, name="-negative-to-u8"))
    out.append(Case(Op.CAST, [rand((0, 3))], {"dtype": I64}, name="-empty"))
    out.append(Case(Op.EXP, [torch.tensor(2.0)], name="-0d"))
    return out


SHAPES = [((3, 4), (3, 4)), ((2, 3, 17), (17,)), ((2, 1, 5), (3, 1)), ((), (19,)), ((33, 65), (1, 65)),
          ((5, 1, 7), (1, 6, 1)), ((4, 6), ()), ((1,), (1, 1, 1)), ((0, 3), (1, 3)), ((2, 3, 4, 5), (3, 1, 5)),
          ((1000,), (1000,)), ((64, 1), (64, 40))]


def cases_binary() -> list[Case]:
    out = []
    for kind in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAXIMUM, Op.LT):
        for sa, sb in SHAPES:
            out.append(Case(kind, [rand(sa), rand(sb)]))
    combos = [(F32, F32), (I64, F32), (I64, I64), (I32, I64), (U8, I8), (I16, I16), (F64, F32), (B, B), (B, I32), (F32, F64)]
    layouts = [((5, 12), (12,)), ((), (9,)), ((7,), ())]
    for kind in sorted(BINARY, key=lambda k: k.value):
        for i, (da, db) in enumerate(combos):
            if kind is Op.SUB and B in (da, db):
                continue
            for sa, sb in (layouts[(i + kind.value) % 3],):   # every layout meets every op and dtype pair somewhere
                a, b = rand(sa, da, special=True), rand(sb, db, special=True)
                if kind in (Op.FLOORDIV, Op.MOD) and not (da.is_floating_point or db.is_floating_point):
                    if da is B and db is B:
                        continue
                    b = b.masked_fill(b == 0, 3)
                if kind is Op.POW and not (da.is_floating_point or db.is_floating_point):
                    if da is B and db is B:
                        continue
                    b = b.abs() if db is not B else b
                    a = a.clamp(-4, 4) if da is not B else a
                if kind is Op.POW and (da.is_floating_point or db.is_floating_point) and da is not B:
                    a = a.abs() if da.is_floating_point else a
                out.append(Case(kind, [a, b]))
    # floor semantics, zeros, overflow
    a = torch.tensor([-7.5, 7.5, -0.0, 5.0, -5.0, 0.0, 3.0, -3.0, 1e30, -1e-30])
    b = torch.tensor([2.0, -2.0, 3.0, 0.0, 0.0, 0.0, -1.5, 1.5, 7.0, 3.0])
    out += [Case(Op.FLOORDIV, [a, b], name="-float-edges"), Case(Op.MOD, [a, b], name="-float-edges"),
            Case(Op.DIV, [a, b], name="-float-edges")]
    ai = torch.tensor([-7, 7, -7, 7, 0, -1, torch.iinfo(torch.int64).min, 9])
    bi = torch.tensor([2, -2, -2, 2, 5, 3, -1, -9])
    out += [Case(Op.FLOORDIV, [ai, bi], name="-int-edges"), Case(Op.MOD, [ai, bi], name="-int-edges")]
    out += [Case(Op.FLOORDIV, [ai, bi[:1].clone().zero_()], fails=True, name="-by-zero"),
            Case(Op.MOD, [ai.to(I32), torch.tensor(0, dtype=I32)], fails=True, name="-by-zero"),
            Case(Op.DIV, [torch.tensor([1, -1, 0]), torch.tensor([0, 0, 0])], name="-int-by-zero")]
    big = torch.tensor([2 ** 62, -(2 ** 62), 2 ** 31 - 1])
    out += [Case(Op.ADD, [big, big], name="-wraps"), Case(Op.MUL, [big.to(I32), torch.tensor(3, dtype=I32)], name="-wraps"),
            Case(Op.POW, [torch.tensor([2, 3, -2, 1, -1, 0]), torch.tensor([-1, 40, -3, -4, -3, 0])], name="-int-neg-exp")]
    return out


def cases_where() -> list[Case]:
    out = []
    for sc, sa, sb, da, db in [((4, 5), (4, 5), (4, 5), F32, F32), ((3, 1), (1, 7), (), F32, F64),
                               ((2, 3, 4), (4,), (3, 1), I64, F32), ((9,), (9,), (9,), B, B), ((1,), (), (), I32, I64),
                               ((64, 1, 1, 1), (64, 4, 3, 3), (64, 4, 3, 3), F32, F32)]:
        out.append(Case(Op.WHERE, [rand(sc, B), rand(sa, da), rand(sb, db)]))
    return out


def _fused_case(inputs: list[torch.Tensor], chain: list[tuple]) -> Case:
    """A FUSED op (passes.fuse) of `chain`: (op, operand refs into inputs then earlier steps, attrs)."""
    values, steps = list(inputs), []
    for kind, refs, attrs in chain:
        values.append(SEMANTICS[kind](*(values[r] for r in refs), **attrs))
        steps.append((kind.name, tuple(refs), tuple(sorted(attrs.items())), TensorType.of(values[-1])))
    return Case(Op.FUSED, inputs, {"steps": tuple(steps)})


def cases_fused() -> list[Case]:
    """A Linear's bias, GELU and a scale; integers and floats promoted, compared and selected, then
    cast; float64; a 0-d operand and broadcasting rows."""
    return [
        _fused_case([rand((7, 37)), rand((37,))], [(Op.ADD, (0, 1), {}), (Op.GELU, (2,), {}), (Op.MUL, (3, 0), {})]),
        _fused_case([rand((5, 8), I64), rand((5, 8)), rand((), F32)],
                    [(Op.MUL, (0, 1), {}), (Op.GT, (3, 2), {}), (Op.WHERE, (4, 1, 3), {}),
                     (Op.CAST, (5,), {"dtype": I32})]),
        _fused_case([rand((3, 1, 9), F64, special=True), rand((4, 9), F64)],
                    [(Op.SIGMOID, (0,), {}), (Op.SUB, (2, 1), {}), (Op.TANH, (3,), {}), (Op.EXP, (4,), {})]),
        _fused_case([rand((6, 33), I32), rand((33,), I32)], [(Op.ADD, (0, 1), {}), (Op.NEG, (2,), {}),
                                                              (Op.MAXIMUM, (3, 0), {})]),
    ]


def cases_reduce() -> list[Case]:
    out = []
    shapes_dims = [((6, 7, 8), None), ((6, 7, 8), (0,)), ((6, 7, 8), (1,)), ((6, 7, 8), (2,)), ((6, 7, 8), (0, 2)),
                   ((6, 7, 8), (1, 2)), ((6, 1, 8), (1,)), ((130,), (0,)), ((5, 200), (0,)), ((3, 100, 3), (1,)),
                   ((2, 3, 4, 5), (1, 3)), ((1, 1), None), ((4, 0), (1,)), ((0, 4), (1,)), ((), None), ((3, 1), (1,))]
    for kind in (Op.SUM, Op.MEAN, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL):
        for shape, dims in shapes_dims:
            if kind in (Op.AMAX, Op.AMIN) and 0 in shape:
                continue
            for keepdim in ((False, True) if dims is not None else (False,)):
                x = rand(shape, F32) if kind is not Op.PROD else rand(shape, F64).mul(0.3).add(1).float()
                out.append(Case(kind, [x], {"dims": dims, "keepdim": keepdim}, scale="sum"))
    for kind in (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL):
        for dt in (I64, I32, U8, B, F64):
            for dims in (None, (1,), (0,)):
                out.append(Case(kind, [rand((5, 19), dt, -4, 5)], {"dims": dims, "keepdim": False}, scale="sum"))
    for kind in (Op.AMAX, Op.AMIN):
        for dims in (None, (0,), (1,)):
            out.append(Case(kind, [rand((40, 33), F32, special=True)], {"dims": dims, "keepdim": False}, name="-nan"))
    out.append(Case(Op.SUM, [rand((50000,))], {"dims": None, "keepdim": False}, scale="sum", name="-long"))
    out.append(Case(Op.MEAN, [rand((8, 64, 7, 7))], {"dims": (2, 3), "keepdim": True}, scale="sum", name="-pool"))
    for kind in (Op.ARGMAX, Op.ARGMIN):
        for shape, dim in [((7, 9), None), ((7, 9), 0), ((7, 9), 1), ((7, 9), -1), ((3, 4, 5), 1), ((3797,), 0), ((5,), None)]:
            for keepdim in (False, True):
                out.append(Case(kind, [rand(shape)], {"dim": dim, "keepdim": keepdim}))
        ties = torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("nan"), 2.0, float("nan"), 5.0], [2.0, 2.0, 2.0, 2.0]])
        out.append(Case(kind, [ties], {"dim": 1, "keepdim": False}, name="-ties-nan"))
        out.append(Case(kind, [ties], {"dim": None, "keepdim": False}, name="-ties-nan"))
        out.append(Case(kind, [rand((6, 10), I64, -3, 3)], {"dim": 1, "keepdim": False}))
        out.append(Case(kind, [rand((6, 10), U8, 0, 3)], {"dim": 0, "keepdim": True}))
    for kind in (Op.SOFTMAX, Op.LOG_SOFTMAX):
        # (rows shorter than reduce.SHORT_ROW go a chunk of rows at a time: 1500 rows of 3 are two chunks)
        for shape, dim in [((4, 37), 1), ((4, 37), 0), ((3, 5, 70), 1), ((2, 3, 200), 2), ((1, 12, 1, 64), 3), ((9,), 0),
                           ((2, 100, 3), 1), ((1500, 3), 1), ((5, 63), 1)]:
            out.append(Case(kind, [rand(shape) * 4], {"dim": dim}))
        out.append(Case(kind, [rand((3, 33), F64)], {"dim": 1}))
        masked = rand((3, 16)).masked_fill(torch.arange(16) > 5, float("-inf"))
        masked[2] = float("-inf")
        out.append(Case(kind, [masked], {"dim": 1}, name="-masked"))
    return out


def cases_matmul() -> list[Case]:
    out = []
    def mm(sa, sb, dt=F32, name=""):
        out.append(Case(Op.MATMUL, [rand(sa, dt, -5, 6), rand(sb, dt, -5, 6)], scale="matmul", name=name))
    mm((33,), (33,))
    mm((9, 33), (33,))
    mm((33,), (33, 40))
    mm((4, 33), (5, 33, 20))
    mm((2, 3, 7, 33), (33,))
    for M in (1, 2, 3, 5, 7, 8, 13, 64):
        for K, N in ((64, 100), (300, 33), (700, 16), (1, 1024)):
            mm((M, K), (K, N))
    for M, K, N in ((64, 256, 1024), (9, 256, 5), (100, 64, 1), (130, 50, 200), (24, 16, 96), (1, 256, 3797), (8, 0, 20)):
        mm((M, K), (K, N))
    mm((2, 3, 17, 40), (40, 50), name="-fold")
    mm((6, 9, 40), (6, 40, 70))
    mm((1, 9, 40), (4, 40, 70))
    mm((4, 1, 9, 40), (3, 40, 70))
    mm((2, 12, 1, 64), (2, 12, 64, 64), name="-attention")
    mm((2, 12, 1, 64), (2, 12, 64, 7), name="-attention")
    for dt in (F64, I64, I32):
        mm((5, 30), (30, 21), dt)
        mm((2, 3, 30), (30,), dt)
    return out


def cases_conv() -> list[Case]:
    out = []
    def conv(x, w, bias=False, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1, dt=F32, name=""):
        xs = [rand(x, dt), rand(w, dt)] + ([rand((w[0],), dt)] if bias else [])
        out.append(Case(Op.CONV2D, xs, {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups},
                        scale="conv", name=name))
    conv((2, 3, 10, 10), (5, 3, 3, 3), bias=True, padding=(1, 1))
    conv((1, 16, 32, 32), (16, 16, 3, 3), padding=(1, 1))
    conv((2, 16, 17, 17), (32, 16, 3, 3), stride=(2, 2), padding=(1, 1))
    conv((2, 16, 16, 16), (32, 16, 1, 1), stride=(2, 2))
    conv((2, 24, 9, 9), (40, 24, 1, 1), bias=True, name="-pointwise")
    conv((1, 3, 37, 37), (8, 3, 7, 7), stride=(2, 2), padding=(3, 3))
    conv((2, 6, 11, 13), (9, 2, 3, 2), groups=3, padding=(2, 1), dilation=(2, 1))
    conv((1, 8, 9, 9), (8, 1, 3, 3), groups=8, padding=(1, 1), name="-depthwise")
    conv((3, 12, 12), (4, 3, 3, 3), padding=(1, 1), name="-unbatched")
    conv((64, 7, 1, 1), (10, 7, 1, 1), bias=True, name="-gate")
    conv((2, 5, 8, 8), (3, 5, 2, 2), stride=(3, 3), padding=(1, 0), bias=True)
    conv((2, 3, 10, 10), (5, 3, 3, 3), bias=True, padding=(1, 1), dt=F64)
    # stride 1 with output rows as wide as the input's: the direct (no im2col) path with AVX-512
    conv((2, 20, 9, 5), (24, 20, 3, 3), bias=True, padding=(1, 1), name="-direct-narrow-rows")
    conv((1, 6, 12, 11), (9, 6, 5, 3), padding=(2, 1), name="-direct-5x3")
    conv((2, 4, 13, 13), (10, 4, 3, 3), padding=(2, 2), dilation=(2, 2), name="-direct-dilated")
    conv((1, 3, 16, 16), (12, 3, 7, 7), padding=(3, 3), name="-direct-7x7")
    conv((1, 40, 6, 6), (17, 40, 3, 3), padding=(0, 1), name="-direct-fewer-rows")
    # small images: the im2col GEMM lays the batch's images side by side, panels cross images
    conv((3, 24, 7, 7), (40, 24, 3, 3), bias=True, padding=(1, 1), name="-images-side-by-side")
    conv((3, 24, 7, 7), (72, 24, 1, 1), name="-images-side-by-side")
    conv((5, 8, 4, 5), (16, 8, 1, 1), name="-panels-over-several-images")
    conv((5, 8, 4, 4), (16, 8, 3, 3), stride=(2, 2), padding=(1, 1), name="-panels-over-several-images")
    for stride, pad, dil, ceil in [((2, 2), (1, 1), (1, 1), False), ((2, 2), (0, 0), (1, 1), True), ((1, 1), (1, 1), (2, 2), False),
                                   ((3, 2), (1, 0), (1, 1), True)]:
        for kernel in ((3, 3), (2, 3)):
            if pad[0] * 2 > kernel[0] or pad[1] * 2 > kernel[1]:
                continue
            x = rand((2, 3, 11, 12), special=False)
            out.append(Case(Op.MAX_POOL2D, [x], {"kernel": kernel, "stride": stride, "padding": pad, "dilation": dil,
                                                 "ceil_mode": ceil}))
            for include in (True, False):
                out.append(Case(Op.AVG_POOL2D, [x], {"kernel": kernel, "stride": stride, "padding": pad, "ceil_mode": ceil,
                                                     "count_include_pad": include}))
    out.append(Case(Op.MAX_POOL2D, [rand((1, 2, 8, 8), special=True)],
                    {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0), "dilation": (1, 1), "ceil_mode": False}, name="-nan"))
    out.append(Case(Op.AVG_POOL2D, [rand((2, 4, 8, 8), F64)],
                    {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0), "ceil_mode": False, "count_include_pad": True}))
    out.append(Case(Op.MAX_POOL2D, [rand((3, 9, 9))],
                    {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "ceil_mode": True}))
    return out


def cases_movement() -> list[Case]:
    out = []
    out.append(Case(Op.RESHAPE, [rand((3, 4, 5))], {"shape": (12, 5)}))
    out.append(Case(Op.RESHAPE, [rand((3, 4), I64)], {"shape": (2, 6)}))
    out.append(Case(Op.RESHAPE, [rand((1,))], {"shape": ()}))
    for shape, dims in [((3, 4), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((70, 45), (1, 0)),
                        ((4, 33, 65), (0, 2, 1)), ((2, 12, 64, 64), (0, 1, 3, 2)), ((5, 1, 6), (1, 2, 0))]:
        out.append(Case(Op.PERMUTE, [rand(shape)], {"dims": dims}))
    out.append(Case(Op.PERMUTE, [rand((3, 5), B)], {"dims": (1, 0)}))
    for shape, to in [((3, 1), (3, 4)), ((1,), (2, 3)), ((), (5,)), ((2, 1, 4), (3, 2, 5, 4))]:
        out.append(Case(Op.EXPAND, [rand(shape)], {"shape": to}))
    out.append(Case(Op.CAT, [rand((2, 3)), rand((4, 3))], {"dim": 0}))
    out.append(Case(Op.CAT, [rand((2, 3, 4)), rand((2, 1, 4)), rand((2, 5, 4))], {"dim": 1}))
    out.append(Case(Op.CAT, [rand((2, 3)), rand((2, 7), F64), rand((2, 0))], {"dim": 1}, name="-promote"))
    out.append(Case(Op.CAT, [rand((3,), I64), rand((0,), I64), rand((5,), I64)], {"dim": 0}))
    # SELECT: static keys
    x = rand((5, 6, 7))
    for key in [(("int", 1),), (("int", -1), ("slice", None, None, 2)), (("slice", 1, -1, None), ("int", 2), ("slice", None, None, 3)),
                (("new",), ("slice", -3, None, None)), (("slice", None, None, None), ("new",), ("int", -6)),
                (("slice", 10, 20, None),), (("slice", -100, 2, None), ("slice", 5, 1, None))]:
        out.append(Case(Op.SELECT, [x], {"key": key}))
    # SELECT: dynamic indices, including negative and out of range
    for i, fails in [(0, False), (4, False), (-1, False), (-5, False), (5, True), (-6, True)]:
        out.append(Case(Op.SELECT, [x, torch.tensor(i)], {"key": (("dyn",),)}, fails=fails))
    out.append(Case(Op.SELECT, [x, torch.tensor(2), torch.tensor(-3)],
                    {"key": (("slice", None, None, None), ("dyn",), ("dyn",))}))
    out.append(Case(Op.SELECT, [x, torch.tensor(7)], {"key": (("int", 0), ("slice", 1, None, None), ("dyn",))}, fails=True))
    # UPDATE
    for key, vshape, dyn, fails in [((("int", 1),), (6, 7), [], False), ((("int", 1),), (7,), [], False),
                                    ((("slice", 1, 4, None), ("int", -2)), (3, 7), [], False),
                                    ((("slice", None, None, 2), ("slice", 1, None, 3)), (1, 7), [], False),
                                    ((("dyn",),), (), [torch.tensor(-2)], False),
                                    ((("slice", None, None, None), ("dyn",), ("slice", 0, 3, None)), (5, 3), [torch.tensor(5)], False),
                                    ((("dyn",),), (6, 7), [torch.tensor(9)], True),
                                    ((("new",), ("int", 0)), (1, 6, 7), [], False),
                                    ((("slice", 2, 2, None),), (7,), [], False)]:
        out.append(Case(Op.UPDATE, [x, rand(vshape), *dyn], {"key": key}, fails=fails))
    out.append(Case(Op.UPDATE, [rand((4, 100), I64), rand((100,), I32), torch.tensor(3)], {"key": (("dyn",),)}, name="-cast"))
    out.append(Case(Op.UPDATE, [rand((2, 12, 64, 64)), rand((2, 12, 64)), torch.tensor(31)],
                    {"key": (("slice", None, None, None), ("slice", None, None, None), ("dyn",), ("slice", None, None, None))},
                    name="-kv-cache"))
    # SELECT and UPDATE over lanes (a batched program's key): each lane's own tensor at its own index
    lanes, whole = ("lanes",), ("slice", None, None, None)
    per_lane = torch.tensor([0, 3, -1, 2, -4])
    x = rand((5, 3, 4))
    for key, dyn, fails in [((lanes, whole, ("lane",)), [per_lane], False),
                            ((lanes, ("lane",), ("int", 1)), [torch.tensor([2, -3, 0, 1, -1])], False),
                            ((lanes, ("dyn",), ("lane",)), [torch.tensor(-2), per_lane], False),
                            ((lanes, whole, ("lane",)), [torch.tensor([0, 1, 4, 0, 0])], True),
                            ((lanes, ("int", 1), whole), [], False)]:
        out.append(Case(Op.SELECT, [x, *dyn], {"key": key}, fails=fails, name="-lanes"))
    for x, v, key, dyn, fails in [
            (rand((5, 1, 7), I64), rand((5, 1), I64), (lanes, whole, ("lane",)), [torch.tensor([6, 0, -1, 3, 3])], False),
            (rand((5, 3, 4)), rand((4,)), (lanes, ("lane",)), [torch.tensor([0, 2, -1, 1, -3])], False),
            (rand((5, 3, 4)), rand((5, 3), I32), (lanes, whole, ("lane",)), [per_lane], False),
            (rand((5, 3, 4)), rand((5, 4)), (lanes, ("dyn",)), [torch.tensor(-1)], False),
            (rand((5, 3, 4)), rand((5, 3)), (lanes, whole, ("lane",)), [torch.tensor([0, 0, 0, 4, 0])], True)]:
        out.append(Case(Op.UPDATE, [x, v, *dyn], {"key": key}, fails=fails, name="-lanes"))
    # GATHER
    table = rand((20, 8))
    for idx, dim, fails in [(torch.tensor([3, 0, 19, -1]), 0, False), (torch.tensor([[1, 2], [-20, 5]]), 0, False),
                            (torch.tensor([20]), 0, True), (torch.tensor([0, -21]), 0, True),
                            (torch.tensor([7, 0, 7]), 1, False), (torch.tensor([[1], [-1]]), 1, False),
                            (torch.tensor([1, 2], dtype=I32), 0, False)]:
        out.append(Case(Op.GATHER, [table, idx], {"dim": dim}, fails=fails))
    out.append(Case(Op.GATHER, [rand((3, 4, 5), I64), torch.tensor([4, 0])], {"dim": 2}))
    # SCATTER: rows of a table at an index's positions (GATHER's inverse), also across the
    # workers' blocks of a large table and along an inner dim
    for idx, fails in [(torch.tensor([3, 0, 19, -1]), False), (torch.tensor([20]), True),
                       (torch.tensor([0, -21]), True), (torch.tensor([2, 1], dtype=I32), False)]:
        out.append(Case(Op.SCATTER, [table, idx, rand((len(idx), 8))], {"dim": 0}, fails=fails))
    out.append(Case(Op.SCATTER, [rand((300, 64)), torch.tensor([299, 0, 150, 7]), rand((4, 64))], {"dim": 0}))
    out.append(Case(Op.SCATTER, [rand((3, 4, 5), I64), torch.tensor([4, 0]), rand((3, 4, 2), I64)], {"dim": 2}))
    # DIM: a size as an i64[] (here a number; symbolic sizes through the backend: test_dynamic)
    out += [Case(Op.DIM, [rand((7, 3))], {"dim": d}) for d in (0, 1)]
    return out


ALL_CASES: list[Case] = (cases_creation() + cases_unary() + cases_binary() + cases_where() + cases_fused()
                         + cases_reduce() + cases_matmul() + cases_conv() + cases_movement())


# -- the harness -----------------------------------------------------------------------------

class Harness:
    """All cases, GROUP_SIZE to a C file (cocktailer.codegen.kernels.standalone), compiled in parallel."""

    def __init__(self, cases: list[Case]):
        self.cases = cases
        groups = [cases[s:s + GROUP_SIZE] for s in range(0, len(cases), GROUP_SIZE)]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            self.libs = list(pool.map(lambda g: Library([c.operation for c in g]), groups))

    def run(self, i: int, nt: int) -> tuple[torch.Tensor, str | None]:
        case = self.cases[i]
        lib, j = self.libs[i // GROUP_SIZE], i % GROUP_SIZE
        out = garbage(case.operation.results[0].type)
        err = lib.run(j, [t.contiguous() for t in case.inputs] + [out], workers=nt, reps=1 if nt == 1 else 4)
        return out, (lib.messages[j][err - 1] if err else None)


def garbage(rtype: TensorType) -> torch.Tensor:
    """A result buffer full of 0x7f bytes (bools: True), so elements a kernel leaves unwritten show."""
    out = torch.empty(rtype.shape, dtype=rtype.dtype)
    if out.numel():
        out.reshape(-1).view(torch.uint8).fill_(0x7F) if out.dtype is not B else out.fill_(True)
    return out


def reference(case: Case) -> torch.Tensor:
    extra = {"device": "cpu"} if case.op in CREATION else {}
    return SEMANTICS[case.op](*case.inputs, **case.attrs, **extra)


def check(case: Case, got: torch.Tensor):
    ref = reference(case)
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, ref.shape, got.dtype, ref.dtype)
    if not ref.dtype.is_floating_point:
        assert torch.equal(got, ref), f"\ngot {got}\nref {ref}"
        return
    if case.scale == "elementwise":
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, equal_nan=True)
        return
    # contractions and long sums: compare with a float64 reference, error bound ~ sum |terms|
    exact = SEMANTICS[case.op](*[t.double() if t.is_floating_point() else t for t in case.inputs], **case.attrs).to(F64)
    mag = SEMANTICS[case.op](*[t.double().abs() if t.is_floating_point() else t for t in case.inputs], **case.attrs).to(F64)
    if case.op in (Op.PROD, Op.AMAX, Op.AMIN, Op.MEAN):
        mag = exact.abs()
    bound = 1e-6 + 1e-5 * mag.abs() + 1e-5 * exact.abs()
    diff = (got.double() - exact).abs()
    same_nan = torch.isnan(got) == torch.isnan(exact)
    assert same_nan.all(), "NaN mismatch"
    ok = (diff <= bound) | torch.isnan(exact) | (got.double() == exact)
    assert ok.all(), f"max excess {(diff - bound)[~ok].max().item()} at {(~ok).nonzero()[:5].tolist()}"


@pytest.fixture(scope="module")
def harness() -> Harness:
    return Harness(ALL_CASES)


@pytest.mark.parametrize("index", range(len(ALL_CASES)), ids=[c.id for c in ALL_CASES])
def test_kernel(harness: Harness, index: int):
    case = ALL_CASES[index]
    assert supported(case.operation)
    for nt in WORKERS:
        got, err = harness.run(index, nt)
        if case.fails:
            assert err, f"expected a run-time error with {nt} workers"
        else:
            assert err is None, f"unexpected run-time error {err!r} with {nt} workers"
            check(case, got)


def _isa_picks() -> list:
    return [c for c in ALL_CASES if c.op in (Op.MATMUL, Op.CONV2D, Op.EXP, Op.TANH, Op.SOFTMAX)][::3]


def test_portable_fallback_without_avx512():
    """The GEMM engine and the conv packer have AVX-512 paths; without AVX-512 the same kernels
    take the other one (micro-kernel tiles in register-sized sub-tiles, GEMVs as row sweeps)."""
    picks = _isa_picks()
    lib = Library([c.operation for c in picks], extra_flags=("-mno-avx512f",))
    for j, case in enumerate(picks):
        out = garbage(case.operation.results[0].type)
        assert lib.run(j, [t.contiguous() for t in case.inputs] + [out], workers=2, reps=2) == 0
        check(case, out)


def test_kernels_as_the_cuda_dialect_renders_them():
    """No GEMM engine (a dot product per output element, a conv pixel per task) and work split
    at single elements: every product and convolution and every fifth other case, on several
    workers, each writing only its own elements (the result is poisoned between repetitions)."""
    picks = [c for k, c in enumerate(ALL_CASES) if c.op in (Op.MATMUL, Op.CONV2D) or k % 5 == 0]
    lib = Library([c.operation for c in picks], gpu_kernels=True)
    for j, case in enumerate(picks):
        for workers in (1, 3, 7):
            out = garbage(case.operation.results[0].type)
            err = lib.run(j, [t.contiguous() for t in case.inputs] + [out], workers=workers, reps=2)
            assert bool(err) == case.fails, (case.id, workers, err)
            if not case.fails:
                check(case, out)


def test_avx512_paths_build_on_any_machine():
    """The AVX-512 paths compile where the machine lacks AVX-512 (CI may): they run, and are
    checked, only where it has it (test_kernel)."""
    source, _ = render([c.operation for c in _isa_picks()])
    compile_shared_library(source, ("-mavx512f", "-mavx512dq", "-mavx512bw", "-mavx512vl"))


def test_packed_gemms_through_mkl_tiles(monkeypatch):
    """Without AVX-512 the packed GEMM's worker tiles call MKL's sgemm_, a lone worker's too:
    forced on here, so that machines with AVX-512 check that path too, with transposed, strided
    and batched operands as the cases have them."""
    if not gemm.blas_available():
        pytest.skip("torch's library exports no sgemm_ here")
    picks = [c for c in ALL_CASES if c.op is Op.MATMUL and matmul.path(c.operation).startswith("gemm")]
    if matmul.blas_tiles():   # this machine's choice: test_kernel runs them so
        assert render([c.operation for c in picks])[0].count("sgemm_(") >= len(picks)
        return
    monkeypatch.setattr(matmul, "blas_tiles", lambda: True)
    lib = Library([c.operation for c in picks])
    assert lib.source.count("sgemm_(") >= len(picks)
    for nt in WORKERS:
        for j, case in enumerate(picks):
            out = garbage(case.operation.results[0].type)
            assert lib.run(j, [t.contiguous() for t in case.inputs] + [out], workers=nt, reps=2) == 0
            check(case, out)


def test_integer_division_by_zero_in_a_same_shape_divisor_gives_zero():
    """Only a broadcast divisor is checked (all workers can read all of it); a divisor of the
    result's shape may be mid-write by other workers, so a zero there yields 0, no error."""
    case = Case(Op.FLOORDIV, [torch.tensor([7, -7, 5]), torch.tensor([2, 0, -2])])
    lib = Library([case.operation, Case(Op.MOD, case.inputs).operation])
    for j, kind in enumerate((Op.FLOORDIV, Op.MOD)):
        out = garbage(case.operation.results[0].type)
        assert lib.run(j, case.inputs + [out], workers=2) == 0
        assert out.tolist() == ([3, 0, -3] if kind is Op.FLOORDIV else [1, 0, -1])


def test_in_place_results():
    """The core may give a map op, RESHAPE or UPDATE the buffer of its first operand."""
    a, b = rand((33, 17)), rand((17,))
    v = rand((17,))
    cases = [Case(Op.MUL, [a, b]), Case(Op.SIGMOID, [a]), Case(Op.RESHAPE, [a], {"shape": (17, 33)}),
             Case(Op.UPDATE, [a, v, torch.tensor(-3)], {"key": (("dyn",),)})]
    lib = Library([c.operation for c in cases])
    for j, case in enumerate(cases):
        for nt in (1, 2):
            x = case.inputs[0].clone()
            out = x.view(case.operation.results[0].type.shape)
            assert lib.run(j, [x, *case.inputs[1:], out], workers=nt) == 0
            check(case, out)


def test_every_data_op_has_a_kernel():
    control = {Op.CONST, Op.IF, Op.LOOP, Op.CALL}
    assert set(KERNELS) == set(Op) - control
    assert set(KERNELS) == {c.op for c in ALL_CASES}


def _op(kind, inputs, **attrs) -> Operation:
    return Case(kind, inputs, attrs).operation


def test_supported_refuses_what_the_kernels_do_not_handle():
    half = torch.zeros(3, dtype=torch.float16)
    assert not supported(_op(Op.EXP, [half]))
    assert not supported(_op(Op.MATMUL, [torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(3, 2, dtype=torch.bfloat16)]))
    assert not supported(_op(Op.MATMUL, [torch.zeros(2, 3, dtype=I16), torch.zeros(3, 2, dtype=I16)]))
    assert not supported(_op(Op.CONV2D, [torch.zeros(1, 1, 3, 3, dtype=I64), torch.zeros(1, 1, 1, 1, dtype=I64)],
                             stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1))
    mask = Operation(Op.GATHER, [Value(TensorType((3, 2), F32)), Value(TensorType((3,), B))],
                     [Value(TensorType((3, 2), F32))], {"dim": 0})   # boolean masks: data-dependent shape
    assert not supported(mask)
    with pytest.raises(NotImplementedError):
        ctype(torch.complex64)
    assert supported(_op(Op.ADD, [torch.zeros(3), torch.zeros(3, dtype=I64)]))


# -- through the backend core ----------------------------------------------------------------

def _cpu_backend():
    import cocktailer
    if "cpu" not in cocktailer.BACKENDS:
        pytest.skip("the cpu backend is not registered yet")
    return cocktailer


def _programs():
    import torch.nn.functional as F
    g = gen(7)
    w = torch.randn(24, 16, 3, 3, generator=g)
    table = torch.randn(50, 8, generator=g)
    return [
        ("conv-small-images", lambda x: torch.relu(F.conv2d(x, w, None, 1, 1)), (torch.randn(3, 16, 7, 7, generator=g),)),
        ("conv-strided", lambda x: F.conv2d(x, w, None, 2, 1).mean((2, 3)), (torch.randn(2, 16, 12, 12, generator=g),)),
        ("linear-softmax", lambda x, m: torch.softmax(x @ m, -1).amax(-1), (torch.randn(5, 300, generator=g),
                                                                             torch.randn(300, 70, generator=g))),
        ("gemv", lambda x, m: torch.tanh(x @ m), (torch.randn(1, 256, generator=g), torch.randn(256, 1024, generator=g))),
        ("embedding", lambda i: F.embedding(i, table).sum(0), (torch.tensor([3, 1, 49, 0]),)),
        ("where-cast", lambda a, b: torch.where(a > b, a.long(), (b * 3).long()) // 2, (torch.randn(6, 9, generator=g),
                                                                                      torch.randn(9, generator=g))),
    ]


@pytest.mark.parametrize("name", [p[0] for p in _programs()])
def test_single_op_programs_through_the_cpu_backend(name):
    cocktailer = _cpu_backend()
    _, fn, inputs = next(p for p in _programs() if p[0] == name)
    compiled = cocktailer.compile(fn, inputs, backend="cpu")
    for _ in range(3):   # the same compiled program, again: no state left behind
        torch.testing.assert_close(compiled(*inputs), fn(*inputs), rtol=1e-5, atol=1e-5)


def test_runtime_index_error_through_the_cpu_backend():
    cocktailer = _cpu_backend()
    table = torch.randn(10, 4)
    compiled = cocktailer.compile(lambda i: table[i], (torch.tensor([1, 2]),), backend="cpu")
    torch.testing.assert_close(compiled(torch.tensor([9, -10])), table[torch.tensor([9, -10])])
    with pytest.raises(cocktailer.CompiledCallError, match="out of range"):
        compiled(torch.tensor([3, 10]))
