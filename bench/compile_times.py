"""--compile-times: how long `cocktailer.compile` takes for each zoo model, in the three
situations a user meets, each measured in a fresh Python process:

- cold: a new process, an empty library cache (capture, passes, schedule, code generation,
  the C compiler; and whatever the first compile of a process pays once);
- warm disk, new process: a new process, the library already in the cache;
- warm, same process: the same model compiled again in the process that compiled it (the
  median of AGAIN repeats: one compile takes well under a second, and a shared machine's
  noise would decide a single sample).

The C compiler's own time is reported apart (the build record's "compile" stage)."""
from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import machine

AGAIN = 5   # repeat compiles in the same process; the table gives their median


def measure(models: list[str], size: str, batch: int, out: Path) -> dict:
    rows = {}
    for model in models:
        with tempfile.TemporaryDirectory(prefix="cocktailer-compile-times-") as cache:
            cold = _worker(model, size, batch, cache)
            warm_disk = _worker(model, size, batch, cache)
        rows[model] = {"cold_s": cold["first_s"], "cold_compiler_s": cold["first_compiler_s"],
                       "warm_disk_s": warm_disk["first_s"], "warm_disk_compiler_ran": warm_disk["first_compiler_ran"],
                       "warm_s": cold["again_s"], "warm_runs_s": cold["again_runs_s"], "warm_compiler_ran": cold["again_compiler_ran"],
                       "import_s": cold["import_s"], "stages_cold": cold["stages"], "stages_warm": cold["stages_again"]}
        print(f"{model}: {_row(model, rows[model])}", file=sys.stderr, flush=True)
    data = {"run": {"size": size, "batch": batch, "argv": sys.argv[1:]}, "machine": machine.describe(),
            "models": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "table.md").write_text(table(data))
    return data


def table(data: dict) -> str:
    m = data["machine"]
    lines = [f"# Compile times (size={data['run']['size']}, batch {data['run']['batch']})", "",
             machine.summary(m),
             "- each column in a fresh process but the last; seconds of `cocktailer.compile(model, inputs)`; "
             f"the last is the median of {AGAIN} repeat compiles", "",
             "| model | cold s | of which C compiler s | cold without it s | warm disk, new process s | "
             "warm, same process s |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {_row(name, r)} |" for name, r in data["models"].items()]
    return "\n".join(lines) + "\n"


def _row(name: str, r: dict) -> str:
    hit = lambda ran: "" if not ran else " (compiler ran!)"   # noqa: E731
    return (f"{r['cold_s']:.3g} | {r['cold_compiler_s']:.3g} | {r['cold_s'] - r['cold_compiler_s']:.3g} | "
            f"{r['warm_disk_s']:.3g}{hit(r['warm_disk_compiler_ran'])} | "
            f"{r['warm_s']:.3g}{hit(r['warm_compiler_ran'])}")


def _worker(model: str, size: str, batch: int, cache: str) -> dict:
    env = {**os.environ, "COCKTAILER_CACHE_DIR": cache}
    result = subprocess.run([sys.executable, "-m", "bench.compile_times", model, size, str(batch)], env=env,
                            capture_output=True, text=True, cwd=machine.REPO, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{model}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _compile_once(model, inputs) -> tuple[float, float, bool, list]:
    import cocktailer
    start = time.perf_counter()
    fast = cocktailer.compile(model, inputs)
    seconds = time.perf_counter() - start
    (_, executable), = fast.cache.values()
    stages = executable.record.stages
    compile_stage = next(s for s in stages if s.name == "compile")
    return seconds, compile_stage.seconds, "compiler ran" in compile_stage.detail, \
        [(s.name, s.seconds) for s in stages]


def _main(model: str, size: str, batch: str):
    start = time.perf_counter()
    models = importlib.import_module("cocktailer.models")   # what importing cocktailer costs, apart
    imported = time.perf_counter() - start
    w = models.make(model, int(batch), size=size)
    first, first_cc, first_ran, stages = _compile_once(w.model, w.inputs)
    repeats = [_compile_once(w.model, w.inputs) for _ in range(AGAIN)]
    again = statistics.median(r[0] for r in repeats)
    again_ran = any(r[2] for r in repeats)
    print(json.dumps({"import_s": imported, "first_s": first, "first_compiler_s": first_cc,
                      "first_compiler_ran": first_ran, "again_s": again, "again_runs_s": [r[0] for r in repeats],
                      "again_compiler_ran": again_ran, "stages": stages, "stages_again": repeats[-1][3]}))


if __name__ == "__main__":
    _main(*sys.argv[1:4])
