"""The native CPU backend beyond the construct tests: the model zoo at batch 1 and >1 on
the "cpu" and "host" backends, errors raised before native code can misbehave, the disk
cache across processes, and the fallback when there is no C compiler."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import CompiledCallError, models
from cocktailer.runtime import compiler, find_compiler

try:
    from tests.utils import assert_same
except ImportError:
    from utils import assert_same

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler")
RTOL, ATOL = 1e-4, 1e-5


def _instances(w):
    return w.config["instances"] if not w.batches else [w.inputs]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", models.names())
def test_zoo_on_cpu_backend_matches_eager(name, batch):
    """One compile per model, then inputs from several seeds (other decisions, other trees)."""
    workloads = [models.make(name, batch=batch, size="small", seed=s) for s in (0, 1, 2)]
    model = workloads[0].model
    fast = cocktailer.compile(model, workloads[0].inputs, backend="cpu")
    assert fast.chosen == "cpu"
    with torch.no_grad():
        for w in workloads:
            for inputs in _instances(w):
                assert_same(fast(*inputs), model(*inputs), RTOL, ATOL, path=f"{name}")
    assert len(fast.cache) == 1


@pytest.mark.parametrize("name", ["lstm", "seq2seq", "blockdrop", "rae"])
def test_zoo_on_host_backend_matches_eager(name):
    w = models.make(name, batch=1, size="small", seed=1)
    fast = cocktailer.compile(w.model, w.inputs, backend="host")
    with torch.no_grad():
        assert_same(fast(*w.inputs), w.model(*w.inputs), RTOL, ATOL, path=name)


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


def chain(depth: int, nodes: int = 64):
    """A left-deep tree of the given depth: node k has children 2k+1 (internal) and 2k+2 (leaf)."""
    left = torch.full((nodes,), -1)
    right = torch.full((nodes,), -1)
    is_leaf = torch.ones(nodes, dtype=torch.bool)
    node = 0
    for _ in range(depth):
        left[node], right[node], is_leaf[node] = node + 2, node + 1, False
        node += 2
    return left, right, is_leaf, torch.randn(nodes, 8), torch.tensor(0)


def test_recursion_deeper_than_max_depth_raises_a_clear_error():
    torch.manual_seed(0)
    model = RAE().eval()
    fast = cocktailer.compile(model, chain(3), backend="cpu", options={"max_depth": 16})
    deep, too_deep, shallow = chain(15), chain(20), chain(5)
    with torch.no_grad():
        assert_same(fast(*deep), model(*deep), RTOL, ATOL)
        with pytest.raises(CompiledCallError, match="recursion deeper.*max_depth"):
            fast(*too_deep)
        assert_same(fast(*shallow), model(*shallow), RTOL, ATOL)   # still usable afterwards


def test_tree_index_out_of_range_raises_instead_of_reading_out_of_bounds():
    torch.manual_seed(0)
    model = RAE().eval()
    args = chain(3)
    fast = cocktailer.compile(model, args, backend="cpu")
    left = args[0].clone()
    left[0] = 1000
    with torch.no_grad(), pytest.raises(CompiledCallError, match="out of range"):
        fast(left, *args[1:])


def test_program_called_with_wrong_inputs_raises():
    prog = cocktailer.capture(lambda x: x * 2, (torch.ones(3),))
    run = cocktailer.BACKENDS["cpu"](prog)
    with pytest.raises(CompiledCallError, match="f32\\[4\\]"):
        run([torch.ones(4)])
    with pytest.raises(CompiledCallError, match="f64\\[3\\]"):
        run([torch.ones(3, dtype=torch.float64)])
    with pytest.raises(CompiledCallError, match="meta"):
        run([torch.ones(3, device="meta")])
    with pytest.raises(CompiledCallError, match="expected 1 tensor inputs"):
        run([])
    assert torch.equal(run([torch.ones(3)])[0], torch.full((3,), 2.0))


def test_no_compiler_falls_back_to_reference_with_one_warning(monkeypatch):
    from cocktailer import api
    monkeypatch.setattr(api, "find_compiler", lambda: None)
    monkeypatch.setattr(api, "_warned", set())
    fn = lambda x: torch.tanh(x) + 1   # noqa: E731
    x = torch.randn(5)
    with pytest.warns(RuntimeWarning, match="no C compiler"):
        fast = cocktailer.compile(fn, (x,), backend="cpu")
    assert torch.equal(fast(x), fn(x))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cocktailer.compile(fn, (torch.randn(6),))   # warned once only; auto picks reference


def test_second_compile_hits_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COCKTAILER_CACHE_DIR", str(tmp_path))
    prog = cocktailer.capture(lambda x: torch.relu(x) * 3, (torch.randn(7),))
    first = cocktailer.BACKENDS["cpu"](prog)

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran although the library is cached")
    monkeypatch.setattr(compiler.subprocess, "run", no_compiler)
    second = cocktailer.BACKENDS["cpu"](prog)
    assert first.library == second.library


@pytest.mark.parametrize("backend", ["cpu", "host"])
def test_compiling_a_model_again_runs_no_compiler_and_writes_no_file(tmp_path, monkeypatch, backend):
    """The generated source is the same for the same program (no process-wide numbering in
    it), so a repeat compile, with a fresh capture, is a cache hit."""
    monkeypatch.setenv("COCKTAILER_CACHE_DIR", str(tmp_path))
    w = models.make("seq2seq", batch=1, size="small", seed=0)
    first = cocktailer.compile(w.model, w.inputs, backend=backend)
    files = sorted(tmp_path.rglob("*"))

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran although the library is cached")
    monkeypatch.setattr(compiler.subprocess, "run", no_compiler)
    again = cocktailer.compile(w.model, w.inputs, backend=backend)
    assert sorted(tmp_path.rglob("*")) == files
    with torch.no_grad():
        assert_same(again(*w.inputs), first(*w.inputs), 0, 0)


def test_two_processes_compiling_the_same_model_share_the_cache(tmp_path):
    script = textwrap.dedent("""
        import torch, cocktailer
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()).eval()
        x = torch.randn(2, 6)
        with torch.no_grad():
            fast = cocktailer.compile(model, (x,), backend="cpu")
            assert torch.allclose(fast(x), model(x), atol=1e-5)
        print(fast.cache[next(iter(fast.cache))][1].library)
        print(cocktailer.runtime.interrupt.library_path)
    """)
    env = {**os.environ, "COCKTAILER_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err
    libraries = {out for out, _ in results}
    assert len(libraries) == 1   # the model's library, and the SIGINT counter's (runtime.interrupt)
    assert sorted(tmp_path.glob("*.so")) == sorted(Path(p) for p in libraries.pop().split())
    assert not list(tmp_path.glob("tmp*"))   # no half-written files left behind


def test_inputs_written_in_place_on_cpu_backend():
    def fill(cache, x):
        for i in range(x.shape[0]):
            cache[i] = x[i] * 2
        return cache.sum()
    cache, x = torch.zeros(4, 3), torch.randn(4, 3)
    fast = cocktailer.compile(fill, (cache.clone(), x), backend="cpu")
    mine, theirs = torch.zeros(4, 3), torch.zeros(4, 3)
    torch.testing.assert_close(fast(mine, x), fill(theirs, x))
    torch.testing.assert_close(mine, theirs)


def test_repeated_calls_give_identical_results_with_two_workers():
    """Races between workers show up as results that change from call to call: a stacked
    LSTM (GEMVs split across workers, barrier-free elementwise chains) 300 times."""
    w = models.make("lstm", batch=2, size="small", seed=0)
    fast = cocktailer.compile(w.model, w.inputs, backend="cpu", options={"workers": 2})
    with torch.no_grad():
        expected = w.model(*w.inputs)
        results = [fast(*w.inputs) for _ in range(300)]
    assert all(torch.equal(r, results[0]) for r in results)
    torch.testing.assert_close(results[0], expected, rtol=RTOL, atol=ATOL)


def _select_arms(a, b, c, n: int):
    for _ in range(n):
        if a.sum() > 0:            # arms that only choose values: nothing computed in them
            a, b, c = b, c, a
        else:
            a, b, c = c, a, b
        a.mul_(0.5)
    return a + b * c


BARRIER = "if (ct_wait(ct_team, W, err)) goto ct_fail;"
NEUTRAL = re.compile(r"if \(\*\(const uint8_t\*\).*\) \{|\} else \{|\}|if \(!\*\(const uint8_t\*\).*\) break;")


def test_no_barrier_follows_another_with_nothing_between():
    """A barrier orders work before it before work after it; a second one with only a branch on
    a condition already read between orders nothing (an arm that only yields values), and
    costs a grid barrier on a GPU. The program still matches eager."""
    torch.manual_seed(0)
    args = [torch.randn(5) for _ in range(3)] + [4]
    fast = cocktailer.compile(_select_arms, [a.clone() if isinstance(a, torch.Tensor) else a for a in args],
                              backend="cpu", options={"workers": 2})
    (_, compiled), = fast.cache.values()
    lines = [line.strip() for line in compiled.record.rendered.source.splitlines()]
    barriers = [k for k, line in enumerate(lines) if line == BARRIER]
    assert len(barriers) > 3
    for before, after in zip(barriers, barriers[1:]):
        between = lines[before + 1:after]
        assert not all(NEUTRAL.fullmatch(line) for line in between), "\n".join(lines[before:after + 1])
    assert_same(fast(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), _select_arms(*args),
                RTOL, ATOL, path="select arms")


def test_long_skeleton_compiled_without_optimizing_it(monkeypatch):
    """A traced graph's skeleton (tens of thousands of kernel calls) is compiled at -O0 so GCC
    finishes; its results stay the same. The threshold is lowered to reach it with a small model."""
    from cocktailer.codegen import renderer
    monkeypatch.setattr(renderer, "SKELETON_OPTIMIZE_LINES", 50)
    w = models.make("lstm", batch=2, size="small", seed=0)
    traced = cocktailer.compile_traced(w.model, w.inputs, backend="cpu")
    (_, compiled), = traced.cache.values()
    assert compiled.record.rendered.source.count('__attribute__((optimize("O0"))) int64_t cocktailer_run(') == 1
    with torch.no_grad():
        assert_same(traced(*w.inputs), w.model(*w.inputs), RTOL, ATOL, path="lstm")


def _mlp(x, w):
    return torch.tanh(torch.relu(x @ w) @ w.t()).sum(-1)


def _scaled_softmax(x):
    return torch.softmax(x.exp() * 2.0 + x, -1).sum(0)


def test_programs_called_one_after_another_on_a_thread_share_its_arena(monkeypatch):
    """Programs called one after another on a thread compute their intermediates in the
    thread's one arena (still in cache from the last call; an arena each would be cold memory
    at every call): a call of sizes that need more grows it, the others' next calls compute in
    the grown one and still match eager; another thread has an arena of its own."""
    import threading
    from cocktailer.runtime import native
    monkeypatch.setattr(native._ARENAS, "by_device", {}, raising=False)   # (earlier tests here grew it)
    torch.manual_seed(0)
    small = [torch.randn(7, 40), torch.randn(40, 40)]
    mlp = cocktailer.compile(_mlp, small, backend="cpu", dynamic=True)
    softmax = cocktailer.compile(_scaled_softmax, (torch.randn(5, 30),), backend="cpu", dynamic=True)
    with torch.no_grad():
        mlp(*small)
        softmax(torch.randn(5, 30))
    (_, first), = mlp.cache.values()
    (_, second), = softmax.cache.values()
    a, b = first.bind(small), second.bind([torch.randn(5, 30)])
    assert a.arena_bytes and b.arena_bytes   # both compute intermediates there
    assert a.arena.data_ptr() == b.arena.data_ptr()
    big = torch.randn(300, 900)   # a call that needs a larger arena than either had
    with torch.no_grad():
        assert_same(softmax(big), _scaled_softmax(big), RTOL, ATOL)
        grown = second.bind([big]).arena
        assert grown.numel() >= second.bind([big]).arena_bytes > a.arena.numel()
        assert first.bind(small).arena.data_ptr() == grown.data_ptr()
        assert_same(mlp(*small), _mlp(*small), RTOL, ATOL)
    other = []
    thread = threading.Thread(target=lambda: other.append(first.bind(small).arena.data_ptr()))
    thread.start()
    thread.join()
    assert other and other[0] != grown.data_ptr()


@pytest.mark.parametrize("mkl", [False, True])
def test_constant_weights_of_a_gemm_are_prepacked_and_repacked_when_changed(mkl, monkeypatch):
    """A GEMM's constant B is packed once, at load; writing the weights in place packs again.
    Where the tiles call MKL (`kernels.gemm.blas_tiles`) nothing is prepacked: MKL reads the
    weights where they are, written or not."""
    from cocktailer.codegen.kernels import gemm, matmul
    if mkl and not gemm.blas_available():
        pytest.skip("torch's library exports no sgemm_ here")
    monkeypatch.setattr(matmul, "blas_tiles", lambda: mkl)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(600, 100), nn.Tanh(), nn.Linear(100, 24)).eval()
    x = torch.randn(33, 600)   # rows enough for the GEMM path; depth in 3 packed blocks; partial panels
    fast = cocktailer.compile(model, (x,), backend="cpu")
    (_, compiled), = fast.cache.values()
    assert len(compiled.record.rendered.prepacked) == (0 if mkl else 2)
    with torch.no_grad():
        assert_same(fast(x), model(x), RTOL, ATOL)
        model[0].weight.mul_(-0.5)
        model[2].weight.add_(0.25)
        assert_same(fast(x), model(x), RTOL, ATOL)


def _warm(most: int):
    """An adaptive `Workers` past its first call (a cold call is no sample of either count)."""
    from cocktailer.runtime import native
    workers = native.Workers(most, adaptive=True)
    workers.report(most, 9, 1.0)
    return workers


def _time_to_probe(workers, each: float) -> float:
    """Report preempted calls of `each` seconds on the count it runs until it chooses to try
    the other count; the seconds of its own time that took (the clock its waits are on)."""
    best, spent = workers.choose(), 0.0
    while workers.choose() == best:
        workers.report(best, 1, each)
        spent += each
        assert spent < 100, "never tried the other count"
    return spent


def test_a_contended_program_runs_on_the_worker_count_that_has_been_faster():
    """Quiet: all workers. Once a call is preempted, half the workers are tried; the faster
    count runs, and the other is tried again after a wait that doubles each time it loses
    (at least 20 times what it took), counted in the program's own time; a call on all
    workers that nothing preempted ends it."""
    from cocktailer.runtime import native
    workers = _warm(4)
    workers.report(workers.choose(), 0, 0.001)
    assert workers.choose() == 4
    workers.report(4, 3, 0.010)             # preempted: contended, 2 workers are tried next
    assert workers.choose() == 2
    workers.report(2, 1, 0.004)             # faster: it runs, 4 is tried after 20 times what it took
    assert workers.choose() == 2 and workers.wait == 20 * 0.010
    assert workers.wait <= _time_to_probe(workers, 0.004) < workers.wait + 0.004
    assert workers.choose() == 4
    workers.report(4, 2, 0.1)               # lost again: twice the wait, or 20 times what it took
    assert workers.wait == 20 * 0.1 and workers.choose() == 2
    assert workers.wait <= _time_to_probe(workers, 0.004) < workers.wait + 0.004
    workers.report(4, 0, 0.001)             # nothing preempted it: quiet again
    assert workers.choose() == 4
    decoder = _warm(4)   # where all workers stay faster under contention
    decoder.report(4, 1, 0.005)
    assert decoder.choose() == 2
    decoder.report(2, 1, 0.009)
    assert decoder.choose() == 4 and decoder.wait == 20 * 0.009
    decoder.report(4, 0, 0.005)
    decoder.report(4, 1, 0.005)             # contended again: 2 waits its turn
    assert decoder.choose() == 4
    fixed = native.Workers(4, adaptive=False)   # uTasks placed on given workers
    fixed.report(4, 5, 0.001)
    assert fixed.choose() == 4


def test_a_program_called_now_and_then_is_not_tried_on_fewer_workers_at_every_preemption(monkeypatch):
    """A batched block runs once per layer of a long batch: between its calls the clock runs
    on, its own time hardly. Contention that comes and goes between its calls does not have it
    try half the workers again until it has spent 20 times what they took on its own calls
    (Berxit ran 17% of its blocks on one worker, twice as slow)."""
    from cocktailer.runtime import native
    now = [0.0]
    monkeypatch.setattr(native.time, "monotonic", lambda: now[0])
    block = _warm(2)
    block.report(2, 1, 0.010)
    assert block.choose() == 1
    block.report(1, 0, 0.020)               # one worker: twice as slow
    tried = 0
    for batch in range(40):                 # preempted at every other call, quiet between
        now[0] += 0.45                      # the rest of the batch
        used = block.choose()
        tried += used == 1
        block.report(used, batch % 2, 0.010 if used == 2 else 0.020)
    assert tried <= 1                        # 40 calls of 10 ms: 0.4 s of its time, 20 x 20 ms


def test_a_preemption_that_did_not_slow_the_call_starts_no_contention():
    """A call on all workers that the OS preempted for a moment, no slower than 1.5 times the
    quiet calls of late, keeps all workers (Berxit's blocks tried one worker at 8% of their
    calls, twice as slow each time); one that was slowed starts the contention."""
    workers = _warm(2)
    for seconds in (0.010, 0.011, 0.010):
        workers.report(2, 0, seconds)
    workers.report(2, 1, 0.014)
    assert workers.choose() == 2 and not workers.contended
    workers.report(2, 1, 0.016)
    assert workers.contended and workers.choose() == 1


def test_a_try_that_beats_the_count_that_runs_wins_over_its_own_older_samples():
    """All workers were slow while child processes started (two contended calls at 100 ms),
    so one worker ran (89 ms). Once they are idle, a try of all workers at 49 ms wins, though
    the median of its three samples would still be 100 ms: it kept a level loop on one worker."""
    from cocktailer.runtime import native
    workers = _warm(2)
    workers.report(2, 1, 0.100)
    workers.report(2, 1, 0.100)
    assert workers.choose() == 1
    workers.report(1, 0, 0.089)
    _time_to_probe(workers, 0.089)
    assert workers.choose() == 2
    workers.report(2, 1, 0.049)             # preempted, yet faster than one worker
    assert workers.choose() == 2 and list(workers.recent[2]) == [0.049]


def test_a_cold_first_call_does_not_choose_the_worker_count():
    """A batched TreeFC's level loop, built beside processes that kept every call preempted:
    its first call on two workers paid for fresh scratch (101 ms), one worker then took 92 ms
    and ran the next 24 calls, though two took 47 ms once warm."""
    from cocktailer.runtime import native
    workers = native.Workers(2, adaptive=True)
    workers.report(workers.choose(), 8, 0.101)   # cold: no sample, and no contention yet
    assert workers.choose() == 2 and not workers.contended
    workers.report(2, 1, 0.047)
    assert workers.choose() == 1                 # contended: one worker is tried
    workers.report(1, 0, 0.092)
    assert workers.choose() == 2


def test_a_contention_that_ended_leaves_neither_its_slow_times_nor_its_grown_wait():
    """On a machine busy now and then: a contention where all workers kept losing, then a
    quiet call. At the next preemption all workers are judged by that quiet call, not by the
    contended calls of before (which kept the RAE on one worker, 1.8 times slower)."""
    from cocktailer.runtime import native
    workers = _warm(2)
    workers.report(2, 1, 0.010)
    workers.report(1, 0, 0.001)
    for _ in range(5):                      # all workers keep losing: the wait grows
        _time_to_probe(workers, 0.001)
        assert workers.choose() == 2
        workers.report(2, 1, 0.010)
    assert workers.wait > 1.0
    _time_to_probe(workers, 0.001)
    workers.report(workers.choose(), 0, 0.0005)   # quiet again
    assert workers.wait == native.Workers.FIRST_WAIT
    workers.report(2, 1, 0.0008)            # preempted, yet faster than one worker (0.001)
    assert workers.choose() == 2


@pytest.mark.parametrize("name,options", [("treefc", {"fan_out": True}), ("lstm", {}), ("seq2seq", {})])
def test_results_do_not_depend_on_how_many_workers_a_call_gets(name, options):
    """A busy machine makes calls run on fewer workers than compiled for: same results, to
    the bit (a user's repeated call does not change with the machine's load)."""
    w = models.make(name, batch=1, size="small", seed=2)
    fast = cocktailer.compile(w.model, w.inputs, backend="cpu", options={"workers": 3, **options})
    _same_bits_on_any_workers(fast, w.inputs, w.model(*w.inputs), name)


def _same_bits_on_any_workers(fast, inputs, expected, name):
    (_, compiled), = fast.cache.values()
    with torch.no_grad():
        first = None
        for active in (3, 1, 2, 1):
            compiled.active_workers.choose = lambda: active
            out = fast(*[x.clone() for x in inputs])
            assert_same(out, expected, RTOL, ATOL, path=f"{name} on {active}")
            first = out if first is None else first
            assert_same(out, first, 0, 0, path=f"{name} on {active} against all workers")


@pytest.mark.parametrize("example,call", [(((3, 20, 16), (3, 36, 16)), ((3, 9, 16), (3, 50, 16))),
                                          (((33, 64), (40, 64)), ((9, 64), (70, 64)))])
def test_products_through_mkl_give_the_same_bits_on_fewer_workers(monkeypatch, example, call):
    """MKL's sgemm_ (the GEMM tiles where the CPU has no AVX-512) picks its kernel, and with it
    the order it sums in, by a call's sizes: the tiles are cut for the workers compiled for, and
    a call on fewer runs the same tiles. (Cut for the workers a call had, these products at
    sizes other than compiled for differed in the last bit on fewer workers.)"""
    from cocktailer.codegen.kernels import gemm, matmul
    if not gemm.blas_available():
        pytest.skip("torch's library has no sgemm_ here")
    monkeypatch.setattr(matmul, "blas_tiles", lambda: True)
    torch.manual_seed(0)
    fn = lambda a, b: a @ b.transpose(-1, -2)
    fast = cocktailer.compile(fn, [torch.randn(s) for s in example], backend="cpu", dynamic=True, options={"workers": 3})
    a, b = (torch.randn(s) for s in call)
    _same_bits_on_any_workers(fast, (a, b), fn(a, b), f"product at {call}")
    (_, compiled), = fast.cache.values()
    assert "sgemm_(" in compiled.record.rendered.source
