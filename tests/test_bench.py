"""The benchmark harness (bench/): its quick path on tiny stand-in models, in-process, with
one or two repetitions; the structure of what it writes; the flop/byte counter on programs
small enough to count by hand. Nothing here times anything or asserts on speed."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # bench/ is a top-level package

import cocktailer  # noqa: E402
from cocktailer.runtime.compiler import find_compiler  # noqa: E402
from bench import roofline, status  # noqa: E402
from bench.runner import RunConfig, run  # noqa: E402
from bench.timing import Budget  # noqa: E402

HIDDEN = 8
NODES = 7


class LoopBranch(nn.Module):
    """A loop over time steps with a data-dependent branch in its body."""

    def __init__(self):
        super().__init__()
        self.cell = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x, h):
        for t in range(x.shape[0]):
            h = torch.tanh(self.cell(torch.cat([x[t], h], -1)))
            if h.sum() > 0:
                h = h * 0.5
        return h


class TinyRAE(nn.Module):
    """Recursion over a tree given as child-index tensors: TorchScript cannot script it."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        a = self.forward(left, right, is_leaf, inp, left[root])
        b = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.enc(torch.cat([a, b], -1)))


@dataclass
class Workload:   # the contract of cocktailer.models.make's result
    name: str
    model: nn.Module
    inputs: tuple
    batch: int
    config: dict = field(default_factory=dict)
    batches: bool = True


def make(name: str, batch: int = 1, *, size: str = "small", seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    if name == "loopbranch":
        return Workload(name, LoopBranch().eval(), (torch.randn(4, batch, HIDDEN), torch.randn(batch, HIDDEN)),
                        batch, {"steps": 4})
    # ((0 1) 2) as nodes: leaves 0, 1, 2; node 3 = (0, 1); root 4 = (3, 2); 5, 6 padding
    left = torch.tensor([-1, -1, -1, 0, 3, -1, -1])
    right = torch.tensor([-1, -1, -1, 1, 2, -1, -1])
    is_leaf = torch.tensor([True, True, True, False, False, True, True])
    return Workload(name, TinyRAE().eval(), (left, right, is_leaf, torch.randn(NODES, HIDDEN), torch.tensor(4)),
                    1, {"nodes": 5}, batches=False)


ZOO = (lambda: ["loopbranch", "tinyrae"], make)
ONE_RUN = Budget(warmup=1, min_runs=1, min_seconds=0.0, max_runs=2, max_seconds=0.0)
PEERS = ["eager", "torchscript", "torch.compile", "jax", "onnxruntime"]


def _without(monkeypatch, *packages):
    """Make the harness see these packages as not installed."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in packages else real(name, *a))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run of both stand-ins on every system but torch.compile (whose C++ build
    alone would take most of this file's time budget); jax and onnxruntime are made to look
    missing here so the result does not depend on what this machine has installed."""
    out = tmp_path_factory.mktemp("bench") / "quick"
    mp = pytest.MonkeyPatch()
    _without(mp, "jax", "onnxruntime")
    try:
        systems = [s for s in PEERS if s != "torch.compile"] + ["cocktailer", "traced"]
        config = RunConfig(name="quick", size="small", batches=(1, 64), systems=systems, budget=ONE_RUN,
                           quick=True, out_dir=out, compile_timeout_s=120)
        data = run(config, zoo=ZOO, progress=False)
    finally:
        mp.undo()
    return out, data


def test_quick_run_writes_results_table_and_figures(quick_run):
    out, data = quick_run
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["workloads"].keys() == data["workloads"].keys() == {"loopbranch/b1", "loopbranch/b64",
                                                                       "tinyrae/b1", "tinyrae/b64"}
    m = on_disk["machine"]
    assert m["cores"] >= 1 and m["cpu"] and m["memory_bytes"] and m["versions"]["torch"] == torch.__version__
    assert {"python", "numpy", "jax", "onnxruntime"} <= m["versions"].keys()   # None where not installed
    assert {"commit", "dirty"} <= m["git"].keys()
    assert m["measured"]["bandwidth_bytes_s"] > 0 and m["measured"]["peak_flops"] > 0
    table = (out / "table.md").read_text()
    for name in ["eager", "torchscript", "jax", "onnxruntime", *(f"cocktailer:{b}" for b in cocktailer.BACKENDS),
                 *(f"traced:{b}" for b in cocktailer.BACKENDS)]:
        assert name in table
    assert "× fastest peer" in table and "/ traced" in table and "roofline" in table
    pytest.importorskip("matplotlib")
    assert (out / "fig14.png").stat().st_size > 0 and (out / "fig_traced.png").stat().st_size > 0


def test_every_system_checked_against_eager_before_timing(quick_run):
    _, data = quick_run
    for key, w in data["workloads"].items():
        if key == "tinyrae/b64":
            continue
        for name, e in w["systems"].items():
            if e["status"] == status.OK:
                assert e["check"]["passed"] and e["check"]["max_abs_diff"] < 1e-3, (key, name)
                assert 1 <= e["runs"] == len(e["times_s"]) <= 2
                assert e["p10_s"] <= e["median_s"] <= e["p90_s"]
                assert 0 < e["roofline_fraction"]
    loop = data["workloads"]["loopbranch/b1"]["systems"]
    assert loop["eager"]["status"] == loop["cocktailer:reference"]["status"] == status.OK
    assert loop["traced:reference"]["status"] == status.OK


def test_native_backends_report_cold_and_cached_compile_times(quick_run):
    out, data = quick_run
    if find_compiler() is None:
        pytest.skip("no C compiler: the native backends fall back to the reference backend")
    for name in ("cocktailer:cpu", "traced:cpu", "cocktailer:host"):
        info = data["workloads"]["loopbranch/b1"]["systems"][name]["info"]
        assert info["compile_cold_s"] > 0 and info["compile_cached_s"] > 0, name
    assert "compile_cold_s" not in data["workloads"]["loopbranch/b1"]["systems"]["cocktailer:reference"]["info"]
    assert "## Compile time (s)" in (out / "table.md").read_text()


def test_unsupported_and_missing_have_reasons(quick_run):
    _, data = quick_run
    rae = data["workloads"]["tinyrae/b1"]["systems"]
    assert rae["torchscript"]["status"] == status.UNSUPPORTED
    assert "torch.jit.script" in rae["torchscript"]["reason"]
    for peer in ("jax", "onnxruntime"):
        assert rae[peer]["status"] == status.MISSING
        assert status.INSTALL_HINT in status.label(rae[peer]["status"], rae[peer]["reason"])
    table = (quick_run[0] / "table.md").read_text()
    assert "missing (pip install -e .[bench])" in table and "unsupported: torch.jit.script" in table
    assert data["workloads"]["tinyrae/b64"]["skipped"] == "the workload does not batch"


def test_wrong_result_is_reported_not_timed(tmp_path, monkeypatch):
    from bench import systems as systems_module
    real = systems_module._eager
    monkeypatch.setattr(systems_module, "_eager", lambda s: systems_module.Prepared(
        lambda: real(s).run() + 1.0))
    config = RunConfig(models=["loopbranch"], batches=(1,), systems=["eager"], budget=ONE_RUN, out_dir=tmp_path,
                       quick=True)
    entry = run(config, zoo=ZOO, progress=False)["workloads"]["loopbranch/b1"]["systems"]["eager"]
    assert entry["status"] == status.WRONG and not entry["check"]["passed"] and "times_s" not in entry


def test_resume_skips_entries_already_measured(tmp_path, monkeypatch):
    config = RunConfig(models=["loopbranch"], batches=(1,), systems=["eager"], budget=ONE_RUN, out_dir=tmp_path,
                       quick=True)
    first = run(config, zoo=ZOO, progress=False)["workloads"]["loopbranch/b1"]["systems"]["eager"]
    from bench import runner
    monkeypatch.setattr(runner, "bench_system", lambda *a: pytest.fail("re-ran a measured system"))
    again = run(config, zoo=ZOO, progress=False)["workloads"]["loopbranch/b1"]["systems"]["eager"]
    assert again["times_s"] == first["times_s"]


def test_jax_port_matches_eager():
    pytest.importorskip("jax")
    from bench.jax_ports import JaxPort, structured
    from bench.compare import compare
    for name in ZOO[0]():
        w = make(name)
        program = cocktailer.capture(w.model, w.inputs)
        port = JaxPort(program)
        tensors = [x for x in w.inputs if isinstance(x, torch.Tensor)]
        with torch.no_grad():
            expected = w.model(*w.inputs)
        assert compare(structured(program, port(port.inputs(tensors)), tensors), expected).passed, name


# -- the flop and byte counter, on programs counted by hand ------------------------------------

def _traced_program(model, inputs):
    return cocktailer.compile_traced(model, inputs, backend="reference").specialize(*inputs)


def test_count_linear_layer():
    batch, fan_in, fan_out = 3, 5, 7
    torch.manual_seed(0)
    layer = nn.Linear(fan_in, fan_out)
    counts = roofline.count(_traced_program(layer, (torch.randn(batch, fan_in),)))
    # matmul 2*B*in*out, bias add B*out
    assert counts["flops"] == 2 * batch * fan_in * fan_out + batch * fan_out
    weights = 4 * (fan_in * fan_out + fan_out)
    # reads weights and input; writes the matmul's and the add's outputs (the transpose is a view)
    assert counts["bytes"] == weights + 4 * batch * fan_in + 2 * 4 * batch * fan_out
    assert counts["bytes_min"] == weights + 4 * batch * fan_in + 4 * batch * fan_out


def test_count_conv2d_and_unrolled_loop():
    conv = nn.Conv2d(3, 4, kernel_size=3, padding=1, bias=False)
    counts = roofline.count(_traced_program(conv, (torch.randn(2, 3, 8, 8),)))
    assert counts["flops"] == 2 * 2 * 4 * 8 * 8 * 3 * 3 * 3   # 2*N*Cout*Hout*Wout*Cin*kh*kw

    class Steps(nn.Module):
        def forward(self, x):
            for _ in range(5):
                x = torch.tanh(x)
            return x
    counts = roofline.count(_traced_program(Steps(), (torch.randn(4, 6),)))
    assert counts["flops"] == 5 * 24 and counts["bytes"] == 4 * 24 * (1 + 5)


def test_bound_is_the_slower_of_compute_and_memory():
    machine = {"peak_flops": 1e9, "bandwidth_bytes_s": 1e8}
    assert roofline.bound_seconds({"flops": 2e9, "bytes": 1e8}, machine) == 2.0
    assert roofline.bound_seconds({"flops": 1e6, "bytes": 5e8}, machine) == 5.0


def test_throughput_floor_counts_the_eager_loops_products_and_names_what_10x_cannot_reach():
    from bench.batching import _goals, matmul_flops
    layer = nn.Linear(5, 7)
    instances = [(torch.randn(n, 5),) for n in (1, 3, 4)]
    assert matmul_flops(layer, instances) == 2 * (1 + 3 + 4) * 5 * 7   # the bias add is not a product

    def tree(model, eager_s, batch_s, flops):
        return {"model": model, "hidden": 256, "batch": 64, "matmul_flops": flops,
                "systems": {"eager": {"median_s": eager_s}, "batch": {"median_s": batch_s}}}
    # at 1 GFLOP/s: rae's eager loop takes 20 floors, mvrnn's 4
    goals = _goals([tree("rae", 2.0, 0.1, 1e8), tree("mvrnn", 2.0, 1.0, 5e8)], peak_flops=1e9)[-1]
    assert "10x possible at this machine's matmul peak on 1 of 2, reached on 1 of them" in goals
    assert "out of reach for a system running the eager loop's products: mvrnn/256 (eager 4.0 floors)" in goals


def test_step_by_step_systems_run_only_when_named():
    from bench.systems import all_systems, select, step_systems
    assert not any(s.name.startswith(("fig19:", "scaling:")) for s in select(all_systems(), None))
    names = [s.name for s in select(all_systems() + step_systems(), ["fig19", "scaling"])]
    assert names == ["fig19:host", "fig19:nested-at-L1", "fig19:L1", "fig19:+distribute+hoist", "fig19:+resource", "fig19:+recursion-unroll",
                     "fig19:+loop-unroll", "fig19:+wavefront", "fig19:+fine-barriers", "scaling:1", "scaling:2"]


def test_interleaved_timing_gives_every_system_its_runs():
    from bench.timing import measure_interleaved
    calls = {"a": 0, "b": 0}

    def count(name):
        def run():
            calls[name] += 1
        return run
    times = measure_interleaved([count("a"), count("b")], Budget(warmup=1, min_runs=4, min_seconds=0, max_seconds=5))
    assert [len(t) for t in times] == [4, 4] and calls == {"a": 5, "b": 5}


def test_interleaved_run_times_systems_in_rounds(tmp_path, monkeypatch):
    from bench import systems as systems_module
    real = systems_module._eager
    monkeypatch.setattr(systems_module, "_eager", lambda s: systems_module.Prepared(lambda: real(s).run() + 1.0))
    config = RunConfig(models=["loopbranch"], batches=(1,), systems=["eager", "cocktailer:reference", "traced:reference"],
                       budget=ONE_RUN, out_dir=tmp_path, quick=True, interleave=True)
    systems = run(config, zoo=ZOO, progress=False)["workloads"]["loopbranch/b1"]["systems"]
    assert systems["eager"]["status"] == status.WRONG and "times_s" not in systems["eager"]   # checked, not timed
    for name in ("cocktailer:reference", "traced:reference"):
        assert systems[name]["status"] == status.OK and systems[name]["interleaved"]
        assert len(systems[name]["times_s"]) == systems[name]["runs"] >= 1


def test_load_levels_time_every_system_quiet_and_beside_busy_processes(tmp_path):
    config = RunConfig(models=["loopbranch"], batches=(1,), systems=["eager", "cocktailer:reference"],
                       budget=ONE_RUN, out_dir=tmp_path, quick=True, loads=(0, 1))
    systems = run(config, zoo=ZOO, progress=False)["workloads"]["loopbranch/b1"]["systems"]
    assert set(systems) == {"eager", "eager +1 busy", "cocktailer:reference", "cocktailer:reference +1 busy"}
    assert all(e["status"] == status.OK and e["runs"] >= 1 for e in systems.values())
    assert systems["eager +1 busy"]["load"] == 1
    assert "## Under load" in (tmp_path / "table.md").read_text()


def test_a_baseline_commit_runs_in_a_process_of_its_own_and_times_itself():
    """--baseline: the cocktailer of another commit (here this one's HEAD) compiles the same
    zoo model in its own process and reports the seconds of each run it is asked for."""
    import subprocess
    from bench.machine import REPO
    from bench.peer import Peer, resolve
    if find_compiler() is None or subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"],
                                                 capture_output=True).returncode:
        pytest.skip("needs a C compiler and a git checkout")
    peer = Peer(resolve("HEAD", str(REPO)), str(REPO))
    try:
        peer.ask("prepare", "rae", 1, "small", 0, "cpu", None)
        assert peer.ask("run") > 0
        from cocktailer import models
        w = models.make("rae", 1, size="small", seed=0)
        with torch.no_grad():
            assert torch.allclose(peer.ask("output"), w.model(*w.inputs), atol=1e-5)
        with pytest.raises(RuntimeError, match="the baseline .* failed"):
            peer.ask("prepare", "no-such-model", 1, "small", 0, "cpu", None)
    finally:
        peer.close()


def test_interleaved_rounds_do_not_always_run_the_systems_in_the_same_order():
    """A call slows the call after it: no system may always follow the same one."""
    from bench.timing import Budget, measure_interleaved
    calls: list[str] = []
    fns = [lambda name=name: calls.append(name) for name in "abc"]
    times = measure_interleaved(fns, Budget(warmup=0, min_runs=30, min_seconds=0.0, max_runs=30))
    assert [len(t) for t in times] == [30, 30, 30]
    rounds = [tuple(calls[k:k + 3]) for k in range(0, len(calls), 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)
    after = {(x, y) for r in rounds for x, y in zip(r, r[1:])}
    assert {(x, y) for x in "abc" for y in "abc" if x != y} <= after


@pytest.mark.skipif(find_compiler() is None, reason="no C compiler")
def test_the_gpu_comparison_rehearses_here_without_a_gpu(tmp_path):
    """bench.gpu is the one command a lent GPU runs: here it runs end to end on the CPU (the cuda
    backend on a virtual GPU), records what cannot run with its reason, and writes its files."""
    from bench import gpu
    gpu.main(["--device", "cpu", "--quick", "--size", "small", "--models", "lstm,rae",
              "--systems", "eager,cuda graph,jax,cocktailer", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert [m["model"] for m in data["models"]] == ["lstm", "rae"]
    for m in data["models"]:
        rows = m["systems"]
        assert rows["cuda graph"] == {"status": "not run", "reason": "needs a GPU"}
        for name in ["eager", "cocktailer"]:
            assert rows[name]["status"] == "ok" and rows[name]["check"]["passed"]
            assert rows[name]["runs"] == len(rows[name]["seconds"]) >= 1
        assert rows["jax"]["status"] in {"ok", "not run"}
    assert data["gpu"]["device"].startswith("cpu") and data["machine"]["git"]
    table = (tmp_path / "table.md").read_text()
    assert "| lstm b1 |" in table and "not run: needs a GPU" in table
    # each model in a process of its own, as on a lent GPU (a kernel that never returns stops there)
    gpu.main(["--device", "cpu", "--quick", "--size", "small", "--models", "lstm", "--systems", "eager,cuda graph",
              "--model-timeout", "300", "--out", str(tmp_path / "isolated")])
    (isolated,) = json.loads((tmp_path / "isolated" / "results.json").read_text())["models"]
    assert isolated["systems"]["eager"]["check"]["passed"] and isolated["systems"]["cuda graph"]["status"] == "not run"
