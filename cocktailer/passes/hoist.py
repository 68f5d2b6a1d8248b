"""Hoist loop-invariant projections: `x[t] @ W` in a loop over t, with x and W invariant,
becomes `(x @ W)[t]`, one GEMM over all steps before the loop (also where the row is read at
another step's index, `x[-1 - t]`, or as a (1, K) matrix, as `nn.Linear` of a step's vector).

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
from cocktailer.ir.analysis import defined_inside, known_trip_counts


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
    trip = trips[loop.loop_trip.id]
    inside = defined_inside(loop)
    defs = {r.id: op for op in body.ops for r in op.results}
    before: list[Operation] = []
    for op in list(body.ops):
        if op.op is not Op.MATMUL or len(op.operands[1].type.shape) > 2:
            continue
        step, weight = op.operands
        unit = _unit_rows(defs.get(step.id))   # x[t] reshaped to (1, K): a row of x as a matrix
        select = defs.get(defs[step.id].operands[0].id if unit else step.id)
        if not _is_step_of_invariant(select, inside, trip):
            continue
        weight_def = defs.get(weight.id)
        if weight.id in inside and (weight_def is None or weight_def.op is not Op.CONST):
            continue
        if weight_def is not None and weight_def in body.ops:   # a constant: move it out with the product
            body.ops.remove(weight_def)
            before.append(weight_def)
        source = select.operands[0]
        out = op.results[0].type
        row = out.shape[len(unit or ()):]   # one step's row of the product
        product = Value(TensorType((source.type.shape[0], *row), out.dtype), hint="hoisted")
        before.append(Operation(Op.MATMUL, [source, weight], [product], loc=op.loc))
        taken = [Operation(Op.SELECT, [product, select.operands[1]], [Value(TensorType(row, out.dtype))],
                           {"key": select.attrs["key"]}, loc=op.loc)]
        if unit:
            taken.append(Operation(Op.RESHAPE, taken[0].results, op.results, {"shape": out.shape}, loc=op.loc))
        else:
            taken[0].results = op.results
        at = body.ops.index(op)
        body.ops[at:at + 1] = taken
    return before


def _unit_rows(op: Operation | None) -> tuple | None:
    """The leading unit dims a RESHAPE of a vector to (1, ..., 1, K) adds (a row as a matrix,
    which `linear` makes of a step's vector), else None."""
    if op is None or op.op is not Op.RESHAPE or op.operands[0].type.rank != 1:
        return None
    shape = tuple(op.attrs["shape"])
    lead = shape[:-1]
    return lead if lead and all(d == 1 for d in lead) and shape[-1:] == op.operands[0].type.shape else None


def _is_step_of_invariant(select: Operation | None, inside: set[int], trip) -> bool:
    """`x[i]`: a select of the leading dim of a loop-invariant x, leaving at least a row
    vector, in a loop of as many steps as x has rows: the product over all of x's rows is no
    more work than the loop's products over the rows it reads (the index may be any step's
    value, `x[-1 - t]` of a backward RNN as well as `x[t]`)."""
    if select is None or select.op is not Op.SELECT or select.attrs.get("key") != (("dyn",),):
        return False
    source = select.operands[0]
    return source.id not in inside and source.type.shape[:1] == (trip,) and len(source.type.shape) >= 2
