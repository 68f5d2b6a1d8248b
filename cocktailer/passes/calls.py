"""Gather independent calls, the first step of recursion unroll (Cocktailer §3.3, Figure 8).

A recursive model calls itself on each child (`l = f(left[n]); r = f(right[n])`); the calls do
not depend on each other, so the top levels of the recursion can run on different groups of
workers at once. This pass moves independent calls of one region next to each other (with
the ops the later call needs moved before the earlier one), and `independent_call_runs` finds
such runs; the scheduler turns each run into a fan-out. IR ops are pure (in-place writes were
made functional at capture), so any order that respects data dependences computes the same."""
from __future__ import annotations

from cocktailer.ir import Op, Operation, Program, Region


def gather_independent_calls(program: Program) -> Program:
    for fn in program.functions.values():
        for region in fn.body.regions():
            region.ops = _gather(region.ops)
    return program


def has_independent_calls(program: Program) -> bool:
    """Whether gathering would find a run of independent calls anywhere (nothing is moved)."""
    return any(independent_call_runs(Region(ops=_gather(region.ops)))
               for fn in program.functions.values() for region in fn.body.regions())


def independent_call_runs(region: Region) -> list[list[Operation]]:
    """Maximal runs of two or more adjacent calls of which none reads another's results."""
    runs: list[list[Operation]] = []
    run: list[Operation] = []
    for op in region.ops + [None]:
        if op is not None and op.op is Op.CALL and not _depends_on_any(op, run):
            run.append(op)
            continue
        if len(run) > 1:
            runs.append(run)
        run = [op] if op is not None and op.op is Op.CALL else []
    return runs


def _reads(op: Operation) -> set[int]:
    return {v.id for v in op.reads()}


def _depends_on_any(op: Operation, earlier: list[Operation]) -> bool:
    produced = {r.id for e in earlier for r in e.results}
    return bool(_reads(op) & produced)


def _gather(ops: list[Operation]) -> list[Operation]:
    ops = list(ops)
    i = 0
    while i < len(ops):
        if ops[i].op is Op.CALL:
            ops = _pull_next_call(ops, i)
        i += 1
    return ops


def _pull_next_call(ops: list[Operation], i: int) -> list[Operation]:
    """If a later call in `ops` does not depend on the call at `i` (nor on anything computed
    from it), move it to `i + 1` and the ops it needs from between the two before `i`."""
    tainted = {r.id for r in ops[i].results}
    for j in range(i + 1, len(ops)):
        op = ops[j]
        if _reads(op) & tainted:
            tainted.update(r.id for r in op.results)
            continue
        if op.op is not Op.CALL:
            continue
        needed, slice_ = _reads(op), []
        for k in range(j - 1, i, -1):
            if any(r.id in needed for r in ops[k].results):
                slice_.append(ops[k])
                needed |= _reads(ops[k])
        slice_.reverse()
        moved = {id(o) for o in slice_} | {id(op)}
        between = [o for o in ops[i + 1:j] if id(o) not in moved]
        return ops[:i] + slice_ + [ops[i], op] + between + ops[j + 1:]
    return ops
