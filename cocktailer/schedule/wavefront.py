"""Rammer's wavefront co-scheduling (Rammer §3.3): the ops of a wave (see
`passes.wavefront`) do not depend on each other, so they may run side by side, each on a
group of workers, instead of each on all workers one after another. Used by the policy (which
places them), by the memory plan (ops that run side by side must not share buffers) and by
`backend.waves`, which times each placed wave in both variants and excludes the ones that
are not faster side by side."""
from __future__ import annotations

from cocktailer.ir import Op, Operation, Region
from cocktailer.ir.analysis import straight_line_runs, waves


def op_work(op: Operation) -> int:
    """Multiply-adds of a contraction, elements written otherwise (symbolic sizes at their
    captured values: what the work is likely to be)."""
    out = op.results[0].type.hinted if op.results else None
    if out is None:
        return 0
    if op.op is Op.MATMUL:
        return out.numel * op.operands[0].type.hinted.shape[-1]
    if op.op is Op.CONV2D:
        w = op.operands[1].type.shape
        return out.numel * w[1] * w[2] * w[3]
    return out.numel


def co_scheduled(region: Region, workers: int, excluded: frozenset = frozenset()) -> list[dict[int, tuple[int, int]]]:
    """The waves of `region` (not of nested regions) whose ops run side by side, each as
    id(op) -> the workers [lo, hi) it runs on, in the order of the ops; ops not listed run on
    all workers. `excluded`: keys (`wave_key`) of waves measured slower side by side."""
    placed = (place_wave([op for op in wave if op.op is not Op.CONST], workers)
              for run in straight_line_runs(region.ops) for wave in waves(run))
    return [wave for wave in placed if wave and wave_key(wave) not in excluded]


def wave_key(wave: dict[int, tuple[int, int]]) -> tuple[int, ...]:
    """A placed wave's identity within one program object: its ops."""
    return tuple(wave)


# Smaller ops stay on all workers: they take about as long as a synchronization, and a chain
# of elementwise ops split the same way over all workers needs none (a measured LSTM cell got
# 20% slower when its gate activations were dealt to single workers and then joined).
MIN_CO_SCHEDULED_WORK = 1 << 14

# Data movement stays on all workers: it costs bytes, not work, and an UPDATE that writes one
# row of a carried cache in place would become a copy of the whole cache if it ran side by
# side (ops placed together cannot share buffers; a measured attention decoder ran 2x slower).
MOVEMENT = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.CAT, Op.SELECT, Op.UPDATE, Op.GATHER, Op.SCATTER})

# A wave runs side by side only if its slowest group takes at most this much longer than an
# even split of the wave's work over all workers (else each op runs on all workers in turn).
WAVE_BALANCE = 1.25


def place_wave(ops: list[Operation], workers: int) -> dict[int, tuple[int, int]]:
    """Rammer's kernel choice for one wave of independent ops: each on all workers, one after
    another (the variant fastest alone), or each on a group of its own, side by side (the
    variant most efficient per worker: no split, no barrier between them). Groups are chosen
    by work (longest first to the least loaded worker; fewer ops than workers: workers in
    proportion to work) and kept only if balanced. Returns id(op) -> workers [lo, hi)."""
    ops = [op for op in ops if op.op not in MOVEMENT and op_work(op) >= MIN_CO_SCHEDULED_WORK]
    if len(ops) < 2 or workers < 2:
        return {}
    work = {id(op): op_work(op) for op in ops}
    even = sum(work.values()) / workers
    if len(ops) >= workers:
        load = [0] * workers
        placed = {}
        for op in sorted(ops, key=lambda o: -work[id(o)]):
            w = min(range(workers), key=lambda k: load[k])
            load[w] += work[id(op)]
            placed[id(op)] = (w, w + 1)
        slowest = max(load)
    else:
        sizes = _proportional([work[id(op)] for op in ops], workers)
        placed, lo = {}, 0
        for op, size in zip(ops, sizes):
            placed[id(op)] = (lo, lo + size)
            lo += size
        slowest = max(work[id(op)] / size for op, size in zip(ops, sizes))
    return {id(op): placed[id(op)] for op in ops} if slowest <= WAVE_BALANCE * even else {}


def _proportional(work: list[int], workers: int) -> list[int]:
    """`workers` split among len(work) < workers groups in proportion to work, at least one each."""
    sizes = [1] * len(work)
    for _ in range(workers - len(work)):
        k = max(range(len(work)), key=lambda i: work[i] / sizes[i])
        sizes[k] += 1
    return sizes
