"""Hoist loop-invariant projections: `x[t] @ W` in a loop over t, with x and W invariant,
becomes `(x @ W)[t]`, one GEMM over all steps before the loop.

This is what cuDNN does with an RNN's input projection. Inside the loop a batch-1 RNN reads
its input weights once per step as a matrix-vector product, bound by memory; before the loop
the same work is one matrix-matrix product over the whole sequence, bound by compute, and
the loop keeps only its recurrent weights (half the bytes per step, which then stay in cache).

It applies when the loop runs every step of x (a trip count that is a constant equal to x's
leading size and no exit condition): otherwise the GEMM would compute rows nobody reads.
Where the trip count is x's symbolic length, so is the product's: the memory plan sizes it at
call time and the GEMM takes its rows as a run-time size.
"""
from __future__ import annotations

from cocktailer.ir import Op, Operation, Program, TensorType, Value
from cocktailer.ir.analysis import known_trip_counts


def hoist_invariant_matmuls(program: Program) -> Program:
    for fn in program.functions.values():
        trips = known_trip_counts(fn)
        for region in list(fn.body.regions()):
            ops: list[Operation] = []
            for op in region.ops:
                if op.op is Op.LOOP:
                    ops += _hoist_from(op, trips)
                ops.append(op)
            region.ops = ops
    return program


def _hoist_from(loop: Operation, trips: dict[int, object]) -> list[Operation]:
    """Rewrite `loop`'s body in place; return the ops to put before the loop."""
    body = loop.loop_body
    if loop.loop_cond is not None or loop.loop_trip is None or loop.loop_trip.id not in trips:
        return []
    trip, counter = trips[loop.loop_trip.id], body.params[0]
    inside = _defined_inside(loop)
    defs = {r.id: op for op in body.ops for r in op.results}
    before: list[Operation] = []
    for op in list(body.ops):
        if op.op is not Op.MATMUL or len(op.operands[1].type.shape) > 2:
            continue
        step, weight = op.operands
        select = defs.get(step.id)
        if not _is_step_of_invariant(select, counter, inside, trip):
            continue
        weight_def = defs.get(weight.id)
        if weight.id in inside and (weight_def is None or weight_def.op is not Op.CONST):
            continue
        if weight_def is not None and weight_def in body.ops:   # a constant: move it out with the product
            body.ops.remove(weight_def)
            before.append(weight_def)
        source = select.operands[0]
        out = op.results[0].type
        product = Value(TensorType((source.type.shape[0], *out.shape), out.dtype), hint="hoisted")
        before.append(Operation(Op.MATMUL, [source, weight], [product], loc=op.loc))
        body.ops[body.ops.index(op)] = Operation(Op.SELECT, [product, counter], op.results,
                                                 {"key": select.attrs["key"]}, loc=op.loc)
    return before


def _is_step_of_invariant(select: Operation | None, counter: Value, inside: set[int], trip) -> bool:
    """`x[t]`: a select of the leading dim of a loop-invariant x by the loop counter, over
    every row (the trip count is x's leading size), leaving at least a row vector."""
    if select is None or select.op is not Op.SELECT or select.attrs.get("key") != (("dyn",),):
        return False
    source, index = select.operands[0], select.operands[1]
    return index.id == counter.id and source.id not in inside and source.type.shape[:1] == (trip,) \
        and len(source.type.shape) >= 2


def _defined_inside(loop: Operation) -> set[int]:
    ids: set[int] = set()
    for region in loop.regions:
        for r in region.regions():
            ids.update(p.id for p in r.params)
            ids.update(v.id for op in r.ops for v in op.results)
    return ids
