"""Shape and dtype inference: run an op's reference semantics on meta tensors.

Elementwise ops, reductions and CAT take a shortcut: the op runs on one-element CPU tensors
of the operands' dtypes and ranks (which decide its dtype, and check its dims), and the shape
follows from the operands' (broadcast; the kept dims; the sum along the cat dim). torch's
meta kernels for these ops are Python functions that import torch._dynamo on first use: more
than a second of every process's first compile."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from cocktailer.ir.ops import CREATION, ELEMENTWISE, REDUCE, SEMANTICS, Op
from cocktailer.ir.types import Sym, SymbolicSizeError, TensorType


def infer_type(op: Op, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    """The result type of a data op (not CONST or control flow). Raises whatever torch
    raises for invalid operands (mismatched shapes, bad dims, ...). Remembered: a model
    repeats the same ops on the same types (skipnet: 2,400 ops, ~130 different)."""
    if any(t.syms for t in operand_types):
        return _infer_symbolic(op, operand_types, attrs)
    key = _memo_key(op, operand_types, attrs)
    if key is None and (syms := _syms_in(tuple(attrs.values()))):   # a shape attribute of a symbolic size
        raise SymbolicSizeError(syms, f"{op.name.lower()}'s attributes")
    known = _INFERRED.get(key) if key is not None else None
    if known is None:
        known = _infer(op, operand_types, attrs)
        if key is not None:
            if len(_INFERRED) >= _MEMO_SIZE:
                _INFERRED.clear()
            _INFERRED[key] = known
    return known


_INFERRED: dict[tuple, TensorType] = {}
_MEMO_SIZE = 8192


def _infer_symbolic(op: Op, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    """The result type of an op that reads a tensor of a symbolic size. Supported: reading
    an element or a row at a run-time index of a symbolic dim (`inp[node]` of a tree's node
    table, `x[t]` of a sequence), the case a tree's node count or a sequence's length is; the
    result is then as static as it is for every size; and the size itself (DIM), which a loop
    takes as its trip count. Anything else needs the size as a number."""
    syms = tuple(dict.fromkeys(s for t in operand_types for s in t.syms))
    if op is Op.DIM:   # the size itself, read at run time
        return TensorType((), torch.int64)
    if op is not Op.SELECT or operand_types[1:] and any(t.syms for t in operand_types[1:]):
        raise SymbolicSizeError(syms, f"{op.name.lower()}")
    dim, consumed = 0, set()
    for item in attrs["key"]:
        if item[0] == "dyn":
            consumed.add(dim)
        dim += item[0] != "new"
    kept = tuple(d for k, d in enumerate(operand_types[0].shape) if isinstance(d, Sym) and k not in consumed)
    if kept:
        raise SymbolicSizeError(kept, "a select that keeps or slices that dim")
    return infer_type(op, [t.hinted for t in operand_types], attrs)


def _memo_key(op: Op, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> tuple | None:
    """A key by value. None where an attribute is not a plain value (an object equal by
    identity, whose id a later object may reuse): not remembered."""
    try:
        return op, tuple(operand_types), tuple((k, _frozen(v)) for k, v in attrs.items())
    except _NotPlain:
        return None


def _syms_in(values: tuple) -> tuple:
    return tuple(dict.fromkeys(s for v in values for s in ((v,) if isinstance(v, Sym) else
                                                          _syms_in(tuple(v)) if type(v) in (tuple, list) else ())))


class _NotPlain(Exception):
    pass


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format)


def _frozen(v):
    """v with its type at every level: 1, 1.0 and True are equal but may give other dtypes."""
    if isinstance(v, _PLAIN):
        return type(v), v
    if type(v) in (tuple, list):
        return type(v), tuple(_frozen(x) for x in v)
    raise _NotPlain


def _infer(op: Op, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> TensorType:
    shortcut = _SHORTCUTS.get(op) if all(0 not in t.shape for t in operand_types) else None
    if shortcut is not None:
        try:
            standins = [torch.ones((1,) * len(t.shape), dtype=t.dtype) for t in operand_types]   # 1: no x / 0
            out = SEMANTICS[op](*standins, **attrs)   # first: torch checks the dims and dtypes
            return TensorType(shortcut([t.shape for t in operand_types], attrs, tuple(out.shape)), out.dtype)
        except Exception:   # torch's own meta kernel says what is wrong (and whether it is)
            pass
    extra = {"device": "meta"} if op in CREATION else {}
    out = SEMANTICS[op](*(t.meta() for t in operand_types), **attrs, **extra)
    return TensorType.of(out)


def _reduced(shapes: list[tuple[int, ...]], attrs: dict, standin: tuple[int, ...]) -> tuple[int, ...]:
    """A reduction's shape (after the op ran on stand-ins of the same rank: its dims are valid)."""
    (shape,) = shapes
    dims = attrs.get("dims", attrs.get("dim"))
    if dims is None or dims == () or not shape:   # over all dims: a scalar or all ones, as on the stand-in
        return standin
    dims = {d % len(shape) for d in ((dims,) if isinstance(dims, int) else dims)}
    if attrs.get("keepdim"):
        return tuple(1 if i in dims else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in dims)


def _concatenated(shapes: list[tuple[int, ...]], attrs: dict, standin: tuple[int, ...]) -> tuple[int, ...]:
    dim = attrs["dim"] % len(shapes[0])
    for k, shape in enumerate(shapes):
        for i, (a, b) in enumerate(zip(shape, shapes[0])):
            if i != dim and a != b:
                raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}. Expected size {b} but "
                                   f"got size {a} for tensor number {k} in the list.")
    return tuple(sum(s[dim] for s in shapes) if i == dim else n for i, n in enumerate(shapes[0]))


def broadcast_shape(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """torch's broadcasting: shapes aligned at the right, each dim equal or 1."""
    out: list[int] = []
    for shape in shapes:
        pad = len(shape) - len(out)
        out = [1] * pad + out if pad > 0 else out
        for i, d in enumerate(shape, len(out) - len(shape)):
            if out[i] != d and d != 1 and out[i] != 1:
                raise RuntimeError(f"The size of tensor a ({out[i]}) must match the size of tensor b ({d}) at "
                                   f"non-singleton dimension {i}")
            out[i] = d if out[i] == 1 else out[i]
    return tuple(out)


_SHORTCUTS = {**{op: lambda shapes, attrs, standin: broadcast_shape(shapes) for op in ELEMENTWISE},
              **{op: _reduced for op in REDUCE}, Op.CAT: _concatenated}
