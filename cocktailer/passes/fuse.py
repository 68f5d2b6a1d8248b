"""Elementwise fusion: a chain of elementwise ops becomes one FUSED op, one loop over the
elements that computes every step in registers instead of writing each intermediate tensor
and reading it back (a Linear's bias and GELU after its product, a LayerNorm's scale and
shift, an LSTM cell's gates).

An op joins the op that reads its result when that is the result's only use, has the same
shape (each element of the chain is computed once), and both sit in one run of elementwise
ops with nothing else between them: IR ops are pure, but code made of a loop's body may write
a buffer in place (a SCATTER the level loop points at its input), so no computation moves
past another kind of op. A constant reads nothing and is no obstacle (the -inf of a masked
softmax's WHERE sits between the scaling and the mask). Ops whose kernel checks something first
(an integer division's zero divisor) stay alone: the backend says which (`has_kernel`). The
native stages run this on the program they compile, not on the IR the reference executor and
explain read."""
from __future__ import annotations

from typing import Callable

from cocktailer.ir import ELEMENTWISE, Op, Operation, Program, Region, Value


# The most ops one FUSED op computes. Its element is one C expression that nests each step in the
# next; a C++ compiler (the CUDA dialect: nvcc, or the virtual GPU's g++) parses nested casts
# tentatively, and a chain of 180 flag ORs made by capture's aliasing (fuzz seed 7274259) took
# g++ over 20 GB before it gave up (400 nested casts alone: over 4 GB; 80: 0.14 s).
MAX_STEPS = 48


def fuse_elementwise(program: Program, has_kernel: Callable[[Operation], bool]) -> Program:
    """`program` (rewritten in place: pass a clone) with its elementwise chains fused; only
    ops `has_kernel` accepts (the backend's: one its kernel renders without checks first)."""
    uses = _uses(program)
    fusable = lambda op: op.op in ELEMENTWISE and bool(op.results) and has_kernel(op)
    for fn in program.functions.values():
        for region in list(fn.body.regions()):
            region.ops = _fused_region(region, uses, fusable)
    return program


def _uses(program: Program) -> dict[int, int]:
    """How many times each value is read: by an operand slot, a region's yield, or from inside
    a nested region (each read counts)."""
    counts: dict[int, int] = {}
    for fn in program.functions.values():
        for region in fn.body.regions():
            for op in region.ops:
                for v in op.reads():
                    counts[v.id] = counts.get(v.id, 0) + 1
            for v in region.yields:
                counts[v.id] = counts.get(v.id, 0) + 1
    return counts


def _fused_region(region: Region, uses: dict[int, int], fusable: Callable) -> list[Operation]:
    out: list[Operation] = []
    run: list[Operation] = []
    for op in region.ops:
        if fusable(op):
            run.append(op)
            continue
        if not op.operands and not op.regions:   # a constant reads nothing: the run goes on past it
            out.append(op)
            continue
        out += _fused_run(run, uses)
        run = []
        out.append(op)
    return out + _fused_run(run, uses)


def _fused_run(run: list[Operation], uses: dict[int, int]) -> list[Operation]:
    """The run of elementwise ops with each chain replaced by one FUSED op, at the place of
    its last op (every value the chain reads from outside is made before that)."""
    if len(run) < 2:
        return list(run)
    made = {r.id: op for op in run for r in op.results}
    order = {id(op): k for k, op in enumerate(run)}
    group: dict[int, list[Operation]] = {id(op): [op] for op in run}   # id(root) -> its chain, in order
    root_of: dict[int, Operation] = {id(op): op for op in run}
    for op in run:
        shape = op.results[0].type.shape
        for v in op.operands:
            producer = made.get(v.id)
            if (producer is None or uses.get(v.id, 0) != 1 or root_of[id(producer)] is not producer
                    or producer.results[0].type.shape != shape
                    or len(group[id(producer)]) + len(group[id(op)]) > MAX_STEPS):
                continue
            chain = group.pop(id(producer))
            group[id(op)] = sorted(chain + group[id(op)], key=lambda o: order[id(o)])
            for member in chain:
                root_of[id(member)] = op
    out = []
    for op in run:
        if root_of[id(op)] is op:
            chain = group[id(op)]
            out.append(op if len(chain) == 1 else _fused(chain))
    return out


def _fused(chain: list[Operation]) -> Operation:
    """One FUSED op computing `chain` (in order; its last op's result is the result)."""
    inside = {r.id: k for k, op in enumerate(chain) for r in op.results}
    inputs: dict[int, Value] = {}
    for op in chain:
        for v in op.operands:
            if v.id not in inside:
                inputs.setdefault(v.id, v)
    position = {vid: k for k, vid in enumerate(inputs)}
    steps = tuple((op.op.name,
                   tuple(position[v.id] if v.id in position else len(inputs) + inside[v.id] for v in op.operands),
                   tuple(sorted(op.attrs.items())), op.results[0].type)
                  for op in chain)
    last = chain[-1]
    return Operation(Op.FUSED, list(inputs.values()), list(last.results), {"steps": steps}, [], last.loc)
