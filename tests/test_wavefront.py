"""Rammer's wavefront co-scheduling on the cpu backend: the wave order pass, the placement of
a wave's ops on worker groups, the fine-grained barriers (step array) that replace global
ones where not every worker depends on every other, the memory plan keeping side-by-side ops
apart, results equal to eager on the zoo and the construct tests, errors inside a group,
and the two policy steps. Nothing here asserts on speed."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import CompiledCallError, models
from cocktailer.ir import Op
from cocktailer.backend import Config
from cocktailer.backend.waves import slower_side_by_side
from cocktailer.ir.analysis import straight_line_runs, waves
from cocktailer.passes.wavefront import wavefront_order
from cocktailer.runtime import find_compiler
from cocktailer.schedule import SimplePolicy
from cocktailer.schedule.memory import plan_memory
from cocktailer.schedule.search import search
from cocktailer.schedule.utask import Barrier, Sync, UOperator
from cocktailer.schedule.wavefront import co_scheduled, place_wave, wave_key

try:
    from tests.utils import assert_same
except ImportError:
    from utils import assert_same

RTOL, ATOL = 1e-4, 1e-5
native = pytest.mark.skipif(find_compiler() is None, reason="no C compiler")


def two_branches(x, a, b, c):
    """Two independent matmul -> activation chains, joined, then one more matmul."""
    p = torch.tanh(x @ a)
    q = torch.sigmoid(x @ b)
    return (p + q) @ c


def one_side_first(x, a, b):
    """Wave 0: x@a, x@b side by side; wave 1: relu(p) alone (all workers; needs only x@a's
    worker); wave 2: the sum (needs x@b's worker)."""
    p = x @ a
    q = x @ b
    u = torch.relu(p)
    return u + q


def args(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


def schedule(fn, inputs, workers=2, fine=True):
    program = wavefront_order(cocktailer.capture(fn, inputs))
    config = Config(workers=workers, wavefront=True, fine_barriers=fine)
    plan = plan_memory(program, config)
    up = SimplePolicy(config).schedule(program, plan)
    return program, plan, up.functions[program.entry].items


def test_waves_group_independent_ops_and_the_order_respects_dependences():
    program = wavefront_order(cocktailer.capture(two_branches, args((256, 64), (64, 64), (64, 64), (64, 8))))
    runs = straight_line_runs(program.main.body.ops)
    assert len(runs) == 1
    kinds = [[op.op for op in wave if op.op is not Op.CONST] for wave in waves(runs[0])]
    assert [k for k in kinds if k] == [[Op.MATMUL, Op.MATMUL], [Op.TANH, Op.SIGMOID], [Op.ADD], [Op.MATMUL]]
    seen = {p.id for p in program.main.params}
    for op in program.main.body.ops:   # every op after the ops it reads
        assert all(v.id in seen for v in op.operands)
        seen.update(r.id for r in op.results)


def test_place_wave_balances_or_keeps_every_op_on_all_workers():
    program = cocktailer.capture(two_branches, args((256, 64), (64, 64), (64, 64), (64, 8)))
    mm1, mm2 = [op for op in program.main.body.ops if op.op is Op.MATMUL][:2]
    assert sorted(place_wave([mm1, mm2], 2).values()) == [(0, 1), (1, 2)]
    assert sorted(place_wave([mm1, mm2], 5).values()) == [(0, 3), (3, 5)]   # fewer ops than workers
    assert place_wave([mm1], 2) == {} and place_wave([mm1, mm2], 1) == {}
    small = cocktailer.capture(torch.tanh, args((8, 64),)).main.body.ops[-1]   # 512 elements: about a barrier's time
    assert place_wave([mm1, small], 2) == {}
    big = cocktailer.capture(lambda x, a, b: (x @ a, x @ b), args((8, 64), (64, 64), (64, 256)))
    mm, wide = [op for op in big.main.body.ops if op.op is Op.MATMUL]
    assert place_wave([mm, wide], 2) == {}   # 32K and 131K multiply-adds: unbalanced, each on all workers in turn
    moves = cocktailer.capture(lambda x, y: (x.permute(1, 0) + 0, y.t() * 1), args((256, 64), (256, 64))).main.body.ops
    permutes = [op for op in moves if op.op is Op.PERMUTE]
    assert len(permutes) == 2 and place_wave(permutes, 2) == {}   # data movement stays on all workers


def test_chains_on_one_worker_need_no_barrier_and_the_join_waits_for_both():
    _, _, items = schedule(two_branches, args((256, 64), (64, 64), (64, 64), (64, 8)))
    ops = [i for i in items if isinstance(i, UOperator) and i.op.op is not Op.CONST]
    assert [(i.op.op, i.group) for i in ops[:4]] == [(Op.MATMUL, (0, 1)), (Op.MATMUL, (1, 2)),
                                                      (Op.TANH, (0, 1)), (Op.SIGMOID, (1, 2))]
    first_sync = next(k for k, i in enumerate(items) if isinstance(i, (Barrier, Sync)))
    assert items.index(ops[3]) < first_sync   # matmul -> activation on the same worker: no wait between
    assert isinstance(items[first_sync], Barrier)   # the add reads both workers' results


def test_fine_grained_barrier_waits_only_for_the_worker_depended_on():
    _, _, items = schedule(one_side_first, args((8, 64), (64, 64), (64, 64)))
    syncs = [i for i in items if isinstance(i, Sync)]
    ops = [i for i in items if isinstance(i, UOperator) and i.op.op is not Op.CONST]
    side = {i.op.operands[1].id: i.group for i in ops if i.op.op is Op.MATMUL}
    p_worker = next(g for i in ops if i.op.op is Op.MATMUL for g in [i.group] if i.op.results[0].id ==
                    next(o for o in ops if o.op.op is Op.RELU).op.operands[0].id)
    assert len(side) == 2 and len(syncs) == 2 and not any(isinstance(i, Barrier) for i in items)
    other = 1 - p_worker[0]
    assert syncs[0].waits == {other: (p_worker[0],)}   # relu on all workers: only the other one waits
    assert syncs[1].waits == {p_worker[0]: (other,)}   # the add: q's worker is waited for
    _, _, global_only = schedule(one_side_first, args((8, 64), (64, 64), (64, 64)), fine=False)
    assert not any(isinstance(i, Sync) for i in global_only)
    assert sum(isinstance(i, Barrier) for i in global_only) == 1   # the first one orders q too


def test_ops_side_by_side_never_share_a_buffer():
    program, plan, items = schedule(two_branches, args((256, 64), (64, 64), (64, 64), (64, 8)))
    side_by_side = [i.op for i in items if isinstance(i, UOperator) and i.group is not None]
    spans = []
    for op in side_by_side[:2]:   # the matmuls, then the activations, run at the same time
        for v in (*op.operands, *op.results):
            b = plan.of(v)
            if b.space == "arena":
                spans.append((op, b.offset, b.offset + b.nbytes))
    for a in spans:
        for b in spans:
            if a[0] is not b[0]:
                assert a[2] <= b[1] or b[2] <= a[1], "two co-scheduled ops share arena memory"


@native
@pytest.mark.parametrize("fn,shapes", [(two_branches, ((256, 64), (64, 64), (64, 64), (64, 8))),
                                       (one_side_first, ((8, 64), (64, 64), (64, 64)))])
@pytest.mark.parametrize("workers,fine", [(2, True), (2, False), (4, True)])
def test_wavefront_functions_match_eager(fn, shapes, workers, fine):
    inputs = args(*shapes, seed=3)
    fast = cocktailer.compile(fn, inputs, backend="cpu",
                              options={"workers": workers, "wavefront": True, "fine_barriers": fine,
                                       "measure_waves": False})
    (_, executable), = fast.cache.values()
    assert executable.record.uprogram.co_scheduled
    for seed in (3, 4):
        inputs = args(*shapes, seed=seed)
        assert_same(fast(*inputs), fn(*inputs), RTOL, ATOL)


# Small models, widened where they have independent ops big enough to run side by side
WIDER = {"lstm": {"hidden": 128, "input_size": 128}, "nasrnn": {"hidden": 64, "input_size": 64},
         "attention": {"heads": 4, "head_dim": 32}, "seq2seq": {"hidden": 128}, "treefc": {"hidden": 160},
         "treelstm": {"hidden": 128}, "rae": {"hidden": 128}}


@native
@pytest.mark.parametrize("name", models.names())
def test_wavefront_on_the_zoo_matches_eager(name):
    for batch, workers in ((1, 2), (2, 4)):
        w = models.make(name, batch=batch, size="small", seed=5, **WIDER.get(name, {}))
        fast = cocktailer.compile(w.model, w.inputs, backend="cpu",
                                  options={"workers": workers, "wavefront": True, "measure_waves": False})
        (_, executable), = fast.cache.values()
        if name in ("attention", "treefc"):   # independent projections in one wave: side by side
            assert executable.record.uprogram.co_scheduled, name
        with torch.no_grad():
            assert_same(fast(*w.inputs), w.model(*w.inputs), RTOL, ATOL, path=f"{name}/{batch}/{workers}")


@native
def test_each_wave_is_measured_in_both_variants_and_the_slower_kept_apart():
    inputs = args((256, 64), (64, 64), (64, 64), (64, 8))
    program = wavefront_order(cocktailer.capture(two_branches, inputs))
    placed = {wave_key(w) for region in program.main.body.regions() for w in co_scheduled(region, 2)}
    assert len(placed) == 2   # the matmuls, then the activations
    assert slower_side_by_side(program, Config(workers=2)) <= placed   # which ones: a measurement, not asserted
    fast = cocktailer.compile(two_branches, inputs, backend="cpu", options={"workers": 2, "wavefront": True})
    for seed in (1, 2):
        inputs = args((256, 64), (64, 64), (64, 64), (64, 8), seed=seed)
        assert_same(fast(*inputs), two_branches(*inputs), RTOL, ATOL)
    divisions = cocktailer.capture(TwoDivisions(), (torch.arange(1 << 14), torch.arange(1 << 14), torch.tensor(3),
                                                    torch.tensor(5)))
    divisions = wavefront_order(divisions)
    waves = [wave_key(w) for region in divisions.main.body.regions() for w in co_scheduled(region, 2)]
    assert waves and set(waves) <= slower_side_by_side(divisions, Config(workers=2))   # made-up divisor 0: not measured


def test_wavefront_and_fan_out_are_refused_together():
    with pytest.raises(ValueError, match="cannot be combined"):
        Config(workers=2, fan_out=True, wavefront=True)


class TwoDivisions(nn.Module):
    def forward(self, a, b, i, j):
        return a // i + b // j


@native
def test_an_error_in_one_group_reaches_python_without_hanging():
    a, b = torch.arange(1 << 14), torch.arange(1 << 14) * 3   # big enough to co-schedule
    i, j = torch.tensor(3), torch.tensor(5)
    fast = cocktailer.compile(TwoDivisions(), (a, b, i, j), backend="cpu",
                              options={"workers": 2, "wavefront": True, "measure_waves": False})
    (_, executable), = fast.cache.values()
    assert executable.record.uprogram.co_scheduled   # the two divisions run on different workers
    with torch.no_grad():
        assert_same(fast(a, b, i, j), TwoDivisions()(a, b, i, j), RTOL, ATOL)
        for bad in ((torch.tensor(0), j), (i, torch.tensor(0))):
            with pytest.raises(CompiledCallError, match="division by zero"):
                fast(a, b, *bad)
        assert_same(fast(a, b, i, j), TwoDivisions()(a, b, i, j), RTOL, ATOL)   # usable after an error


def test_search_tries_wavefront_then_fine_barriers_unless_calls_fan_out():
    program = cocktailer.capture(two_branches, args((256, 64), (64, 64), (64, 64), (64, 8)))
    l1, one = Config(workers=2), Config(workers=1)
    wave = Config(workers=2, wavefront=True, fine_barriers=False)
    fine = Config(workers=2, wavefront=True, fine_barriers=True)
    times = {l1: 1.0, one: 1.5, wave: 0.9, fine: 0.8}
    best, trials = search(program, l1, lambda c: times[c])
    assert [t.step for t in trials] == ["control flow at L1", "SetResource", "wavefront", "fine-grained barriers"]
    assert best == fine
    times[wave] = 2.0   # not kept: fine-grained barriers are tried on the best so far, with co-scheduling
    best, trials = search(program, l1, lambda c: times[c])
    assert best == fine and trials[-1].candidate == fine
    best, trials = search(program, Config(workers=2, steps=("control flow at L1", "SetResource")), lambda c: times[c])
    assert best == l1 and [t.step for t in trials] == ["control flow at L1", "SetResource"]
    with pytest.raises(ValueError, match="unknown policy steps"):
        search(program, Config(workers=2, steps=("wavefronts",)), lambda c: 1.0)


SCRIPT = """
import torch, cocktailer
from tests.test_wavefront import two_branches, args
inputs = args((256, 64), (64, 64), (64, 64), (64, 8))
fast = cocktailer.compile(two_branches, inputs, backend="cpu",
                          options={"workers": 2, "wavefront": True, "measure_waves": False})
try:
    fast(*inputs)
except cocktailer.CompiledCallError as e:
    print("raised:", e)
"""


@native
def test_fewer_threads_than_the_schedule_places_uTasks_on_raise_instead_of_skipping_them():
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "OMP_THREAD_LIMIT": "1", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True,
                         timeout=300)
    assert "raised: the runtime started fewer worker threads than the schedule places uTasks on" in out.stdout, \
        out.stdout + out.stderr
