"""The IR's operations and their executable meaning.

Every data op has a reference implementation in torch: `SEMANTICS[op](*operands, **attrs)`.
It is the definition of the op (the reference executor runs it, shape inference runs it
on meta tensors), so a backend is correct when it agrees with it. Control-flow ops (IF,
LOOP, CALL) own regions; their meaning is written in their docstrings here and executed
by `cocktailer.reference`.
"""
from __future__ import annotations

import enum
from typing import Callable

import torch
import torch.nn.functional as F


class Op(enum.Enum):
    # -- sources ------------------------------------------------------------------
    CONST = enum.auto()       # name: program.constants[name] (a parameter, buffer or captured tensor)
    SCALAR = enum.auto()      # value, dtype: torch.tensor(value, dtype=dtype)
    FULL = enum.auto()        # shape, value, dtype: torch.full(shape, value, dtype=dtype)
    ARANGE = enum.auto()      # start, end, step, dtype: torch.arange(start, end, step, dtype=dtype)
    # -- elementwise, one operand -------------------------------------------------
    NEG = enum.auto(); ABS = enum.auto(); EXP = enum.auto(); LOG = enum.auto()
    SQRT = enum.auto(); RSQRT = enum.auto(); RECIPROCAL = enum.auto()
    TANH = enum.auto(); SIGMOID = enum.auto(); RELU = enum.auto(); GELU = enum.auto(); SILU = enum.auto()
    SIN = enum.auto(); COS = enum.auto(); ERF = enum.auto(); FLOOR = enum.auto(); CEIL = enum.auto()
    NOT = enum.auto()         # logical not of a bool tensor
    CAST = enum.auto()        # dtype: x.to(dtype)
    # -- elementwise, two or three operands (torch broadcasting and type promotion) --
    ADD = enum.auto(); SUB = enum.auto(); MUL = enum.auto(); DIV = enum.auto()
    FLOORDIV = enum.auto(); MOD = enum.auto(); POW = enum.auto()
    MAXIMUM = enum.auto(); MINIMUM = enum.auto()
    EQ = enum.auto(); NE = enum.auto(); LT = enum.auto(); LE = enum.auto(); GT = enum.auto(); GE = enum.auto()
    AND = enum.auto(); OR = enum.auto(); XOR = enum.auto()
    WHERE = enum.auto()       # torch.where(cond, a, b)
    # -- reductions ---------------------------------------------------------------
    SUM = enum.auto(); MEAN = enum.auto(); PROD = enum.auto()   # dims (None: all), keepdim
    AMAX = enum.auto(); AMIN = enum.auto(); ANY = enum.auto(); ALL = enum.auto()
    ARGMAX = enum.auto(); ARGMIN = enum.auto()                  # dim (None: flattened), keepdim
    SOFTMAX = enum.auto(); LOG_SOFTMAX = enum.auto()            # dim
    # -- contractions and windows -------------------------------------------------
    MATMUL = enum.auto()      # torch.matmul(a, b)
    CONV2D = enum.auto()      # stride, padding, dilation, groups: F.conv2d(x, w, b?)
    MAX_POOL2D = enum.auto()  # kernel, stride, padding, dilation, ceil_mode
    AVG_POOL2D = enum.auto()  # kernel, stride, padding, ceil_mode, count_include_pad
    # -- data movement ------------------------------------------------------------
    RESHAPE = enum.auto()     # shape: x.reshape(shape)
    PERMUTE = enum.auto()     # dims: x.permute(dims)
    EXPAND = enum.auto()      # shape: x.expand(shape)
    CAT = enum.auto()         # dim: torch.cat(operands, dim)
    SELECT = enum.auto()      # key: x[key], basic indexing; dynamic indices are operands 1..
    UPDATE = enum.auto()      # key: y = x.clone(); y[key] = v; operands (x, v, *dynamic indices)
    GATHER = enum.auto()      # dim: x indexed along dim by an integer tensor of any shape
    SCATTER = enum.auto()     # dim: y = x.clone(); y.index_copy_(dim, index, v): GATHER's inverse, operands (x, index, v)
    DIM = enum.auto()         # dim: x.shape[dim] as an i64[] (a symbolic size, read when the program runs)
    # -- made by the native stages only, never captured ---------------------------
    FUSED = enum.auto()       # steps: elementwise ops over the operands and earlier steps, one loop (passes/fuse.py)
    # -- control flow (regions; executed by cocktailer.reference) -----------------
    IF = enum.auto()
    LOOP = enum.auto()
    CALL = enum.auto()


UNARY = frozenset({Op.NEG, Op.ABS, Op.EXP, Op.LOG, Op.SQRT, Op.RSQRT, Op.RECIPROCAL, Op.TANH,
                   Op.SIGMOID, Op.RELU, Op.GELU, Op.SILU, Op.SIN, Op.COS, Op.ERF, Op.FLOOR,
                   Op.CEIL, Op.NOT, Op.CAST})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.FLOORDIV, Op.MOD, Op.POW, Op.MAXIMUM,
                    Op.MINIMUM, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE, Op.AND, Op.OR, Op.XOR})
ELEMENTWISE = UNARY | BINARY | {Op.WHERE}
REDUCE = frozenset({Op.SUM, Op.MEAN, Op.PROD, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL, Op.ARGMAX, Op.ARGMIN})
CREATION = frozenset({Op.SCALAR, Op.FULL, Op.ARANGE})   # need the program's device
CONTROL = frozenset({Op.IF, Op.LOOP, Op.CALL})
VIEWS = frozenset({Op.SELECT, Op.RESHAPE, Op.PERMUTE, Op.EXPAND})   # results share their operand's memory in eager

# Number of operands, where fixed (None: variadic or checked elsewhere).
ARITY: dict[Op, int | None] = {
    **{op: 1 for op in UNARY}, **{op: 2 for op in BINARY}, Op.WHERE: 3,
    **{op: 1 for op in REDUCE}, Op.SOFTMAX: 1, Op.LOG_SOFTMAX: 1,
    Op.CONST: 0, Op.SCALAR: 0, Op.FULL: 0, Op.ARANGE: 0, Op.MATMUL: 2, Op.CONV2D: None,
    Op.MAX_POOL2D: 1, Op.AVG_POOL2D: 1, Op.RESHAPE: 1, Op.PERMUTE: 1, Op.EXPAND: 1,
    Op.CAT: None, Op.SELECT: None, Op.UPDATE: None, Op.GATHER: 2, Op.SCATTER: 3, Op.DIM: 1,
    Op.IF: None, Op.LOOP: None, Op.CALL: None, Op.FUSED: None,
}

_UNARY_FN: dict[Op, Callable] = {
    Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp, Op.LOG: torch.log,
    Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt, Op.RECIPROCAL: torch.reciprocal,
    Op.TANH: torch.tanh, Op.SIGMOID: torch.sigmoid, Op.RELU: torch.relu, Op.GELU: F.gelu,
    Op.SILU: F.silu, Op.SIN: torch.sin, Op.COS: torch.cos, Op.ERF: torch.erf,
    Op.FLOOR: torch.floor, Op.CEIL: torch.ceil, Op.NOT: torch.logical_not,
}
_BINARY_FN: dict[Op, Callable] = {
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div,
    Op.FLOORDIV: torch.floor_divide, Op.MOD: torch.remainder, Op.POW: torch.pow,
    Op.MAXIMUM: torch.maximum, Op.MINIMUM: torch.minimum,
    Op.EQ: torch.eq, Op.NE: torch.ne, Op.LT: torch.lt, Op.LE: torch.le, Op.GT: torch.gt, Op.GE: torch.ge,
    Op.AND: torch.logical_and, Op.OR: torch.logical_or, Op.XOR: torch.logical_xor,
}


def build_key(key: tuple, dynamic: tuple[torch.Tensor, ...]) -> tuple:
    """Turn a SELECT/UPDATE key into a torch index. Items: ("slice", start, stop, step),
    ("int", i), ("dyn",) for the next dynamic 0-d index operand, ("new",) for None. A batched
    program's key over lanes starts with ("lanes",), the lanes' dim, and may hold ("lane",) for
    the next dynamic operand of one index per lane: lane l's tensor is indexed by its own entry
    (`x[l][..., idx[l], ...]` for every l, as advanced indexing with the lanes' positions puts
    it)."""
    it = iter(dynamic)
    out = []
    lanes = [d for d, item in zip(dynamic, [i for i in key if i[0] in ("dyn", "lane")]) if item[0] == "lane"]
    if key and key[0][0] == "lanes":
        key = key[1:]
        out.append(slice(None) if not lanes else
                   torch.arange(lanes[0].shape[0], device=lanes[0].device) if not lanes[0].is_meta else
                   torch.empty(lanes[0].shape[0], dtype=torch.int64, device="meta"))
    for item in key:
        kind = item[0]
        if kind == "slice":
            out.append(slice(*item[1:]))
        elif kind == "int":
            out.append(item[1])
        elif kind == "dyn":   # on meta tensors (shape inference) any in-range index will do
            d = next(it)
            out.append(0 if isinstance(d, torch.Tensor) and d.is_meta else d)   # (or a Python int: `Boundary.numbers`)
        elif kind == "lane":
            out.append(next(it))
        elif kind == "new":
            out.append(None)
        else:
            raise ValueError(f"bad index item {item!r}")
    return tuple(out)


def _meta_safe(x, key):
    """Shape inference of a dynamic index into an empty dim (the body of a loop that runs
    zero times): pretend the dim has one element; the result's shape is the same."""
    if not x.is_meta:
        return x
    shape, dim = list(x.shape), 0
    for item in key:
        if item[0] == "dyn" and shape[dim] == 0:
            shape[dim] = 1
        dim += item[0] != "new"
    return torch.empty(shape, dtype=x.dtype, device="meta")


def _select(x, *dynamic, key):
    return _meta_safe(x, key)[build_key(key, dynamic)]


def _update(x, v, *dynamic, key):
    if x.is_meta:
        return x.clone()
    y = x.clone()
    y[build_key(key, dynamic)] = v.to(y.dtype)   # (advanced indexing, a key over lanes, casts no dtype itself)
    return y


def _gather(x, idx, *, dim):
    if idx.dim() == 0:   # as a one-element index, then the dim dropped: a 0-d index tensor would call .item()
        return x[(slice(None),) * dim + (idx.reshape(1),)].squeeze(dim)
    return x[(slice(None),) * dim + (idx,)]


def _scatter(x, idx, v, *, dim):
    """y = x.clone(); y[(:,) * dim + (idx,)] = v: negative indices count from the end, as
    GATHER's; v has exactly the shape of the rows written and x's dtype."""
    expected = (*x.shape[:dim], *idx.shape, *x.shape[dim + 1:])
    if idx.dim() != 1 or tuple(v.shape) != expected or v.dtype != x.dtype:
        raise ValueError(f"scatter of {tuple(v.shape)} {v.dtype} rows at an index of shape {tuple(idx.shape)} into "
                         f"{tuple(x.shape)} {x.dtype} along dim {dim}: expected {idx.dim() == 1 and expected} {x.dtype}")
    if x.is_meta:
        return torch.empty_like(x)
    y = x.clone()
    y[(slice(None),) * dim + (idx,)] = v
    return y


def _reduce(fn):
    def impl(x, *, dims=None, keepdim=False):
        return fn(x) if dims is None else fn(x, dim=dims, keepdim=keepdim)
    return impl


def _arg_reduce(fn):
    def impl(x, *, dim=None, keepdim=False):
        return fn(x) if dim is None else fn(x, dim=dim, keepdim=keepdim)
    return impl


def _prod(x, *, dims=None, keepdim=False):
    if dims is None:
        return torch.prod(x)
    for d in sorted(dims, reverse=True):   # torch.prod reduces one dim at a time
        x = torch.prod(x, dim=d, keepdim=keepdim)
    return x


def _conv2d(x, w, b=None, *, stride, padding, dilation, groups):
    return F.conv2d(x, w, b, stride, padding, dilation, groups)


def _fused(*xs, steps):
    """Each step (op name, operand refs: an index into xs and then into the earlier steps'
    results, attrs as items, result type) in turn; the last one's result."""
    values = list(xs)
    for kind, refs, attrs, _ in steps:
        values.append(SEMANTICS[Op[kind]](*(values[r] for r in refs), **dict(attrs)))
    return values[-1]


SEMANTICS: dict[Op, Callable[..., torch.Tensor]] = {
    **{op: (lambda fn: lambda x: fn(x))(fn) for op, fn in _UNARY_FN.items()},
    **{op: (lambda fn: lambda a, b: fn(a, b))(fn) for op, fn in _BINARY_FN.items()},
    Op.CAST: lambda x, *, dtype: x.to(dtype),
    Op.WHERE: torch.where,
    Op.SCALAR: lambda *, value, dtype, device: torch.tensor(value, dtype=dtype, device=device),
    Op.FULL: lambda *, shape, value, dtype, device: torch.full(shape, value, dtype=dtype, device=device),
    Op.ARANGE: lambda *, start, end, step, dtype, device: torch.arange(start, end, step, dtype=dtype, device=device),
    Op.SUM: _reduce(torch.sum), Op.MEAN: _reduce(torch.mean), Op.PROD: _prod,
    Op.AMAX: lambda x, *, dims=None, keepdim=False: torch.amax(x, dim=dims if dims is not None else (), keepdim=keepdim),
    Op.AMIN: lambda x, *, dims=None, keepdim=False: torch.amin(x, dim=dims if dims is not None else (), keepdim=keepdim),
    Op.ANY: _reduce(torch.any), Op.ALL: _reduce(torch.all),
    Op.ARGMAX: _arg_reduce(torch.argmax), Op.ARGMIN: _arg_reduce(torch.argmin),
    Op.SOFTMAX: lambda x, *, dim: torch.softmax(x, dim),
    Op.LOG_SOFTMAX: lambda x, *, dim: torch.log_softmax(x, dim),
    Op.MATMUL: torch.matmul,
    Op.CONV2D: _conv2d,
    Op.MAX_POOL2D: lambda x, *, kernel, stride, padding, dilation, ceil_mode:
        F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode=ceil_mode),
    Op.AVG_POOL2D: lambda x, *, kernel, stride, padding, ceil_mode, count_include_pad:
        F.avg_pool2d(x, kernel, stride, padding, ceil_mode, count_include_pad),
    Op.RESHAPE: lambda x, *, shape: x.reshape(shape),
    Op.PERMUTE: lambda x, *, dims: x.permute(dims),
    Op.EXPAND: lambda x, *, shape: x.expand(shape),
    Op.CAT: lambda *xs, dim: torch.cat(xs, dim),
    Op.SELECT: _select,
    Op.UPDATE: _update,
    Op.GATHER: _gather,
    Op.SCATTER: _scatter,
    Op.DIM: lambda x, *, dim: torch.tensor(x.shape[dim], dtype=torch.int64, device=x.device),
    Op.FUSED: _fused,
}

CONTROL_DOCS = {
    Op.IF: """outs = if cond: then_region() else: else_region()   (cond: bool[]; both regions
        yield values of the op's result types; regions read enclosing values directly)""",
    Op.LOOP: """carried = inits; i = 0
        while (trip is None or i < trip) and (cond is None or cond(i, *carried)):
            carried = body(i, *carried); i += 1
        outs = carried   (operands: [trip_count: i64[]] if has_trip, then inits)
        With attrs["stacked"] = k (only with a trip count and no condition), the body's last
        k yields are per-iteration outputs instead: outs = carried + [stack of each over i]""",
    Op.CALL: """outs = program.functions[callee](*operands)   (recursion allowed)""",
}
