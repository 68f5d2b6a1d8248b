"""Where control flow may run, construct by construct (Cocktailer §3.2): how deep each
construct is nested, and which may move to L1 under Constraint 1. Algorithm 1 moves
constructs down bottom-up, the deepest first (`search.py`); the host backend runs the ones
moved inside its native blocks (`runtime/host.py`)."""
from __future__ import annotations

from typing import Callable

from cocktailer.ir import CONTROL, Op, Operation, Program, Region


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


def native_legal(program: Program, can_run_natively: Callable[[Operation], bool]) -> set[int]:
    """Constraint 1: id(construct) for the constructs that may run at L1 (in native code):
    every data op they control runs natively, through nested regions and called functions."""
    def ops_ok(region: Region, fns_ok: dict[str, bool]) -> bool:
        return all((can_run_natively(op) or op.op in CONTROL or op.op is Op.CONST)
                   and (op.op is not Op.CALL or fns_ok[op.attrs["callee"]]) for op in region.walk())
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
