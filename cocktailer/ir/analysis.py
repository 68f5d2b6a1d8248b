"""Analyses of a Program that several stages share (passes, placement, the measured policy's
search, the host backend): they read the IR and change nothing.

- where control flow may run: `nesting_depths`, `native_legal` (Constraint 1, Cocktailer §3.2);
- which ops may run at the same time: `independent_call_runs` (recursion unroll, Cocktailer
  Figure 8), `straight_line_runs` and `waves` (Rammer's wavefront, §3.3);
- what a rewrite would find: `gathered` (the order that puts independent calls side by side),
  `unrollable`.
IR ops are pure (in-place writes were made functional at capture), so any order of a region's
ops that respects data dependences computes the same.
"""
from __future__ import annotations

from typing import Callable

from cocktailer.ir.ops import CONTROL, Op
from cocktailer.ir.program import Function, Operation, Program, Region, Value
from cocktailer.ir.types import Sym

HasKernel = Callable[[Operation], bool]


def runs_in_python(op: Operation, has_kernel: HasKernel) -> bool:
    """A data op that no native kernel runs (control flow and constants are not data ops)."""
    return op.op not in CONTROL and op.op is not Op.CONST and not has_kernel(op)


# -- where control flow may run -------------------------------------------------------------

def nesting_depths(program: Program) -> dict[int, int]:
    """id(construct) -> how deep it is nested in its function (0: in the function's body)."""
    depths: dict[int, int] = {}

    def visit(region: Region, depth: int):
        for op in region.ops:
            if op.op in CONTROL:
                depths[id(op)] = depth
            for r in op.regions:
                visit(r, depth + 1)
    for fn in program.functions.values():
        visit(fn.body, 0)
    return depths


def native_legal(program: Program, has_kernel: HasKernel) -> set[int]:
    """Constraint 1: id(construct) for the constructs that may run at L1 (in native code):
    every data op they control runs natively, through nested regions and called functions."""
    def ops_ok(region: Region, fns_ok: dict[str, bool]) -> bool:
        return all(not runs_in_python(op, has_kernel) and (op.op is not Op.CALL or fns_ok[op.attrs["callee"]])
                   for op in region.walk())
    fns_ok = {name: True for name in program.functions}   # optimistic fixpoint over recursion
    changed = True
    while changed:
        changed = False
        for name, fn in program.functions.items():
            if fns_ok[name] and not ops_ok(fn.body, fns_ok):
                fns_ok[name], changed = False, True
    return {id(op) for op in program.walk() if op.op in CONTROL
            and all(ops_ok(r, fns_ok) for r in op.regions)
            and (op.op is not Op.CALL or fns_ok[op.attrs["callee"]])}


# -- independent calls --------------------------------------------------------------------

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


def has_independent_calls(program: Program) -> bool:
    """Whether gathering would find a run of independent calls anywhere (nothing is moved)."""
    return any(independent_call_runs(Region(ops=gathered(region.ops)))
               for fn in program.functions.values() for region in fn.body.regions())


def gathered(ops: list[Operation]) -> list[Operation]:
    """`ops` reordered so that each call is followed by the next call independent of it,
    with the ops that call needs moved before the first."""
    ops = list(ops)
    i = 0
    while i < len(ops):
        if ops[i].op is Op.CALL:
            ops = _pull_next_call(ops, i)
        i += 1
    return ops


def _reads(op: Operation) -> set[int]:
    return {v.id for v in op.reads()}


def _depends_on_any(op: Operation, earlier: list[Operation]) -> bool:
    produced = {r.id for e in earlier for r in e.results}
    return bool(_reads(op) & produced)


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


# -- waves ----------------------------------------------------------------------------------

def straight_line_runs(ops: list[Operation]) -> list[list[Operation]]:
    """`ops` cut around control-flow ops: runs of data ops, each control-flow op a run of its own."""
    runs, run = [], []
    for op in ops:
        if op.op in CONTROL:
            runs += [run, [op]] if run else [[op]]
            run = []
        else:
            run.append(op)
    return runs + [run] if run else runs


def waves(run: list[Operation]) -> list[list[Operation]]:
    """The ops of a straight-line run grouped by wave (one more than the latest wave among the
    ops whose results it reads), in wave order. Constants are bound, not computed: they go
    first and never delay an op."""
    produced_in: dict[int, int] = {}
    by_wave: dict[int, list[Operation]] = {}
    for op in run:
        wave = -1 if op.op is Op.CONST or op.op in CONTROL else \
            1 + max((produced_in[v.id] for v in op.reads() if v.id in produced_in), default=-1)
        for r in op.results:
            produced_in[r.id] = wave
        by_wave.setdefault(wave, []).append(op)
    return [by_wave[k] for k in sorted(by_wave)]


# -- loops ----------------------------------------------------------------------------------

def unrollable(op: Operation) -> bool:
    """An innermost loop with a trip count, no exit condition and no stacked outputs."""
    return (op.op is Op.LOOP and op.loop_trip is not None and op.loop_cond is None and not op.loop_stacked
            and not any(inner.op is Op.LOOP for inner in op.loop_body.walk()))


def defined_inside(op: Operation) -> set[int]:
    """The ids of every value `op`'s regions define, at any depth (their parameters and results)."""
    ids: set[int] = set()
    for region in op.regions:
        for r in region.regions():
            ids.update(p.id for p in r.params)
            ids.update(v.id for o in r.ops for v in o.results)
    return ids


def known_trip_counts(fn: Function) -> dict:
    """Values a loop may take as its trip count that are known before it runs, by value id:
    numbers (SCALAR), and symbolic sizes (a DIM of a symbolic dim: the Sym)."""
    trips = {op.results[0].id: op.attrs["value"] for op in fn.body.walk() if op.op is Op.SCALAR}
    trips.update((op.results[0].id, op.operands[0].type.shape[op.attrs["dim"]])
                 for op in fn.body.walk() if op.op is Op.DIM)
    return trips


# -- a block of ops as a program of its own (the host backend's blocks, the batched executor's) --

def value_users(fn: Function) -> dict[int, set[int]]:
    """value id -> id() of the ops of `fn` that read it (a read inside an op's regions counts
    as the op's); -1 for a function or region yield."""
    users: dict[int, set[int]] = {}
    for region in fn.body.regions():
        for op in region.ops:
            for v in op.reads():
                users.setdefault(v.id, set()).add(id(op))
        for v in region.yields:
            users.setdefault(v.id, set()).add(-1)
    return users


def sizes_of(params: list[Value]) -> tuple:
    """The symbolic sizes of a program made of these parameters, each read where the first of
    them that has it holds it: `Program.sizes` (a size only its intermediates have leaves the
    program to need it as a number)."""
    found: dict = {}
    for k, p in enumerate(params):
        for d, n in enumerate(p.type.shape):
            if isinstance(n, Sym) and n not in found:
                found[n] = (n, k, d)
    return tuple(found.values())
