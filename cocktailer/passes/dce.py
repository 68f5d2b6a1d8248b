"""Dead code elimination: drop operations none of whose results is used, and the results of
control flow nobody reads.

All IR ops are pure (in-place writes were made functional at capture), so an operation
whose results nobody reads can go, control flow included. A control-flow op's unread
results go too, with what produces them: an `if`'s yields, a loop's carried values that
only feed themselves (capture carries whether a variable may still be a view of the tensor
it started as; where nothing writes through it, nothing reads that), the results of a
recursive function that no call reads, and a function no call reaches any more."""
from __future__ import annotations

from cocktailer.ir import Function, Op, Operation, Program, Region


def used_ids(region: Region, used: set[int]):
    """Add the ids of the values `region` reads (operands, yields, nested regions') to `used`."""
    used.update(v.id for v in region.yields)
    for op in region.ops:
        used.update(v.id for v in op.operands)
        for r in op.regions:
            used_ids(r, used)


def _sweep(region: Region, used: set[int]) -> bool:
    changed = False
    kept = []
    for op in region.ops:
        if not any(r.id in used for r in op.results):   # an `if` with no results too: nothing reads it
            changed = True
            continue
        for r in op.regions:
            changed |= _sweep(r, used)
        kept.append(op)
    region.ops = kept
    return changed


def dce(program: Program) -> Program:
    while True:
        changed = _drop_unread_call_results(program)
        for fn in program.functions.values():
            used: set[int] = set()
            used_ids(fn.body, used)
            changed |= _sweep(fn.body, used)
            changed |= _drop_unread_results(fn.body, used)
        changed |= _drop_uncalled_functions(program)
        if not changed:
            return program


def _drop_uncalled_functions(program: Program) -> bool:
    """Functions no call reaches from the entry (their calls were dead code) go: rendered, they
    were code nothing jumps to (nvcc warned of a frame pointer set and never read)."""
    reached, todo = {program.entry}, [program.entry]
    while todo:
        for op in program.functions[todo.pop()].body.walk():
            if op.op is Op.CALL and op.attrs["callee"] not in reached:
                reached.add(op.attrs["callee"])
                todo.append(op.attrs["callee"])
    uncalled = [name for name in program.functions if name not in reached]
    for name in uncalled:
        del program.functions[name]
    return bool(uncalled)


# -- results of if and loop -----------------------------------------------------------------

def _drop_unread_results(region: Region, used: set[int]) -> bool:
    changed = False
    for op in [op for r in region.regions() for op in r.ops]:
        if op.op is Op.IF:
            changed |= _trim_if(op, used)
        elif op.op is Op.LOOP:
            changed |= _trim_loop(op, used)
    return changed


def _trim_if(op: Operation, used: set[int]) -> bool:
    keep = [k for k, r in enumerate(op.results) if r.id in used]
    if len(keep) == len(op.results) or not keep:
        return False
    op.results = [op.results[k] for k in keep]
    for region in op.regions:
        region.yields = [region.yields[k] for k in keep]
    return True


def _trim_loop(op: Operation, used: set[int]) -> bool:
    """Carried values whose result is unread and that the body reads only to carry on."""
    carried = len(op.loop_carried_yields)
    live = {k for k in range(carried) if op.results[k].id in used}
    body, cond = op.loop_body, op.loop_cond
    cond_reads = set() if cond is None else {v.id for v in cond.outside_reads()} | _reads_inside(cond)
    while True:
        roots = [v for k, v in enumerate(body.yields) if k in live or k >= carried]
        needed = _needed(body, {v.id for v in roots})
        grown = {k for k in range(carried) if k not in live and
                 (body.params[1 + k].id in needed or (cond is not None and cond.params[1 + k].id in cond_reads))}
        if not grown:
            break
        live |= grown
    dead = [k for k in range(carried) if k not in live]
    if not dead:
        return False
    keep = [k for k in range(carried) if k in live]
    first = 1 if op.attrs.get("has_trip") else 0
    inits = op.operands[first:]
    op.operands = op.operands[:first] + [inits[k] for k in keep]
    body.params = body.params[:1] + [body.params[1 + k] for k in keep]
    body.yields = [body.yields[k] for k in keep] + body.yields[carried:]
    if cond is not None:
        cond.params = cond.params[:1] + [cond.params[1 + k] for k in keep]
    op.results = [op.results[k] for k in keep] + op.results[carried:]
    return True


def _reads_inside(region: Region) -> set[int]:
    reads: set[int] = set(v.id for v in region.yields)
    for op in region.walk():
        reads.update(v.id for v in op.operands)
    return reads


def _needed(region: Region, roots: set[int]) -> set[int]:
    """The values of `region` (and what it reads) that the values `roots` depend on."""
    needed = set(roots)
    for op in reversed(region.ops):
        if any(r.id in needed for r in op.results):
            needed.update(v.id for v in op.reads())
    return needed


# -- results of recursive functions ------------------------------------------------------------

def _drop_unread_call_results(program: Program) -> bool:
    """A function's results that no call site needs (beyond computing that same result in a
    recursive call) are dropped from the function and from every call."""
    if len(program.functions) == 1:   # only the entry, whose results are all needed
        return False
    live = {name: (set(range(len(fn.body.yields))) if name == program.entry else set())
            for name, fn in program.functions.items()}
    changed = True
    while changed:
        changed = False
        for name, fn in program.functions.items():
            for callee, k in _needed_call_results(fn, live[name]):
                if k not in live[callee]:
                    live[callee].add(k)
                    changed = True
    trimmed = False
    for name, fn in program.functions.items():
        keep = sorted(live[name])
        if name == program.entry or len(keep) == len(fn.body.yields):
            continue
        fn.body.yields = [fn.body.yields[k] for k in keep]
        for op in program.walk():
            if op.op is Op.CALL and op.attrs["callee"] == name:
                op.results = [op.results[k] for k in keep]
        trimmed = True
    return trimmed


def _needed_call_results(fn: Function, live_yields: set[int]) -> list[tuple[str, int]]:
    roots = {v.id for k, v in enumerate(fn.body.yields) if k in live_yields}
    needed = _needed_deep(fn.body, roots)
    return [(op.attrs["callee"], k) for op in fn.body.walk() if op.op is Op.CALL
            for k, r in enumerate(op.results) if r.id in needed]


def _needed_deep(region: Region, roots: set[int]) -> set[int]:
    """Like _needed, looking into nested regions: a region's yield is needed where the op's
    matching result is (a loop's carried yields feed its parameters, so all of them count)."""
    needed = set(roots)
    for op in reversed(region.ops):
        wanted = [k for k, r in enumerate(op.results) if r.id in needed]
        if not wanted:
            continue
        if op.op is Op.CALL or not op.regions:
            needed.update(v.id for v in op.operands)
            continue
        needed.update(v.id for v in op.operands)
        for sub in op.regions:
            inner = {v.id for k, v in enumerate(sub.yields) if op.op is not Op.IF or k in wanted}
            needed |= _needed_deep(sub, inner)
    return needed
