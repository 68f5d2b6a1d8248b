"""The measured policy and recursion unroll: the gather pass, fan-out of independent calls on
worker groups (results, memory, errors), the profiler's cache, the candidate search with its
fallback when a candidate fails, and explain's report. Nothing here asserts on speed."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import CompiledCallError, models
from cocktailer.data import chain_tree, perfect_tree, random_tree
from cocktailer.ir import Op
from cocktailer.models.tree import tree_inputs
from cocktailer.backend import Config, driver, measured
from cocktailer.backend.profiler import Profiler
from cocktailer.ir.analysis import has_independent_calls, independent_call_runs
from cocktailer.passes.calls import gather_independent_calls
from cocktailer.reference import ReferenceExecutor
from cocktailer.runtime import find_compiler
from cocktailer.schedule import policy
from cocktailer.schedule.memory import plan_memory
from cocktailer.schedule.search import NoCandidate, search

try:
    from tests.utils import assert_same
except ImportError:
    from utils import assert_same

RTOL, ATOL = 1e-4, 1e-5
native = pytest.mark.skipif(find_compiler() is None, reason="no C compiler")


class RAE(nn.Module):
    def __init__(self, hidden=8):
        super().__init__()
        self.enc = nn.Linear(2 * hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root])
        r = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.enc(torch.cat([l, r], -1)))


class Chained(nn.Module):
    """The second call reads the first's result: the two must stay in order."""

    def __init__(self, hidden=8):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root])
        inp = inp + 0 * l.sum()
        r = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.lin(l + r))


def inputs_for(tree, nodes=128, hidden=8, seed=0):
    table = torch.randn(tree.num_leaves, hidden, generator=torch.Generator().manual_seed(seed))
    return tree_inputs(tree, list(range(tree.num_leaves)), table, nodes)


def trees():
    """Depth 1, 2 and 30 (a left-deep chain), a perfect tree and random bracketings."""
    return {"depth1": chain_tree(1), "depth2": perfect_tree(2), "depth30": chain_tree(30),
            "perfect5": perfect_tree(5), "random": random_tree(40, seed=3)}


def test_gather_moves_independent_calls_together_and_keeps_results():
    torch.manual_seed(0)
    model, args = RAE().eval(), inputs_for(perfect_tree(3))
    program = cocktailer.capture(model, args)
    assert has_independent_calls(program)
    assert not any(independent_call_runs(r) for fn in program.functions.values() for r in fn.body.regions())
    expected = ReferenceExecutor(program)(list(args))
    gather_independent_calls(program)
    cocktailer.verify(program)
    runs = [run for fn in program.functions.values() for r in fn.body.regions() for run in independent_call_runs(r)]
    assert len(runs) == 1 and [op.op for op in runs[0]] == [Op.CALL, Op.CALL]
    assert_same(ReferenceExecutor(program)(list(args)), expected, 0, 0)


def test_dependent_calls_are_not_gathered():
    torch.manual_seed(0)
    program = cocktailer.capture(Chained().eval(), inputs_for(perfect_tree(2)))
    assert not has_independent_calls(program)


def test_fan_out_keeps_the_calls_operands_and_results_apart():
    """Groups run the calls of a fan-out at once: no call's result may share memory with
    another call's operands or result."""
    torch.manual_seed(0)
    program = gather_independent_calls(cocktailer.capture(RAE().eval(), inputs_for(perfect_tree(3))))
    plan = plan_memory(program, Config(fan_out=True))
    (run,) = [run for fn in program.functions.values() for r in fn.body.regions() for run in independent_call_runs(r)]

    def span(v):
        b = plan.of(v)
        return (b.space, b.offset, b.offset + b.nbytes) if b.space in ("arena", "frame") else None
    for call in run:
        for other in run:
            written = [span(v) for v in call.results]
            touched = [span(v) for v in other.operands + (other.results if other is not call else [])]
            for w in filter(None, written):
                for t in filter(None, touched):
                    assert w[0] != t[0] or w[2] <= t[1] or t[2] <= w[1], (call, other)


@native
@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("model_class", [RAE, Chained])
def test_fan_out_matches_eager_on_trees_of_every_depth(model_class, workers):
    torch.manual_seed(0)
    model = model_class().eval()
    instances = [inputs_for(t, seed=k) for k, t in enumerate(trees().values())]
    fast = cocktailer.compile(model, instances[0], backend="cpu", options={"workers": workers, "fan_out": True})
    (_, compiled), = fast.cache.values()
    assert compiled.record.uprogram.fans_out == (model_class is RAE)
    with torch.no_grad():
        for args in instances:
            for _ in range(4):   # groups of workers race if memory or barriers are wrong
                assert_same(fast(*args), model(*args), RTOL, ATOL)


@native
@pytest.mark.parametrize("name", ["rae", "treelstm", "treefc"])
def test_fan_out_on_the_zoo_tree_models(name):
    w = models.make(name, batch=4, size="small", seed=1)
    fast = cocktailer.compile(w.model, w.inputs, backend="cpu", options={"workers": 2, "fan_out": True})
    with torch.no_grad():
        for args in w.config["instances"]:
            assert_same(fast(*args), w.model(*args), RTOL, ATOL, path=name)


@native
def test_errors_inside_a_fan_out_group_reach_python_without_hanging():
    """A chain fans out at every level: one group recurses, the other finishes a leaf and
    waits at the join; the deep group's overflow must release it."""
    torch.manual_seed(0)
    model = RAE().eval()
    fast = cocktailer.compile(model, inputs_for(chain_tree(3)), backend="cpu",
                              options={"workers": 2, "fan_out": True, "max_depth": 16})
    with torch.no_grad():
        with pytest.raises(CompiledCallError, match="recursion deeper"):
            fast(*inputs_for(chain_tree(40)))
        bad = list(inputs_for(chain_tree(5)))
        bad[0] = bad[0].clone()
        inner = int(bad[0][bad[4]])   # the root's internal child: reached inside a group
        bad[0][inner] = 1000
        with pytest.raises(CompiledCallError, match="out of range"):
            fast(*bad)
        args = inputs_for(chain_tree(12))
        assert_same(fast(*args), model(*args), RTOL, ATOL)   # still usable afterwards


def test_profiler_measures_each_candidate_once_and_keeps_it_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("COCKTAILER_CACHE_DIR", str(tmp_path))
    calls = []
    samples = [[torch.ones(3)], [torch.zeros(3)]]
    profiler = Profiler(samples, min_rounds=2, min_seconds=0)
    first = profiler.latency("candidate-a", calls.append)
    assert len(calls) == 2 * (1 + 2)   # warm-up, then two rounds of both samples
    assert profiler.latency("candidate-a", calls.append) == first and len(calls) == 6
    again = Profiler(samples, min_rounds=2, min_seconds=0)   # a new process would start like this
    assert again.latency("candidate-a", calls.append) == first and len(calls) == 6
    other_samples = Profiler([[torch.full((3,), 2.0)]], min_rounds=2, min_seconds=0)
    other_samples.latency("candidate-a", calls.append)
    assert len(calls) > 6   # other inputs, another measurement


def _fake_measure(times: dict, failing=()):
    def measure(candidate):
        if candidate in failing:
            raise RuntimeError("gcc failed")
        return times[candidate]
    return measure


def test_search_keeps_only_faster_steps_and_skips_candidates_that_fail():
    torch.manual_seed(0)
    program = cocktailer.capture(RAE().eval(), inputs_for(perfect_tree(2)))
    host, l1, one = Config(backend="host", workers=2), Config(workers=2), Config(workers=1)
    fan = Config(workers=2, fan_out=True)
    steps = ("host level", "control flow at L1", "SetResource", "recursion unroll")   # tested elsewhere: the rest
    start = Config(workers=2, steps=steps)
    best, trials = search(program, start, _fake_measure({host: 5.0, l1: 1.0, one: 0.99, fan: 0.5}))
    assert [t.step for t in trials] == ["host level", "control flow at L1", "SetResource", "recursion unroll"]
    assert best == fan and [t.kept for t in trials] == [False, False, False, True]
    assert trials[2].seconds == 0.99   # within the noise margin of 1.0: not kept
    best, trials = search(program, start, _fake_measure({host: 5.0, l1: 1.0, one: 2.0, fan: 0.5}, failing={fan}))
    assert best == l1 and "gcc failed" in trials[-1].error and not trials[-1].kept
    with pytest.raises(NoCandidate, match="gcc failed"):
        search(program, start, _fake_measure({}, failing={host, l1, one, fan}))


def test_a_choice_the_confirmation_contradicts_falls_back_to_the_simple_policy():
    torch.manual_seed(0)
    program = cocktailer.capture(RAE().eval(), inputs_for(perfect_tree(2)))
    start = Config(workers=2, steps=("host level", "control flow at L1", "SetResource"))
    host, l1, one = Config(backend="host", workers=2), Config(workers=2), Config(workers=1)
    times = {host: 5.0, l1: 1.0, one: 0.5}   # one worker measured faster (say, during a slow spell)
    best, trials = search(program, start, _fake_measure(times), confirm=lambda a, b: (0.9, 0.8))
    assert best == l1 and [t.step for t in trials][-2:] == ["confirmation", "confirmation"]
    assert [t.kept for t in trials] == [False, False, False, False, True]
    best, trials = search(program, start, _fake_measure(times), confirm=lambda a, b: (0.5, 0.9))
    assert best == one and trials[-2].kept and sum(t.kept for t in trials) == 1
    times[one] = 2.0   # the simple policy's candidate won: nothing to confirm
    best, trials = search(program, start, _fake_measure(times), confirm=lambda a, b: 1 / 0)
    assert best == l1 and "confirmation" not in [t.step for t in trials]


@native
def test_measured_policy_falls_back_when_a_candidate_does_not_compile(monkeypatch):
    real_build = driver.build_native

    def build(program, candidate, record):
        if candidate.control == "L1" and candidate.workers == 2:
            raise RuntimeError("simulated compiler failure")
        return real_build(program, candidate, record)
    monkeypatch.setattr(driver, "build_native", build)
    w = models.make("rae", batch=1, size="small", seed=0)
    fast = cocktailer.compile(w.model, w.inputs, backend="cpu",
                              options={"policy": "measured", "workers": 2})
    (_, tuned), = fast.cache.values()
    failed = [t for t in tuned.trials if t.error]
    assert failed and all("simulated compiler failure" in t.error for t in failed)
    assert not (tuned.candidate.control == "L1" and tuned.candidate.workers == 2)
    with torch.no_grad():
        assert_same(fast(*w.inputs), w.model(*w.inputs), RTOL, ATOL)


@native
@pytest.mark.parametrize("name", ["lstm", "seq2seq", "blockdrop", "rae"])
def test_measured_policy_matches_eager(name):
    w = models.make(name, batch=1, size="small", seed=2)
    fast = cocktailer.compile(w.model, w.inputs, backend="cpu", options={"policy": "measured"})
    (_, tuned), = fast.cache.values()
    assert sum(t.kept for t in tuned.trials) == 1
    assert next(t for t in tuned.trials if t.kept).candidate == tuned.candidate
    with torch.no_grad():
        assert_same(fast(*w.inputs), w.model(*w.inputs), RTOL, ATOL, path=name)


@native
def test_explain_lists_ir_passes_candidates_levels_and_uprogram():
    w = models.make("rae", batch=1, size="small", seed=0)
    text = cocktailer.explain(w.model, w.inputs, options={"workers": 2}, file=None)
    sections = [line for line in text.splitlines() if line.startswith("== ")]
    assert [s.split(" ")[1] for s in sections] == ["captured", "IR", "policy:", "control", "uProgram"]
    assert "== IR after the cpu backend's passes (distribute_loops, hoist_invariant_matmuls, dce_after_hoisting" in text
    assert ("passes applied: forward_invariant_results, dce, fold_constants, hoist_loop_invariants, "
            "eliminate_common_subexpressions, dce_after_folding") in text
    assert "func @forward" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| step")]
    steps = [r.split(" | ")[0] for r in rows]
    assert steps[:5] == ["| host level", "| nested constructs at L1", "| control flow at L1", "| SetResource",
                         "| recursion unroll"]
    assert set(steps[5:]) <= {"| wavefront", "| fine-grained barriers", "| confirmation"}
    assert sum(r.rstrip().endswith("| kept |") for r in rows) == 1 and "chosen: control flow" in text
    assert "if in @forward at tree.py" in text and "call @forward in @forward" in text
    assert "uTask" in text and "function @forward:" in text


@native
def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy 'fastest'"):
        cocktailer.compile(lambda x: x + 1, (torch.ones(2),), backend="cpu", options={"policy": "fastest"})


@native
def test_measured_policy_times_every_sample_of_the_same_shapes(monkeypatch):
    seen = []

    class Recording(Profiler):
        def __post_init__(self):
            seen.append(len(self.samples))
            super().__post_init__()
    monkeypatch.setattr(measured, "Profiler", Recording)
    torch.manual_seed(0)
    model = RAE().eval()
    first, second = inputs_for(perfect_tree(2)), inputs_for(random_tree(6, seed=1))
    other_shape = inputs_for(perfect_tree(2), nodes=64)
    cocktailer.compile(model, first, backend="cpu", options={"policy": "measured", "samples": [second, other_shape]})
    assert seen == [2]   # the example and `second`; `other_shape` specializes differently


def test_parameters_passed_through_the_recursion_alias_the_inputs():
    """The tree arrays go down the recursion unchanged: they are read where the caller gave
    them, not copied into each frame; the node index changes and gets a frame slot."""
    torch.manual_seed(0)
    program = cocktailer.capture(RAE().eval(), inputs_for(perfect_tree(2)))
    plan = plan_memory(program)
    left, right, is_leaf, inp, root = program.functions["forward"].params
    for k, p in enumerate([left, right, is_leaf, inp]):
        assert plan.of(p) == plan.of(program.main.params[k]) and plan.of(p).space == "input"
    assert plan.of(root).space == "frame"
    chained = cocktailer.capture(Chained().eval(), inputs_for(perfect_tree(2)))
    inp_param = chained.functions["forward"].params[3]   # rebound (`inp = inp + ...`) before the second call
    assert plan_memory(chained).of(inp_param).space == "frame"


@native
@pytest.mark.parametrize("name", ["lstm", "nasrnn", "attention"])
def test_loop_unroll_on_the_zoo_loop_models(name):
    w = models.make(name, batch=2, size="small", seed=3)
    fast = cocktailer.compile(w.model, w.inputs, backend="cpu", options={"unroll": 8})
    with torch.no_grad():
        assert_same(fast(*w.inputs), w.model(*w.inputs), RTOL, ATOL, path=name)


class _AllRecords(policy._Hazards):
    """The hazards as first written: every access kept, each new op checked against all."""

    def waits(self, group, reads, writes):
        accesses = [(a, False) for a in reads] + [(a, True) for a in writes]
        waits = {}
        for x in policy._members(group, self.workers):
            for rec in self.records:
                others = rec.workers - {x}
                if others and x not in rec.synced and any(rec.conflicts(a, group, w) for a, w in accesses):
                    waits.setdefault(x, set()).update(others)
        return waits

    def record(self, group, reads, writes):
        members = frozenset(policy._members(group, self.workers))
        self.records += [policy._Access(r, k, group, members, w) for (r, k), w in
                         [(a, False) for a in reads] + [(a, True) for a in writes]]


@pytest.mark.parametrize("seed", range(40))
def test_indexed_hazards_wait_for_exactly_what_checking_every_access_waits_for(seed):
    import random
    rng = random.Random(seed)
    workers = rng.choice([2, 3, 4])
    fast, slow = policy._Hazards(workers, fine=True), _AllRecords(workers, fine=True)

    def access():
        if rng.random() < 0.5:   # a slot of its own
            return (rng.choice(["output", "dynamic"]), (k := rng.randrange(6)), k + 1), rng.choice([None, (8, 16)])
        begin = rng.randrange(0, 512, 64)
        return ("arena", begin, begin + rng.choice([64, 128, 256])), rng.choice([None, (8, 16), (4, 16)])
    for _ in range(200):
        lo = rng.randrange(workers)
        group = rng.choice([None, (lo, rng.randrange(lo + 1, workers + 1))])
        reads = [access() for _ in range(rng.randrange(3))]
        writes = [access() for _ in range(rng.randrange(1, 3))]
        expected = slow.waits(group, reads, writes)
        assert fast.waits(group, reads, writes) == expected
        if expected:
            a, b = fast.synchronize(expected, ()), slow.synchronize(expected, ())
            assert type(a) is type(b) and getattr(a, "waits", None) == getattr(b, "waits", None)
        fast.record(group, reads, writes)
        slow.record(group, reads, writes)


def test_an_access_is_checked_only_against_records_of_its_own_slot(monkeypatch):
    hazards = policy._Hazards(2)
    for k in range(1000):   # a host backend's block: an op per output slot, none in another's way
        hazards.record(None, [], [(("output", k, k + 1), (8, 16))])
    checked = []
    original = policy._Access.conflicts
    monkeypatch.setattr(policy._Access, "conflicts", lambda self, *a: checked.append(self) or original(self, *a))
    assert hazards.waits(None, [(("output", 7, 8), None)], []) == {0: {1}, 1: {0}}
    assert len(checked) == 1
