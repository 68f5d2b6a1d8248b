"""Loop results that every iteration sets to the same value from outside the loop.

After a loop that runs at least once (a constant trip count of one or more, no exit
condition), such a result is that value. Capture carries values like this for aliasing: the
flag saying whether a variable may still be the tensor it entered the loop as, which is false
after any iteration. Forwarding them (and folding `and`/`or` with a constant, which the flags
of nested loops meet next) lets DCE drop the flags, and leaves the loop a chain of
recurrences that loop distribution can split.
"""
from __future__ import annotations

from cocktailer.ir import Op, Program, Region, Value


def forward_invariant_results(program: Program) -> Program:
    for fn in program.functions.values():
        done: set[int] = set()   # results already forwarded (their ops stay until DCE)
        while True:
            constants = {op.results[0].id: op.attrs["value"] for op in fn.body.walk() if op.op is Op.SCALAR}
            rename = _invariant_results(fn.body, constants) | _trivial_logic(fn.body, constants)
            rename = {k: v for k, v in rename.items() if k not in done}
            if not rename:
                break
            done |= rename.keys()
            fn.body.replace_uses(rename)
    return program


def _invariant_results(body: Region, constants: dict) -> dict[int, Value]:
    rename = {}
    for op in body.walk():
        trip = constants.get(op.loop_trip.id) if op.op is Op.LOOP and op.loop_trip is not None else None
        if op.op is Op.LOOP and op.loop_cond is None and isinstance(trip, int) and trip >= 1:
            inside = _defined(op.loop_body)
            rename.update({r.id: v for r, v in zip(op.results, op.loop_carried_yields)
                           if v.id not in inside and r.id not in rename})
    return rename


def _trivial_logic(body: Region, constants: dict) -> dict[int, Value]:
    """`x and False` is False, `x and True` is x; `or` alike."""
    rename = {}
    for op in body.walk():
        if op.op not in (Op.AND, Op.OR) or op.results[0].type.shape != ():
            continue
        absorbing = op.op is Op.OR   # True absorbs an or, False an and
        for k, v in enumerate(op.operands):
            if constants.get(v.id) is absorbing:
                rename[op.results[0].id] = v
            elif constants.get(v.id) is (not absorbing) and op.operands[1 - k].type == op.results[0].type:
                rename.setdefault(op.results[0].id, op.operands[1 - k])
    return rename


def _defined(region: Region) -> set[int]:
    ids = set()
    for r in region.regions():
        ids.update(p.id for p in r.params)
        ids.update(v.id for op in r.ops for v in op.results)
    return ids
