"""Products read their operands' views in place (native programs only).

Every value of a native program is a contiguous buffer, so a RESHAPE or a PERMUTE is a copy.
Attention splits its heads with both (`x.view(n, h, d).transpose(0, 1)`, then
`k.transpose(-2, -1)`): three copies of each of q and k before the product reads them once.
The packed GEMM reads A's rows and B's rows or columns at any stride, so a MATMUL whose
operand is such a chain of views (reshapes of a contiguous buffer, then permutes) reads the
buffer itself (`attrs["views"]`: the shape it is viewed at and the permutation), where the
kernel says it can (`kernels.matmul.reads_in_place`); the chain's copies go where nothing else
reads them.

A chain folds only when it and the product sit in one region with no op between them that may
write a buffer in place (UPDATE, SCATTER) or run other code (control flow): the product now
reads the buffer later than the chain did. The native stages run this on the program they
compile, as they run `passes.fuse`; the IR that the reference executor and explain read keeps
its views."""
from __future__ import annotations

from typing import Callable

from cocktailer.ir import CONTROL, Op, Operation, Program, Region, Value
from cocktailer.passes.dce import used_ids

_VIEWS = (Op.RESHAPE, Op.PERMUTE)
_WRITES_IN_PLACE = (Op.UPDATE, Op.SCATTER)

Accepts = Callable[[Operation, int, tuple, tuple], bool]


def fold_views_into_products(program: Program, accepts: Accepts) -> tuple[Program, int]:
    """`program` (rewritten in place: pass a clone) with its products' operand views folded
    where `accepts(op, k, shape, dims)`; and how many copies that removed."""
    before = sum(1 for op in program.walk() if op.op in _VIEWS)
    for fn in program.functions.values():
        for region in list(fn.body.regions()):
            _fold_region(region, accepts)
    _drop_unread_views(program)
    return program, before - sum(1 for op in program.walk() if op.op in _VIEWS)


def _fold_region(region: Region, accepts: Accepts) -> None:
    made = {r.id: (i, op) for i, op in enumerate(region.ops) for r in op.results}
    for i, op in enumerate(region.ops):
        if op.op is not Op.MATMUL:
            continue
        for k in (0, 1):
            chain = _view_chain(op.operands[k], made, region.ops, i)
            if chain is not None and accepts(op, k, chain[1], chain[2]):
                source, shape, dims = chain
                op.operands[k] = source
                op.attrs = {**op.attrs, "views": tuple(op.attrs.get("views", ())) + ((k, shape, dims),)}


def _view_chain(v: Value, made: dict, ops: list[Operation], at: int) -> tuple[Value, tuple, tuple] | None:
    """(buffer, shape it is viewed at, permutation) if `v` is permutes of reshapes of a buffer,
    made in this region with nothing between the chain and op `at` that could write it."""
    perms, first = [], at
    while v.id in made and made[v.id][1].op is Op.PERMUTE:
        first, producer = made[v.id]
        perms.append(tuple(producer.attrs["dims"]))
        v = producer.operands[0]
    shape = tuple(v.type.shape)
    reshaped = False
    while v.id in made and made[v.id][1].op is Op.RESHAPE:
        first, producer = made[v.id]
        v, reshaped = producer.operands[0], True
    if not perms and not reshaped:
        return None
    if any(op.op in _WRITES_IN_PLACE or op.op in CONTROL for op in ops[first:at]):
        return None
    dims = tuple(range(len(shape)))
    for p in reversed(perms):   # innermost first: dim i of a permute's result is dim p[i] of its operand
        dims = tuple(dims[i] for i in p)
    return v, shape, dims


def _drop_unread_views(program: Program) -> None:
    """Remove reshapes and permutes whose results nothing reads any more (a chain, inside out)."""
    while True:
        read: set[int] = set()
        for fn in program.functions.values():
            used_ids(fn.body, read)
        dropped = False
        for fn in program.functions.values():
            for region in fn.body.regions():
                kept = [op for op in region.ops if op.op not in _VIEWS or any(r.id in read for r in op.results)]
                dropped |= len(kept) != len(region.ops)
                region.ops = kept
        if not dropped:
            return
