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
    if op is Op.FULL and syms_in(tuple(attrs["shape"])):   # `torch.zeros(seq_len, h)`: sized at call time
        hinted = TensorType(tuple(attrs["shape"]), attrs["dtype"]).hinted
        infer_type(op, [], {**attrs, "shape": hinted.shape})   # checks the rest as torch would
        return TensorType(tuple(attrs["shape"]), attrs["dtype"])
    key = _memo_key(op, operand_types, attrs)
    if key is None and (syms := syms_in(tuple(attrs.values()))):   # a shape attribute of a symbolic size
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
    """The result type of an op that reads a tensor of a symbolic size.

    - DIM: the size itself (an i64[] read at run time, a loop's trip count);
    - the ops in _POLYMORPHIC (SELECT and UPDATE after checking that they slice no part of a
      symbolic dim: `x[t]` of a sequence, `inp[node]` of a tree's node table and `x[:, 0]`
      are fine) are inferred twice: with every size at its captured value (which checks
      the operands as torch would), and with every size at another value of its own. Each
      result dim is then a number (the same both times), or one of the sizes (its value both
      times); a dim that is neither (`s - 1`, `2 * s`: a reshape, a slice) needs the sizes
      as numbers, and so do operands whose sizes must be equal (two symbolic sizes added:
      they may differ between calls). A reshape's or expand's `shape` may name the operand's
      sizes (_SHAPED): each is then put in at both values too;
    - any other op needs the sizes as numbers: its attributes may hold sizes computed from
      the captured values (a constant index tensor, a pooling window)."""
    syms = tuple(dict.fromkeys(s for t in operand_types for s in t.syms))
    if op is Op.DIM:
        return TensorType((), torch.int64)
    if op not in _POLYMORPHIC:
        raise SymbolicSizeError(syms, op.name.lower())
    if op in (Op.SELECT, Op.UPDATE):
        _check_key(op, operand_types, attrs)
    in_attrs = syms_in(tuple(attrs.values()))
    if in_attrs and (op not in _SHAPED or not set(in_attrs) <= set(syms)):
        raise SymbolicSizeError(in_attrs, f"{op.name.lower()}'s attributes")
    captured = infer_type(op, [t.hinted for t in operand_types], attrs_at(attrs, {s: s.hint for s in syms}))
    shape = _shape_from_probe(op, operand_types, attrs, captured, syms)
    if shape is None:   # blame the sizes that fail on their own (a matmul's K, not its M)
        culprits = tuple(s for s in syms if _shape_from_probe(op, operand_types, attrs, captured, (s,)) is None)
        raise SymbolicSizeError(culprits or syms, f"{op.name.lower()} (its result's size is not one of its operands', "
                                                  "or its operands' sizes must agree)")
    return TensorType(shape, captured.dtype)


def _shape_from_probe(op: Op, operand_types, attrs, captured: TensorType, syms: tuple) -> tuple | None:
    """The result's shape with `syms` symbolic (the others at their captured values), or None."""
    probes = probe_values(syms, operand_types)
    try:
        probed = infer_type(op, [_at(t, probes).hinted for t in operand_types],
                            attrs_at(attrs, probes))
    except Exception:
        return None
    if probed.rank != captured.rank or probed.dtype != captured.dtype:
        return None
    by_values = {(s.hint, probes[s]): s for s in syms}
    shape = []
    for a, b in zip(captured.shape, probed.shape):
        if a == b:
            shape.append(a)
        elif (a, b) in by_values:
            shape.append(by_values[(a, b)])
        else:
            return None
    return tuple(shape)


def _check_key(op: Op, operand_types: Sequence[TensorType], attrs: dict):
    """A select (an update) may index a dim of a symbolic size (by a number or at run time:
    the kernel wraps and checks the index for the call's size) or take all of it; a slice of
    part of it would have a size that depends on it (`x[1:]`) or would be assumed to fit in it
    (`x[:3]`)."""
    indices = operand_types[1 if op is Op.SELECT else 2:]
    if any(t.syms for t in indices):
        raise SymbolicSizeError(tuple(s for t in indices for s in t.syms), "an index")
    shape, dim = operand_types[0].shape, 0
    for item in attrs["key"]:
        if item[0] == "slice" and isinstance(shape[dim], Sym) and not takes_whole(item):
            raise SymbolicSizeError(shape[dim], "a slice of part of a dim")
        dim += item[0] != "new"


# Ops whose result's sizes are its operands' (or numbers) for every size: what type inference
# takes symbolic sizes through.
_POLYMORPHIC = ELEMENTWISE | REDUCE | {Op.MATMUL, Op.SOFTMAX, Op.LOG_SOFTMAX, Op.CAST, Op.SELECT, Op.UPDATE, Op.CAT,
                                      Op.PERMUTE, Op.GATHER, Op.SCATTER, Op.RESHAPE, Op.EXPAND}
# Of those, the ops whose `shape` attribute may name an operand's symbolic size as a whole dim
# (`x.view(x.shape[0], 1, -1)`, `x.unsqueeze(1)`): inferred with it at each value, like the
# operands' (a reshape that keeps the element count at both values keeps it at every value).
_SHAPED = {Op.RESHAPE, Op.EXPAND}
_WHOLE = {(None, None, None), (0, None, None), (None, None, 1), (0, None, 1)}


def takes_whole(item: tuple) -> bool:
    """Whether a ("slice", start, stop, step) key item takes all of a dim, whatever its size."""
    return item[1:] in _WHOLE


def probe_values(syms: tuple, operand_types: Sequence[TensorType]) -> dict:
    """A value per size, other than its captured one and than every number among the
    operands' dims, and 1 more than a multiple of a large prime: no sum or product of a few
    of them is another's, so a result dim that has one came from that size."""
    taken = {d for t in operand_types for d in t.shape if not isinstance(d, Sym)} | {s.hint for s in syms}
    values, k = {}, 1
    for s in syms:
        while _PROBE * k + 1 in taken:
            k += 1
        values[s] = _PROBE * k + 1
        k += 1
    return values


_PROBE = 10007


def _at(ty: TensorType, values: dict) -> TensorType:
    return TensorType(tuple(values.get(d, d) for d in ty.shape), ty.dtype) if ty.syms else ty


def hinted_attrs(attrs: dict) -> dict:
    """A shaped op's attributes with its symbolic sizes at their captured values (for meta tensors)."""
    return attrs_at(attrs, {})


def attrs_at(attrs: dict, values: dict) -> dict:
    """A shaped op's attributes with its symbolic sizes at these values (a call's: Sym -> int),
    else at their captured ones; the same dict where it names none."""
    if "shape" not in attrs or not syms_in(tuple(attrs["shape"])):
        return attrs
    return {**attrs, "shape": tuple(values.get(d, d.hint) if isinstance(d, Sym) else d for d in attrs["shape"])}


def _memo_key(op: Op, operand_types: Sequence[TensorType], attrs: dict[str, Any]) -> tuple | None:
    """A key by value. None where an attribute is not a plain value (an object equal by
    identity, whose id a later object may reuse): not remembered."""
    try:
        return op, tuple(operand_types), tuple((k, _frozen(v)) for k, v in attrs.items())
    except _NotPlain:
        return None


def syms_in(values: tuple) -> tuple:
    """The Syms in `values`, nested tuples and lists included, each once, in order."""
    return tuple(dict.fromkeys(s for v in values for s in ((v,) if isinstance(v, Sym) else
                                                          syms_in(tuple(v)) if type(v) in (tuple, list) else ())))


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
