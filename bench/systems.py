"""The systems under test. Each prepares one workload (compile, script, export, port) and
gives back a zero-argument `run` for one inference; the runner checks and times it.

Peers: PyTorch eager, TorchScript, torch.compile (Inductor), JAX jit, ONNX Runtime. Ours:
cocktailer on every backend in cocktailer.BACKENDS. The lower bound: the traced graph
(control flow resolved for these inputs) on every backend; on "reference" it is the
straight-line graph run op by op with torch, i.e. eager without control flow.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

import cocktailer
from cocktailer.api import NATIVE
from cocktailer.runtime.cache import CACHE_VARIABLE
from bench import machine
from bench.status import Missing, Unsupported, describe
from bench.subject import Subject

PEER, OURS, TRACED = "peer", "cocktailer", "traced"
JAX = ("jax", "jaxlib")


@dataclass
class Prepared:
    run: Callable[[], Any]                                        # one inference, blocking until done
    to_result: Callable[[Any], Any] = field(default=lambda out: out)   # run's output as eager's structure
    info: Callable[[], dict] = field(default=dict)   # after the first run: how the system ran it


@dataclass(frozen=True)
class System:
    name: str
    kind: str                                   # PEER, OURS or TRACED
    prepare: Callable[[Subject], Prepared]
    packages: tuple[str, ...] = ()              # importable names the peer needs
    backend: str | None = None                  # the cocktailer backend (OURS, TRACED)
    traced: str | None = None                   # the traced graph its time is compared with
    options: dict | None = None                 # OURS: cocktailer.compile's options

    def require(self):
        for package in self.packages:
            if importlib.util.find_spec(package) is None:
                raise Missing(package)


def all_systems() -> list[System]:
    eager_traced = "traced:reference"   # the straight-line graph run op by op with torch
    peers = [System("eager", PEER, _eager, traced=eager_traced),
             System("torchscript", PEER, _torchscript, traced=eager_traced),
             System("torch.compile", PEER, _torch_compile, traced=eager_traced),
             System("jax", PEER, _jax, JAX, traced="traced:jax"),
             System("onnxruntime", PEER, _onnxruntime, ("onnx", "onnxruntime"), traced=eager_traced)]
    ours = [System(f"cocktailer:{b}", OURS, _cocktailer(b), backend=b, traced=f"traced:{b}")
            for b in cocktailer.BACKENDS]
    traced = [System(f"traced:{b}", TRACED, _traced(b), backend=b) for b in cocktailer.BACKENDS]
    # JAX on the traced graph too: the paper's Figures 15/16/18 compare each framework with
    # its own traced graph, and the port makes that one line.
    traced.append(System("traced:jax", TRACED, _traced_jax, JAX))
    return peers + ours + traced


# Figure 19 of the paper, on this machine: the cocktailer cpu backend step by step, each step
# on top of the previous one; and its scaling from one worker thread to two. Run only when
# named (`--systems eager,fig19,scaling`), not in the default run.
def _measured(*steps: str) -> dict:
    return {"policy": "measured", "steps": ("host level", "control flow at L1", *steps)}


STEPS = [
    ("fig19:host", "host", {}),                               # control flow in Python (CocktailerBase)
    # Algorithm 1's first moves: constructs nested deeper than the function body at L1 in native
    # blocks, the outermost still on the host (the same as fig19:host where nothing is nested)
    ("fig19:nested-at-L1", "cpu", {"policy": "measured", "steps": ("host level", "nested constructs at L1")}),
    ("fig19:L1", "cpu", {"rewrite": False}),                  # control flow at L1, the simple policy
    ("fig19:+distribute+hoist", "cpu", {}),                   # + loop distribution, hoisted projections
    # + the measured policy's steps, one more each time, each kept only if it measures faster
    ("fig19:+resource", "cpu", _measured("SetResource")),
    ("fig19:+recursion-unroll", "cpu", _measured("SetResource", "recursion unroll")),
    ("fig19:+loop-unroll", "cpu", _measured("SetResource", "recursion unroll", "loop unroll")),
    ("fig19:+wavefront", "cpu", _measured("SetResource", "recursion unroll", "loop unroll", "wavefront")),
    ("fig19:+fine-barriers", "cpu", {"policy": "measured"}),   # every step, fine-grained barriers last
    ("scaling:1", "cpu", {"workers": 1}),
    ("scaling:2", "cpu", {"workers": 2}),
]


def step_systems() -> list[System]:
    """Run only when named. Besides the steps: `cocktailer:cpu:dynamic`, every size symbolic
    where the program allows it (a tree's node count), to compare with the static program."""
    return [System(name, OURS, _cocktailer(backend, options), backend=backend, options=options)
            for name, backend, options in STEPS] + \
        [System("cocktailer:cpu:dynamic", OURS, _cocktailer("cpu", dynamic=True), backend="cpu")]


def baseline_systems(ref: str, systems: list[System]) -> list[System]:
    """`<system>@<ref>` for each cocktailer system: the same compile in the cocktailer of
    commit `ref`, run by a process of its own (bench/peer.py) and timed there, interleaved
    with this one's."""
    from bench.peer import Peer
    peer: list = []

    def prepare(system: System, subject: Subject) -> Prepared:
        if not peer:
            peer.append(Peer(ref, str(machine.REPO)))
        model, batch, size, seed = subject.origin
        peer[0].ask("prepare", model, batch, size, seed, system.backend, system.options)
        run = lambda: peer[0].ask("run")   # noqa: E731
        run.reports_seconds = True          # timed in the peer process: no pipe in the number
        return Prepared(run, to_result=lambda _: peer[0].ask("output"))
    return [System(f"{s.name}@{ref}", OURS, functools.partial(prepare, s), backend=s.backend, options=s.options)
            for s in systems if s.kind == OURS]


def select(systems: list[System], wanted: list[str] | None) -> list[System]:
    """--systems: exact names, or a family ("cocktailer", "traced") for all its backends."""
    if not wanted:
        return systems
    known = {s.name for s in systems} | {s.name.split(":")[0] for s in systems}
    unknown = [w for w in wanted if w not in known]
    if unknown:
        raise SystemExit(f"unknown system(s) {', '.join(unknown)}; known: {', '.join(s.name for s in systems)}")
    return [s for s in systems if s.name in wanted or s.name.split(":")[0] in wanted]


def quick_selection(systems: list[System]) -> list[System]:
    """--quick: every peer and every cocktailer backend, but the traced graph only eagerly and
    in JAX: compiling each model's unrolled graph again per compiled backend would take
    most of the few minutes --quick has (the full run does it)."""
    return [s for s in systems if s.kind != TRACED or s.backend in (None, "reference")]


def _eager(subject: Subject) -> Prepared:
    model, inputs = subject.model, subject.inputs
    return Prepared(lambda: model(*inputs))


def _torchscript(subject: Subject) -> Prepared:
    try:
        scripted = torch.jit.script(subject.model)
    except Exception as exc:   # recursion, unsupported Python: TorchScript says why
        raise Unsupported(f"torch.jit.script: {describe(exc)}") from exc
    inputs = subject.inputs
    return Prepared(lambda: scripted(*inputs))


def _torch_compile(subject: Subject) -> Prepared:
    from torch._dynamo.utils import counters
    torch._dynamo.reset()   # each workload compiles from scratch, within its own time budget
    counters.clear()
    compiled = torch.compile(subject.model)
    inputs = subject.inputs
    return Prepared(lambda: compiled(*inputs), info=lambda: _dynamo_info(counters))


def _dynamo_info(counters) -> dict:
    """How much torch.compile really compiled: at a data-dependent branch Dynamo breaks the
    graph, and a break inside a loop makes it skip the whole frame and run it eagerly. Such
    a run is still torch.compile's result for the model, but the table says so."""
    graphs = counters["stats"].get("unique_graphs", 0)
    reasons = {**counters["unimplemented"], **counters["graph_break"]}
    kinds = sorted({reason.strip().splitlines()[0] for reason in reasons})   # first line: the kind of break
    info = {"graphs": graphs, "graph_breaks": sum(reasons.values()), "break_kinds": kinds}
    if graphs == 0:
        info["note"] = f"nothing compiled, ran eagerly ({'; '.join(kinds) or 'no graph'})"
    elif reasons:
        info["note"] = f"{graphs} graphs, {info['graph_breaks']} graph breaks ({'; '.join(kinds)})"
    return info


def _jax(subject: Subject) -> Prepared:
    return _jax_port(subject, subject.program)


def _traced_jax(subject: Subject) -> Prepared:
    return _jax_port(subject, subject.traced_program)


def _jax_port(subject: Subject, program) -> Prepared:
    from bench.jax_ports import JaxPort, structured   # imports jax: only once it is known to be there
    port = JaxPort(program)
    args = port.inputs(subject.tensors)
    return Prepared(lambda: port(args), lambda outs: structured(program, outs, subject.tensors), port.info)


def _onnxruntime(subject: Subject) -> Prepared:
    from bench.onnx_port import OnnxPort
    port = OnnxPort(subject)
    return Prepared(port.run, info=lambda: port.info)


def _cocktailer(backend: str, options: dict | None = None, dynamic: bool | None = None) -> Callable[[Subject], Prepared]:
    def prepare(subject: Subject) -> Prepared:
        build = lambda: cocktailer.compile(subject.model, subject.inputs, backend=backend, options=options,
                                           dynamic=dynamic)
        fast, times = _compile_times(build, backend)
        inputs = subject.inputs
        return Prepared(lambda: fast(*inputs), info=lambda: {**times, **_policy_info(fast)})
    return prepare


def _policy_info(fast) -> dict:
    """What the measured policy chose and the candidates it timed (empty for other policies)."""
    (_, executable), = fast.cache.values()
    trials = getattr(executable, "trials", None)
    if trials is None:
        return {}
    return {"note": f"chose: {executable.candidate}",
            "trials": [{"step": t.step, "candidate": str(t.candidate), "seconds": t.seconds, "error": t.error,
                        "kept": t.kept} for t in trials]}


def _traced(backend: str) -> Callable[[Subject], Prepared]:
    def prepare(subject: Subject) -> Prepared:
        if backend == "reference":
            traced, times = subject.traced, {}
        else:
            build = lambda: cocktailer.compile_traced(subject.model, subject.inputs, backend=backend)
            traced, times = _compile_times(build, backend)
        inputs = subject.inputs
        return Prepared(lambda: traced(*inputs), info=lambda: times)
    return prepare


def _compile_times(build: Callable[[], Any], backend: str) -> tuple[Any, dict]:
    """Build twice and time both: cold, into an empty library cache (capture, passes,
    schedule, code generation and the C compiler), then cached, the same model compiled again
    with its library already on disk. The second build is the one that runs."""
    try:
        if backend not in NATIVE:
            return build(), {}
        with tempfile.TemporaryDirectory(prefix="cocktailer-bench-") as cache, _environ(CACHE_VARIABLE, cache):
            start = time.perf_counter()
            build()
            cold = time.perf_counter() - start
            start = time.perf_counter()
            compiled = build()
            return compiled, {"compile_cold_s": cold, "compile_cached_s": time.perf_counter() - start}
    except cocktailer.UnsupportedError as exc:
        raise Unsupported(f"cocktailer: {describe(exc)}") from exc


@contextlib.contextmanager
def _environ(name: str, value: str):
    saved = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            del os.environ[name]
        else:
            os.environ[name] = saved
