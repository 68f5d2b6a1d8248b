"""Wavefront order, the first step of Rammer's co-scheduling (Rammer §3.3).

Within a straight-line run of data ops (between two control-flow ops), an op's wave is one
more than the latest wave among the ops whose results it reads (`ir.analysis.waves`); ops of
one wave do not depend on each other, so the placement may run them side by side on
different workers. `wavefront_order` reorders each run wave by wave (stable inside a wave)
so that the memory plan, made after it, sees the order the ops will run in."""
from __future__ import annotations

from cocktailer.ir import Program
from cocktailer.ir.analysis import straight_line_runs, waves


def wavefront_order(program: Program) -> Program:
    for fn in program.functions.values():
        for region in fn.body.regions():
            region.ops = [op for run in straight_line_runs(region.ops) for wave in waves(run) for op in wave]
    return program
