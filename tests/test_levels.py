"""Algorithm 1 a nesting level at a time: constructs nested at least d deep run inside the
host backend's native blocks while the rest stays in Python; Constraint 1 keeps a
construct on the host when an op it controls has no native kernel (a float16 cast here),
and the cpu backend then runs the rest natively instead of giving up. Results are compared
with eager; nothing here asserts on speed."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import models
from cocktailer.backend import Config, build
from cocktailer.backend.host import HostExecutor
from cocktailer.backend.measured import TunedProgram
from cocktailer.codegen import kernels
from cocktailer.ir import Op
from cocktailer.ir.analysis import native_legal, nesting_depths
from cocktailer.runtime import find_compiler
from cocktailer.schedule.search import search

try:
    from tests.utils import assert_same
    from tests.test_policy import RAE, inputs_for, trees
except ImportError:
    from utils import assert_same
    from test_policy import RAE, inputs_for, trees

RTOL, ATOL = 1e-4, 1e-5
native = pytest.mark.skipif(find_compiler() is None, reason="no C compiler")


class NestedLoops(nn.Module):
    """A loop over rows whose body has a loop of its own and a branch."""

    def __init__(self, hidden=8):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x, inner):
        h = torch.zeros_like(x[0])
        for t in range(x.shape[0]):
            for _ in range(inner):
                h = torch.tanh(self.lin(h) + x[t])
            if h.sum() > 0:
                h = h * 0.5
        return h


class HalfInside(nn.Module):
    """A loop whose body rounds through float16 (no native kernel), after a loop that has none."""

    def __init__(self, hidden=8):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden)

    def forward(self, x, n):
        h = x
        for _ in range(n):
            h = torch.tanh(self.lin(h))
        for _ in range(n):
            h = h.half().float() * 0.5 + h
        return h


def nested_args(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 8, generator=g), torch.tensor(3)


def half_args(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 8, generator=g), torch.tensor(4)


def _kinds(program, ids):
    return sorted(op.op.name for op in program.walk() if id(op) in ids)


def test_depths_and_constraint_1():
    torch.manual_seed(0)
    program = cocktailer.capture(NestedLoops().eval(), nested_args())
    depths = nesting_depths(program)
    assert sorted((op.op.name, depths[id(op)]) for op in program.walk() if op.op in (Op.LOOP, Op.IF)) == \
        [("IF", 1), ("LOOP", 0), ("LOOP", 1)]
    assert len(native_legal(program, kernels.supported)) == 3
    half = cocktailer.capture(HalfInside().eval(), half_args())
    legal = native_legal(half, kernels.supported)
    assert _kinds(half, legal) == ["LOOP"]   # the loop with the float16 cast stays on the host
    assert native_legal(half, lambda op: True) == {id(op) for op in half.walk() if op.op is Op.LOOP}


@native
@pytest.mark.parametrize("native_from", [None, 1, 0])
def test_host_backend_runs_the_constructs_of_a_level_natively(native_from):
    torch.manual_seed(0)
    model = NestedLoops().eval()
    program = cocktailer.capture(model, nested_args())
    executor = build(program, Config(backend="host", workers=2, native_from=native_from))
    expected = {None: [], 1: ["IF", "LOOP"], 0: ["IF", "LOOP", "LOOP"]}[native_from]
    assert _kinds(program, executor.native) == expected
    with torch.no_grad():
        for seed in (0, 1):
            x, inner = nested_args(seed)
            assert_same(executor([x, inner])[0], model(x, inner), RTOL, ATOL)


@native
@pytest.mark.parametrize("native_from", [1, 0])
@pytest.mark.parametrize("tree", ["depth1", "depth30", "random"])
def test_recursion_below_the_root_runs_natively(native_from, tree):
    torch.manual_seed(0)
    model = RAE().eval()
    args = inputs_for(trees()[tree])
    program = cocktailer.capture(model, args)
    executor = build(program, Config(backend="host", workers=2, native_from=native_from))
    calls = [op for op in program.walk() if op.op is Op.CALL]
    assert any(id(c) in executor.native for c in calls)
    with torch.no_grad():
        assert_same(executor(list(args))[0], model(*args), RTOL, ATOL)


def test_search_moves_levels_down_bottom_up_before_the_whole_program():
    torch.manual_seed(0)
    program = cocktailer.capture(NestedLoops().eval(), nested_args())
    host, deep = Config(backend="host", workers=2), Config(backend="host", workers=2, native_from=1)
    l1 = Config(workers=2)
    times = {host: 3.0, deep: 2.0, l1: 1.0}
    start = Config(workers=2, steps=("host level", "nested constructs at L1", "control flow at L1"))
    best, trials = search(program, start, lambda c: times[c])
    assert [t.candidate for t in trials] == [host, deep, l1] and best == l1
    half = cocktailer.capture(HalfInside().eval(), half_args())
    best, trials = search(half, start, lambda c: times.get(c, 0.5) if c.control == "host" else 1 / 0,
                          has_kernel=kernels.supported)
    assert best == Config(backend="host", workers=2, native_from=0) and "ZeroDivisionError" in trials[-1].error


@native
def test_cpu_backend_runs_what_it_can_natively_around_an_op_without_a_kernel():
    torch.manual_seed(0)
    model = HalfInside().eval()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = cocktailer.compile(model, half_args(), backend="cpu", options={"workers": 2})
    assert any("no native kernel for cast" in str(w.message) for w in caught)
    (program, executable), = fast.cache.values()
    assert isinstance(executable, HostExecutor)
    assert _kinds(program, executable.native) == ["LOOP"] and executable.blocks
    with torch.no_grad():
        for seed in (0, 1):
            x, n = half_args(seed)
            assert_same(fast(x, n), model(x, n), RTOL, ATOL)


@native
def test_measured_policy_places_constructs_by_constraint_1():
    torch.manual_seed(0)
    model = HalfInside().eval()
    fast = cocktailer.compile(model, half_args(), backend="cpu", options={"policy": "measured", "workers": 2})
    (_, tuned), = fast.cache.values()
    assert isinstance(tuned, TunedProgram) and tuned.candidate.control == "host"
    assert any(t.step == "nested constructs at L1" and t.seconds is not None for t in tuned.trials)
    assert "no native kernel" in next(t for t in tuned.trials if t.step == "control flow at L1").error
    with torch.no_grad():
        assert_same(fast(*half_args(2)), model(*half_args(2)), RTOL, ATOL)
    text = cocktailer.explain(fast, file=None)   # the build record of this very choice
    levels = [line.rsplit(": ", 1)[1] for line in text.split("== control flow: where each construct runs ==\n")[1]
              .split("\n\n")[0].splitlines()]
    assert len(levels) == 2 and levels[1] == "host"   # the float16 loop
    assert levels[0] == ("L1 (in a native block)" if tuned.candidate.native_from is not None else "host")


@native
@pytest.mark.parametrize("name", ["seq2seq", "blockdrop", "treelstm"])
def test_zoo_with_levels_moved_down_matches_eager(name):
    w = models.make(name, batch=1, size="small", seed=4)
    depths = nesting_depths(cocktailer.capture(w.model, w.inputs))
    for native_from in sorted(set(depths.values()), reverse=True):
        fast = cocktailer.compile(w.model, w.inputs, backend="host", options={"workers": 2, "native_from": native_from})
        with torch.no_grad():
            assert_same(fast(*w.inputs), w.model(*w.inputs), RTOL, ATOL, path=f"{name}@{native_from}")
