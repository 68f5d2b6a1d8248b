"""Runs the benchmark: for each workload, every system on the same inputs, each checked
against eager before it is timed; results go to results.json as they come."""
from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import pathlib
import signal
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from bench import contention, machine, report, roofline, status
from bench.compare import compare
from bench.results import ResultStore
from bench.status import NotTimed, Timeout, describe
from bench.subject import Subject
from bench.systems import System, all_systems, baseline_systems, quick_selection, select, step_systems
from bench.timing import FULL, Budget, measure, measure_interleaved, summarize

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


@dataclass
class RunConfig:
    name: str = "paper"
    models: list[str] | None = None            # None: every model of the zoo
    batches: tuple[int, ...] = (1, 64)
    systems: list[str] | None = None           # None: every system
    size: str = "paper"
    budget: Budget = FULL
    compile_timeout_s: float | None = 900.0    # preparing one system for one workload
    fresh: bool = False
    quick: bool = False
    seed: int = 0
    threads: int | None = None                 # None: every library's default (all cores)
    interleave: bool = False                   # time a workload's systems in rounds, not one after another
    baseline: str | None = None                # also run cocktailer systems from this git commit (interleaved)
    loads: tuple[int, ...] = ()                # quiet (0) and beside this many busy processes each (contention)
    out_dir: pathlib.Path | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def out(self) -> pathlib.Path:
        return self.out_dir or RESULTS / self.name


def load_zoo() -> tuple[Callable, Callable]:
    try:
        from cocktailer.models import make, names
    except ImportError as exc:
        raise SystemExit(f"the model zoo (cocktailer.models) cannot be imported: {exc}") from exc
    return names, make


def run(config: RunConfig, zoo: tuple[Callable, Callable] | None = None, progress: bool = True) -> dict:
    """Benchmark; `zoo` is (names, make) of cocktailer.models unless a test passes its own."""
    names, make = zoo or load_zoo()
    set_threads(config.threads)
    models = config.models or list(names())
    pool = all_systems() + (step_systems() if config.systems else [])   # the steps only when named
    systems = select(pool, config.systems)
    if config.baseline:
        systems += baseline_systems(config.baseline, systems)
    if config.quick and not config.systems:
        systems = quick_selection(systems)
    store = ResultStore(config.out / "results.json", _run_info(config), fresh=config.fresh)
    store.data["machine"] = {**machine.describe(), "measured": roofline.measure_machine(config.quick)}
    store.save()
    tasks = [(m, b) for m in models for b in config.batches]
    with torch.no_grad(), _progress(len(tasks) * len(systems), progress) as bar:
        for model, batch in tasks:
            _run_workload(model, batch, systems, config, store, make, bar)
    store.data["run"]["finished"] = _now()
    store.save()
    report.write(store.data, config.out)
    return store.data


def set_threads(threads: int | None):
    """Give every system `threads` threads: torch here, ONNX Runtime per session (Subject),
    XLA through its flags, which it reads when jax is first imported (one thread only)."""
    if not threads:
        return
    torch.set_num_threads(threads)
    if threads == 1 and "jax" not in sys.modules:
        flags = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def _run_info(config: RunConfig) -> dict:
    return {"name": config.name, "started": _now(), "argv": config.argv, "quick": config.quick,
            "threads": config.threads, "size": config.size, "batches": list(config.batches), "seed": config.seed,
            "budget": asdict(config.budget), "compile_timeout_s": config.compile_timeout_s,
            "interleave": config.interleave, "loads": list(config.loads), "baseline": config.baseline}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _run_workload(model: str, batch: int, systems: list[System], config: RunConfig, store: ResultStore, make, bar):
    key = f"{model}/b{batch}"
    todo = [s for s in systems if not store.done(key, s.name)]
    bar.update(len(systems) - len(todo))
    if not todo:
        return
    info = store.workload(key)
    info.update(model=model, batch=batch)
    built = _subject(model, batch, config, make, info)
    if built is None:
        store.save()
        bar.update(len(todo))
        return
    subject, expected = built
    info["roofline"] = _roofline(subject, store.data["machine"]["measured"])
    store.save()
    if config.interleave or config.loads or config.baseline:
        _run_interleaved(key, todo, subject, expected, config, store, info, bar, config.loads or (0,))
    else:
        for system in todo:
            bar.set_description(f"{key} {system.name}")
            subject.restore_inputs()
            entry = bench_system(system, subject, expected, config)
            _add_ratios(entry, info["roofline"])
            store.put(key, system.name, entry)
            bar.update(1)
    del subject, expected
    gc.collect()


def _subject(model: str, batch: int, config: RunConfig, make, info: dict) -> tuple[Subject, Any] | None:
    """The workload and its eager result (what every system must reproduce), or None with
    the reason in `info` when it cannot be built or run."""
    try:
        workload = make(model, batch, size=config.size, seed=config.seed)
    except Exception as exc:
        info["error"] = f"make({model!r}, {batch}) failed: {describe(exc)}"
        return None
    if batch != 1 and not getattr(workload, "batches", True):
        info["skipped"] = "the workload does not batch"
        return None
    info["config"] = _jsonable(getattr(workload, "config", {}))
    try:
        subject = Subject(workload, config.threads)
        subject.origin = (model, batch, config.size, config.seed)   # how a baseline process makes the same
        return subject, subject.eager()
    except Exception as exc:
        info["error"] = f"eager PyTorch failed: {describe(exc)}"
        return None


def _roofline(subject: Subject, measured: dict) -> dict:
    try:
        counts = roofline.count(subject.traced_program)
    except NotTimed as exc:
        return {"error": exc.reason}
    except Exception as exc:
        return {"error": describe(exc)}
    return {**counts, "bound_s": roofline.bound_seconds(counts, measured),
            "compute_s": counts["flops"] / measured["peak_flops"],
            "memory_s": counts["bytes"] / measured["bandwidth_bytes_s"]}


def _run_interleaved(key, systems, subject, expected, config, store, info, bar, loads=(0,)):
    """--interleave: prepare and check every system first, then time them in rounds, one run
    of each per round, so that a slow spell of a shared machine hits all of them alike; with
    --load, once per load level, beside that many busy processes."""
    ready, entries = [], {}
    for system in systems:
        bar.set_description(f"{key} {system.name}")
        subject.restore_inputs()
        entries[system.name], prepared = prepare_and_check(system, subject, expected, config)
        if prepared is not None:
            ready.append((system.name, prepared))
    for load in loads:
        with contention.busy(load):
            _time_in_rounds(ready, entries, config, load)
    for name in entries:
        _add_ratios(entries[name], info["roofline"])
        store.put(key, name, entries[name])
    bar.update(len(systems))


def _time_in_rounds(ready: list, entries: dict, config: RunConfig, load: int):
    base = {name: entries[name] for name, _ in ready}
    try:
        times = measure_interleaved([p.run for _, p in ready], config.budget)
    except Exception as exc:
        for name, _ in ready:
            entries[contention.loaded_name(name, load)] = {**base[name], "status": status.FAILED,
                                                           "reason": f"running: {describe(exc)}"}
        return
    for (name, _), samples in zip(ready, times):
        entries[contention.loaded_name(name, load)] = {**base[name], "status": status.OK, "interleaved": True,
                                                       "load": load, **summarize(samples), "times_s": samples}


def bench_system(system: System, subject: Subject, expected: Any, config: RunConfig) -> dict:
    """Prepare, check against eager, then time one system on one workload."""
    entry, prepared = prepare_and_check(system, subject, expected, config)
    if prepared is None:
        return entry
    try:
        times = measure(prepared.run, config.budget)
    except Exception as exc:
        return {**entry, "status": status.FAILED, "reason": f"running: {describe(exc)}"}
    return {**entry, "status": status.OK, **summarize(times), "times_s": times}


def prepare_and_check(system: System, subject: Subject, expected: Any, config: RunConfig) -> tuple[dict, Any]:
    """The entry so far and the prepared system, or the entry with why it is not timed and None."""
    entry: dict = {"kind": system.kind, "backend": system.backend, "traced": system.traced}
    try:
        system.require()
        start = time.perf_counter()
        with deadline(config.compile_timeout_s), quiet():
            prepared = system.prepare(subject)
            first = prepared.run()   # jit systems compile here: part of preparing, not of timing
        entry["prepare_s"] = time.perf_counter() - start
    except (NotTimed, Timeout) as exc:
        return {**entry, "status": exc.status, "reason": exc.reason}, None
    except Exception as exc:
        return {**entry, "status": status.FAILED, "reason": f"preparing: {describe(exc)}"}, None
    entry["info"] = _jsonable(prepared.info())
    check = compare(prepared.to_result(first), expected)
    entry["check"] = check.to_json()
    if not check.passed:
        return {**entry, "status": status.WRONG, "reason": check.detail}, None
    return entry, prepared


def _add_ratios(entry: dict, roof: dict):
    if entry.get("status") == status.OK and "bound_s" in roof:
        entry["roofline_fraction"] = roof["bound_s"] / entry["median_s"]


@contextlib.contextmanager
def quiet():
    """Compilers log and warn while they prepare (Dynamo's graph-break warnings, scripting's
    deprecation); what matters of it ends up in the entry's reason or info, not on screen."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Raise Timeout in this thread after `seconds` (main thread only: signals)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise Timeout(f"preparing took longer than {seconds:g} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _jsonable(value, depth: int = 0):
    """A workload's config for the JSON: tensors as their type, long lists (the tree models'
    per-instance inputs) as their length."""
    if isinstance(value, torch.Tensor):
        return f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if len(value) > 16 or depth > 3:
            return f"<{len(value)} items>"
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


class _PlainBar:
    """A stand-in for tqdm when it is not installed: one line per workload on stderr."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.n, self.desc, self.quiet = total, 0, "", quiet

    def update(self, n: int = 1):
        self.n += n

    def set_description(self, desc: str):
        if not self.quiet and desc.split(" ")[0] != self.desc.split(" ")[0]:
            print(f"[{self.n}/{self.total}] {desc.split(' ')[0]}", file=sys.stderr, flush=True)
        self.desc = desc


@contextlib.contextmanager
def _progress(total: int, enabled: bool):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None or not enabled:
        yield _PlainBar(total, quiet=not enabled)
    else:
        with tqdm(total=total, unit="system", dynamic_ncols=True) as bar:
            yield bar
