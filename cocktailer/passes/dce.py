"""Dead code elimination: drop operations none of whose results is used.

All IR ops are pure (in-place writes were made functional at capture), so an operation
whose results nobody reads can go, control flow included."""
from __future__ import annotations

from cocktailer.ir import Program, Region


def _used_ids(region: Region, used: set[int]):
    used.update(v.id for v in region.yields)
    for op in region.ops:
        used.update(v.id for v in op.operands)
        for r in op.regions:
            _used_ids(r, used)


def _sweep(region: Region, used: set[int]) -> bool:
    changed = False
    kept = []
    for op in region.ops:
        if op.results and not any(r.id in used for r in op.results):
            changed = True
            continue
        for r in op.regions:
            changed |= _sweep(r, used)
        kept.append(op)
    region.ops = kept
    return changed


def dce(program: Program) -> Program:
    for fn in program.functions.values():
        while True:
            used: set[int] = set()
            _used_ids(fn.body, used)
            if not _sweep(fn.body, used):
                break
    return program
