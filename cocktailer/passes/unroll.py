"""Loop unroll: a loop with a trip count runs `factor` copies of its body per iteration.

    loop trip=n carry(x) { ^(i, c): body(i, c) }
becomes
    m = max(n, 0) // k
    loop trip=m carry(x) { ^(j, c): c = body(k*j, c); c = body(k*j + 1, c); ... k copies }
    loop trip=max(n, 0) - m*k carry(...) { ^(j, c): body(m*k + j, c) }      (the 0..k-1 left)

Consecutive steps become straight-line code (no carried-value copies or loop-control
barriers between them, and the schedule sees k steps' operations at once); the second loop
keeps every trip count's meaning, 0 and 1 included. Applied to innermost loops with a trip
count, no exit condition and no stacked outputs.
"""
from __future__ import annotations

import torch

from cocktailer.ir import INDEX, Op, Operation, Program, Region, Value, clone_ops
from cocktailer.ir.analysis import unrollable


def unroll_loops(program: Program, factor: int) -> Program:
    if factor <= 1:
        return program
    for fn in program.functions.values():
        for region in list(fn.body.regions()):
            ops: list[Operation] = []
            for op in region.ops:
                ops += _unroll(op, factor) if unrollable(op) else [op]
            region.ops = ops
    return program


class _Emitter:
    """Index arithmetic on i64[] values, as IR operations."""

    def __init__(self):
        self.ops: list[Operation] = []

    def scalar(self, value: int) -> Value:
        return self._emit(Op.SCALAR, [], {"value": value, "dtype": torch.int64})

    def binary(self, kind: Op, a: Value, b: Value) -> Value:
        return self._emit(kind, [a, b], {})

    def _emit(self, kind: Op, operands: list[Value], attrs: dict) -> Value:
        out = Value(INDEX)
        self.ops.append(Operation(kind, operands, [out], attrs))
        return out


def _unroll(loop: Operation, k: int) -> list[Operation]:
    body = loop.loop_body
    before = _Emitter()
    steps = before.binary(Op.MAXIMUM, loop.loop_trip, before.scalar(0))   # a negative trip count runs nothing
    k_value = before.scalar(k)
    offsets = [before.scalar(c) for c in range(1, k)]
    rounds = before.binary(Op.FLOORDIV, steps, k_value)

    inside = _Emitter()
    j = Value(INDEX, hint="j")
    carried = [Value(p.type, p.hint) for p in body.params[1:]]
    first = inside.binary(Op.MUL, j, k_value)
    ops, state = [], carried
    for c in range(k):
        index = first if c == 0 else inside.binary(Op.ADD, first, offsets[c - 1])
        state, copy = _copy_body(body, index, state)
        ops += copy
    unrolled = Operation(Op.LOOP, [rounds, *loop.loop_inits], [Value(r.type, r.hint) for r in loop.results],
                         dict(loop.attrs), [Region([j, *carried], inside.ops + ops, state)], loop.loc)

    after = _Emitter()
    done = after.binary(Op.MUL, rounds, k_value)
    left = after.binary(Op.SUB, steps, done)
    rest_index = _Emitter()
    j2 = Value(INDEX, hint="j")
    carried2 = [Value(p.type, p.hint) for p in body.params[1:]]
    index = rest_index.binary(Op.ADD, done, j2)
    state, copy = _copy_body(body, index, carried2)
    rest = Operation(Op.LOOP, [left, *unrolled.results], loop.results, dict(loop.attrs),
                     [Region([j2, *carried2], rest_index.ops + copy, state)], loop.loc)
    return before.ops + [unrolled] + after.ops + [rest]


def _copy_body(body: Region, index: Value, carried: list[Value]) -> tuple[list[Value], list[Operation]]:
    """The body's ops for step `index` from `carried`, and what that step yields."""
    rename = {body.params[0].id: index, **{p.id: v for p, v in zip(body.params[1:], carried)}}
    ops = clone_ops(body.ops, rename)
    return [rename.get(y.id, y) for y in body.yields], ops
