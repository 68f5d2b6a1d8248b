"""Common subexpression elimination: a data op that repeats an earlier one (the same op, attrs
and operands) reads the earlier one's result instead of computing it again.

Models repeat work more often than one would think: DRNN's `spawn` computes `ancestral(h)`
twice (once per child), which at capture is two GEMMs with the same weight and the same rows;
after this pass it is one. A constant folded twice (`permute(w)` read by two `linear`s) is one
op too.

IR ops are pure (in-place writes were made functional at capture), so a repeat computes the
same value. What is reused:
- an op earlier in the same region, or earlier in an enclosing region (an op in a loop body
  may reuse a value computed before the loop); never one inside another arm or body, which
  may not have run;
- data ops only: control flow (`if`, loops, calls) stays as written.

What is not eliminated: a value whose identity as memory may be seen by the caller. Two
outputs computed alike are two tensors in eager PyTorch, and a write into one must not reach
the other. A value is *exposed* when a region yields it (a function's results, an arm's, a
loop body's), when control flow takes it as an operand (a call's argument may come back as
its result), or when a view of an exposed value is taken of it. An exposed repeat is kept;
an earlier exposed value may still be reused by ops that only read it.
"""
from __future__ import annotations

from cocktailer.ir import CONTROL, VIEWS, Function, Operation, Program, Region, Value


def eliminate_common_subexpressions(program: Program) -> Program:
    for fn in program.functions.values():
        rename: dict[int, Value] = {}
        _cse_region(fn.body, {}, _exposed(fn), rename)
        if rename:
            fn.body.replace_uses(rename)
    return program


def _cse_region(region: Region, visible: dict, exposed: set[int], rename: dict[int, Value]):
    """Drop the repeats in `region` (and in its nested regions). `visible`: key -> results of
    the ops computed before the region starts; `rename`: dropped result id -> its replacement."""
    seen = dict(visible)
    kept = []
    for op in region.ops:
        if op.op in CONTROL:
            for nested in op.regions:
                _cse_region(nested, seen, exposed, rename)
            kept.append(op)
            continue
        key = _key(op, rename)
        earlier = seen.get(key)
        if earlier is not None and not any(r.id in exposed for r in op.results):
            rename.update({r.id: e for r, e in zip(op.results, earlier)})
            continue
        seen.setdefault(key, op.results)
        kept.append(op)
    region.ops = kept


def _key(op: Operation, rename: dict[int, Value]) -> tuple:
    """What makes two data ops compute the same value: op, attrs, operands (as renamed so
    far) and result types."""
    operands = tuple(rename.get(v.id, v).id for v in op.operands)
    return (op.op, repr(sorted(op.attrs.items())), operands, tuple(repr(r.type) for r in op.results))


def _exposed(fn: Function) -> set[int]:
    """The values of `fn` whose memory the caller may see, or that may come back as a result
    (see the module's docstring)."""
    exposed: set[int] = set()
    for region in fn.body.regions():
        exposed.update(v.id for v in region.yields)
        exposed.update(v.id for op in region.ops if op.op in CONTROL for v in op.operands)
    # a view of a view of x exposes x: one pass from the last op back, as a value is always
    # defined before (in walk order) the ops that read it
    for op in reversed([op for op in fn.body.walk() if op.op in VIEWS]):
        if op.results[0].id in exposed:
            exposed.add(op.operands[0].id)
    return exposed
