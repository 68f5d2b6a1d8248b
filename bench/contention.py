"""--load: the same systems timed on a quiet machine and beside k busy-looping processes
(a shared machine), interleaved within each level, and the table of how much each degrades.

A system's entry at load k > 0 is stored as `<system> +k busy`."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

BUSY_LOOP = "while True: pass"
SETTLE_S = 0.3   # let the scheduler place the busy processes before timing


def loaded_name(system: str, load: int) -> str:
    return system if load == 0 else f"{system} +{load} busy"


@contextlib.contextmanager
def busy(processes: int):
    """`processes` Python processes spinning on the CPU while the block runs."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(processes)]
    try:
        if procs:
            time.sleep(SETTLE_S)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def table(data: dict) -> str:
    """Per model and system: the median quiet and at each load, with the ratio to quiet; and
    whether the compiled program stays at least as fast as eager under the same load."""
    loads = data.get("run", {}).get("loads") or []
    if not loads:
        return ""
    levels = [k for k in loads if k > 0]
    head = ["model", "batch", "system", "quiet ms", *(f"+{k} busy ms (× quiet)" for k in levels)]
    lines = ["## Under load (median ms; × its own quiet time)", "",
             "Each level times the systems interleaved while that many busy-looping processes run.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdicts = []
    for w in data["workloads"].values():
        systems = w.get("systems", {})
        for name in [n for n in systems if "busy" not in n]:
            quiet = _median(systems.get(name))
            cells = [_cell(_median(systems.get(loaded_name(name, k))), quiet) for k in levels]
            lines.append(f"| {w.get('model')} | {w.get('batch')} | {name} | {_ms(quiet)} | " + " | ".join(cells) + " |")
        verdicts += _verdicts(w, systems, levels)
    return "\n".join(lines + ([""] + verdicts if verdicts else []))


def _verdicts(w: dict, systems: dict, levels: list[int]) -> list[str]:
    """Compiled systems against eager at each load: at least as fast; and no more than 2x its
    own quiet time where eager degrades less than that."""
    out = []
    eager_quiet = _median(systems.get("eager"))
    for name in [n for n in systems if n.startswith("cocktailer:") and "busy" not in n]:
        quiet = _median(systems.get(name))
        for k in levels:
            mine, eager = _median(systems.get(loaded_name(name, k))), _median(systems.get(loaded_name("eager", k)))
            if None in (mine, eager, quiet, eager_quiet):
                continue
            slower = mine > eager
            degraded = mine / quiet > 2 and eager / eager_quiet < 2
            if slower or degraded:
                why = "slower than eager" if slower else \
                    f"{mine / quiet:.2g}x its quiet time, eager {eager / eager_quiet:.2g}x"
                out.append(f"- {w.get('model')}/b{w.get('batch')} {name} +{k} busy: {why}")
    return out


def _median(entry: dict | None) -> float | None:
    return entry["median_s"] if entry and "median_s" in entry else None


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g}"


def _cell(seconds: float | None, quiet: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{_ms(seconds)} ({seconds / quiet:.2g}×)" if quiet else _ms(seconds)
