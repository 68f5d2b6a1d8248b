"""The whole GPU comparison in one command (Cocktailer's Figure 14): per zoo model, one
inference's latency on a GPU for eager PyTorch, eager replayed as a CUDA graph, torch.compile
(default and "reduce-overhead", Inductor's CUDA graphs), JAX on the GPU (the IR ported to jitted
JAX functions, control flow on the host) and cocktailer's cuda backend (one persistent kernel;
a block per SM, and a smaller grid).

Every system's result is checked against eager's before it is timed; a system that cannot run
a model (a CUDA graph cannot hold a host round trip) is recorded with its reason, not dropped.
Timing is interleaved (one call of each system per round, in a shuffled order), each call ending
in a device synchronization. Results are written after every model (so a run stopped at its time
limit still leaves what it measured): results.json (machine, GPU, driver, versions, commit, raw
timings) and table.md.

    python -m bench.gpu --model-timeout 240 --out bench/results/gpu-<commit>
    python -m bench.gpu --device cpu --quick --out /tmp/rehearsal   # the same script without a GPU:
        # cocktailer on a virtual GPU, no CUDA graphs; checks the script, measures nothing of a GPU
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

import cocktailer
from bench import machine
from bench.compare import compare
from bench.results import json_safe, write_small_run
from bench.timing import FULL, QUICK, measure_interleaved, summarize
from cocktailer import models


@dataclass(frozen=True)
class GpuSystem:
    name: str
    prepare: Callable[[Any, tuple, torch.device], Callable[[], Any]]   # (model, inputs, device) -> one call


class NotRun(Exception):
    """This system cannot run this model here (the message says why)."""


def _synchronized(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    def run():
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out
    return run


def _eager(model, inputs, device):
    return lambda: model(*inputs)


def _cuda_graph(model, inputs, device):
    """Eager's kernels captured once and replayed: what a user gets from CUDA graphs by hand.
    Capture fails where the model reads a value back to decide its control flow."""
    if device.type != "cuda":
        raise NotRun("needs a GPU")
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):   # warm-up on a side stream, as capture requires
            model(*inputs)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            static_out = model(*inputs)
    except Exception as e:
        raise NotRun(f"capture failed: {str(e).splitlines()[0][:200]}") from e

    def replay():
        graph.replay()
        return static_out
    return replay


def _torch_compile(mode: str | None):
    def prepare(model, inputs, device):
        torch._dynamo.reset()
        compiled = torch.compile(model, mode=mode)
        return lambda: compiled(*inputs)
    return prepare


def _jax(model, inputs, device):
    try:
        import jax
        from bench.jax_ports import JaxPort, structured
    except ImportError as e:
        raise NotRun(f"missing {e.name}") from e
    if device.type == "cuda" and jax.default_backend() != "gpu":
        raise NotRun(f"JAX runs on {jax.default_backend()} here, not on the GPU")
    program = cocktailer.capture(model, tuple(inputs))
    port = JaxPort(program)
    args = port.inputs([x.cpu() for x in inputs])
    return lambda: _blocked(structured(program, port(args), list(inputs)))


def _blocked(result):
    import jax
    return jax.block_until_ready(result)


def _cocktailer(workers: int | None):
    def prepare(model, inputs, device):
        options = {"workers": workers} if workers else {}
        if device.type != "cuda":   # the rehearsal: the same generated CUDA on a virtual GPU
            options = {"virtual_gpu": True, "workers": min(workers or 2, 4), "threads": 8}
        fast = cocktailer.compile(model, tuple(inputs), backend="cuda", options=options)
        if fast.chosen != "cuda":
            raise NotRun(f"cocktailer ran the {fast.chosen} backend (see its warning)")
        return lambda: fast(*inputs)
    return prepare


# Prepared in this order: a CUDA graph's failed capture is the likeliest to leave the process's
# CUDA state unusable, so it comes last (see _in_child for what happens then)
SYSTEMS = [GpuSystem("eager", _eager), GpuSystem("torch.compile", _torch_compile(None)),
           GpuSystem("torch.compile reduce-overhead", _torch_compile("reduce-overhead")),
           GpuSystem("jax", _jax), GpuSystem("cocktailer", _cocktailer(None)),
           GpuSystem("cocktailer 16 blocks", _cocktailer(16)), GpuSystem("cuda graph", _cuda_graph)]


def run_model(name: str, size: str, batch: int, device: torch.device, systems: list[GpuSystem], budget) -> dict:
    w = models.make(name, batch, size=size, seed=0)
    model = w.model.to(device).eval() if isinstance(w.model, torch.nn.Module) else w.model
    inputs = tuple(x.to(device) for x in w.inputs)
    expected = model(*inputs)
    rows, ready = {}, []
    for system in systems:
        print(f"{name}: preparing {system.name}", file=sys.stderr, flush=True)   # what a timeout's tail names
        start = time.perf_counter()
        try:
            call = _synchronized(system.prepare(model, inputs, device), device)
            check = compare(call(), expected)
        except NotRun as e:
            rows[system.name] = {"status": "not run", "reason": str(e)}
            continue
        except Exception as e:   # a system's own failure: recorded with what it said
            rows[system.name] = {"status": "failed", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            continue
        rows[system.name] = {"status": "ok" if check.passed else "wrong result", "check": check.to_json(),
                             "prepare_seconds": time.perf_counter() - start}
        if check.passed:
            ready.append((system.name, call))
    if ready:
        samples = measure_interleaved([call for _, call in ready], budget)
        for (system, _), seconds in zip(ready, samples):
            rows[system].update({"seconds": seconds, **summarize(seconds)})
    return {"model": name, "size": size, "batch": batch, "systems": rows}


def gpu_description(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"device": "cpu (a rehearsal: no GPU)"}
    props = torch.cuda.get_device_properties(device)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return {"device": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "memory_bytes": props.total_memory, "torch_cuda": torch.version.cuda, "nvidia_smi": smi.stdout.strip()}


def table(data: dict) -> str:
    names = [s.name for s in SYSTEMS if s.name in data["systems"]]
    lines = [f"# One inference on {data['gpu']['device']}: median ms (ratio to cocktailer's best)", "",
             machine.summary(data["machine"]), "",
             "| model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in data["models"]:
        if "systems" not in r:
            lines.append(f"| {r['model']} b{r['batch']} | " + " | ".join([r["status"]] * len(names)) + " |")
            continue
        rows = r["systems"]
        ours = [rows[n]["median_s"] for n in names if n.startswith("cocktailer") and "median_s" in rows.get(n, {})]
        best = min(ours) if ours else None
        cells = []
        for n in names:
            row = rows.get(n, {})
            if "median_s" in row:
                ratio = f" ({row['median_s'] / best:.2f}x)" if best else ""
                cells.append(f"{row['median_s'] * 1e3:.3f}{ratio}")
            else:
                cells.append(row.get("status", r.get("status", "-")) + (f": {row['reason'][:60]}" if "reason" in row else ""))
        lines.append(f"| {r['model']} b{r['batch']} | " + " | ".join(cells) + " |")
    lines += ["", "A ratio above 1 is slower than cocktailer. Every timed system's result matched eager's "
              "(bench.compare's tolerance) before it was timed; see results.json for the raw samples."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(models.names()))
    p.add_argument("--systems", default=",".join(s.name for s in SYSTEMS))
    p.add_argument("--size", default="paper", choices=["small", "paper"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="fewer timed runs")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("bench/results/gpu"))
    p.add_argument("--model-timeout", type=float, default=0,
                   help="run each model in a process of its own, stopped after this many seconds (0: in this one)")
    p.add_argument("--child-json", type=pathlib.Path, help=argparse.SUPPRESS)   # a --model-timeout child's result
    args = p.parse_args(argv)
    device = torch.device(args.device)
    wanted = args.systems.split(",")
    unknown = sorted(set(wanted) - {s.name for s in SYSTEMS})
    if unknown:
        p.error(f"unknown systems {unknown}; known: {', '.join(s.name for s in SYSTEMS)}")
    systems = [s for s in SYSTEMS if s.name in wanted]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False   # every system in float32, as eager by default
        torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    data = {"machine": machine.describe(), "gpu": gpu_description(device), "size": args.size,
            "systems": [s.name for s in systems], "models": []}
    budget = QUICK if args.quick else FULL
    for name in args.models.split(","):
        if args.model_timeout:
            result = _in_child(name, argv if argv is not None else sys.argv[1:], args.model_timeout, args.batch,
                               [s.name for s in systems])
        else:
            result = run_model(name, args.size, args.batch, device, systems, budget)
        if args.child_json:
            args.child_json.write_text(json.dumps(json_safe(result)))
            return
        data["models"].append(result)
        done = [f"{k} {v.get('median_s', v['status'])}" for k, v in result.get("systems", {}).items()]
        print(f"{name}: " + (", ".join(done) or result.get("status", "")), file=sys.stderr, flush=True)
        write_small_run(args.out, data, table(data))


def _in_child(name: str, argv: list[str], timeout: float, batch: int, systems: list[str]) -> dict:
    """`name`'s run_model in a process of its own: a kernel that never returns (a grid barrier
    some block never reaches) cannot be interrupted from Python, and must not take the rest of
    a lent GPU's time with it. A system that was being prepared when the time ran out (an
    nvcc build of a very long kernel, say) or the process died (a fault that leaves CUDA
    unusable) is left out of one more try, so that the others' numbers are kept; it is
    recorded with what happened."""
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:
        out = pathlib.Path(tmp) / "model.json"
        command = [sys.executable, "-m", "bench.gpu", *argv, "--models", name, "--systems", ",".join(systems),
                   "--model-timeout", "0", "--child-json", str(out)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            if done.returncode == 0 and out.exists():
                return json.loads(out.read_text())
            tail, status = done.stderr, f"failed (exit {done.returncode})"
            what = {"status": "failed", "reason": f"the process ended (exit {done.returncode}) after its preparation began"}
        except subprocess.TimeoutExpired as e:
            tail = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
            status = f"timed out after {timeout:.0f} s"
            what = {"status": "timed out", "reason": f"still being prepared after {timeout:.0f} s"}
    culprit = _being_prepared(tail, name)
    if culprit in systems and len(systems) > 1:
        result = _in_child(name, argv, timeout, batch, [s for s in systems if s != culprit])
        result.setdefault("systems", {})[culprit] = {**what, "stderr_tail": tail[-2000:]}
        return result
    return {"model": name, "batch": batch, "status": status, "stderr_tail": tail[-2000:]}


def _being_prepared(stderr: str, name: str) -> str | None:
    """The system run_model's last progress line says it was preparing."""
    lines = [line for line in stderr.splitlines() if line.startswith(f"{name}: preparing ")]
    return lines[-1][len(f"{name}: preparing "):] if lines else None


if __name__ == "__main__":
    main()
