"""Wavefront order, the first step of Rammer's co-scheduling (Rammer §3.3).

Within a straight-line run of data ops (between two control-flow ops), an op's wave is one
more than the latest wave among the ops whose results it reads; ops of one wave do not
depend on each other, so the scheduler may run them side by side on different workers.
`wavefront_order` reorders each run wave by wave (stable inside a wave) so that the memory
plan, made after it, sees the order the ops will run in. IR ops are pure, so any order that
respects data dependences computes the same."""
from __future__ import annotations

from cocktailer.ir import CONTROL, Op, Operation, Program


def wavefront_order(program: Program) -> Program:
    for fn in program.functions.values():
        for region in fn.body.regions():
            region.ops = [op for run in straight_line_runs(region.ops) for wave in waves(run) for op in wave]
    return program


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
    """The ops of a straight-line run grouped by wave, in wave order. Constants are bound,
    not computed: they go first and never delay an op."""
    produced_in: dict[int, int] = {}
    by_wave: dict[int, list[Operation]] = {}
    for op in run:
        wave = -1 if op.op is Op.CONST or op.op in CONTROL else \
            1 + max((produced_in[v.id] for v in op.reads() if v.id in produced_in), default=-1)
        for r in op.results:
            produced_in[r.id] = wave
        by_wave.setdefault(wave, []).append(op)
    return [by_wave[k] for k in sorted(by_wave)]
