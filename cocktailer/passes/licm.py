"""Loop-invariant code motion: an op in a loop's body whose operands all come from outside the
loop computes the same value every iteration; it moves before the loop and runs once.

The case that matters is a nested recurrence: NestedRNN's inner loop projects the outer step's
input (`W @ x[i] + b`, i the outer counter) at every inner step, so half its products are
repeats. Moved out, the inner loop keeps only its recurrent product.

The IR is functional (in-place writes were made new values at capture), so an op reading only
values defined outside the loop reads the same values every iteration. What moves:
- only ops at the top of a loop's body (not inside a branch of it), innermost loops first, so
  an op can move out of several loops in turn;
- only ops that cannot raise: a moved op runs even where the loop runs no iteration, and an
  error there would be one eager never raises. Elementwise ops (but integer division and
  remainder, which raise on zero, and integer powers, which raise on a negative exponent), products, reshapes, permutes, expands, casts, concatenations,
  sums and softmaxes, constants, and selects by slices, by in-range numbers, or by the counter
  of an enclosing loop that counts up to that dim's size (`x[i]` in `for i in range(len(x))`).
"""
from __future__ import annotations

from cocktailer.ir import ELEMENTWISE, Op, Operation, Program, Region
from cocktailer.ir.analysis import defined_inside, known_trip_counts
from cocktailer.ir.types import Sym

_SAFE = {Op.MATMUL, Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.CAT, Op.CAST, Op.CONST, Op.SCALAR,
         Op.SUM, Op.MEAN, Op.PROD, Op.ANY, Op.ALL, Op.SOFTMAX, Op.LOG_SOFTMAX}
_RAISE_ON_INTEGERS = {Op.DIV, Op.FLOORDIV, Op.MOD, Op.POW}   # (division by zero; a negative power)


def hoist_loop_invariants(program: Program) -> Program:
    for fn in program.functions.values():
        _hoist_in(fn.body, known_trip_counts(fn), {})
    return program


def _hoist_in(region: Region, trips: dict, in_range: dict):
    """Hoist out of every loop in `region` (at any depth). `in_range`: counter id -> the size
    (a number or a Sym) the enclosing loop counts up to: an index into any dim of that size."""
    ops: list[Operation] = []
    for op in region.ops:
        if op.op is Op.LOOP:
            inner = {**in_range, **_counted(op, trips)}
            for r in op.regions:
                _hoist_in(r, trips, inner)
            ops += _invariants(op, inner)
        else:
            for r in op.regions:
                _hoist_in(r, trips, in_range)
        ops.append(op)
    region.ops = ops


def _counted(loop: Operation, trips: dict) -> dict:
    """{counter id: n} where the loop runs n times, n known before it runs (a number, or a size
    read with `len(x)`), with no exit condition: its counter is always a valid index into a dim
    of size n."""
    if loop.loop_cond is not None or loop.loop_trip is None or loop.loop_trip.id not in trips:
        return {}
    return {loop.loop_body.params[0].id: trips[loop.loop_trip.id]}


def _invariants(loop: Operation, in_range: dict) -> list[Operation]:
    """Take the invariant ops off the top of `loop`'s body; return them, in order."""
    body = loop.loop_body
    inside = defined_inside(loop)
    moved, kept = [], []
    for op in body.ops:
        if not op.regions and _cannot_raise(op, in_range) and not any(v.id in inside for v in op.operands):
            moved.append(op)
            inside -= {r.id for r in op.results}
        else:
            kept.append(op)
    body.ops = kept
    return moved


def _cannot_raise(op: Operation, in_range: dict) -> bool:
    if op.op in ELEMENTWISE:
        return not (op.op in _RAISE_ON_INTEGERS and not op.results[0].type.dtype.is_floating_point)
    if op.op in _SAFE:
        return True
    if op.op is Op.SELECT:
        return _select_in_range(op, in_range)
    return False


def _select_in_range(op: Operation, in_range: dict) -> bool:
    """Slices never raise; a number does not where the dim is a number it fits; a dynamic index
    does not where it is the counter of a loop over that very dim."""
    shape = op.operands[0].type.shape
    dynamic = iter(op.operands[1:])
    dim = 0
    for item in op.attrs["key"]:
        kind = item[0]
        if kind == "new":
            continue
        if kind == "int":
            size = shape[dim]
            if isinstance(size, Sym) or not -size <= item[1] < size:
                return False
        elif kind in ("lanes", "lane"):   # (a batched program's: never hoisted)
            return False
        elif kind == "dyn":
            counted = in_range.get(next(dynamic).id)   # (a Sym equals only a Sym of its name, never a number)
            if counted is None or counted != shape[dim]:
                return False
        dim += 1
    return True

