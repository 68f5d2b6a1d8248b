"""The figures, in the style of the Cocktailer paper's §5:
fig14.png      normalized latency per model per system, one panel per batch size (Figure 14);
fig_traced.png time with control flow against the traced graph, batch 1 (Figures 15/16/18);
fig19.png      the cocktailer cpu backend step by step (Figure 19), when the run has the steps."""
from __future__ import annotations

import math
import pathlib

from bench.report import ok
from bench.status import INSTALL_HINT
from bench.systems import OURS, PEER, TRACED


def write_all(data: dict, out: pathlib.Path) -> list[str]:
    """Write the figures; returns notes for the table (what could not be drawn, and why)."""
    try:
        import matplotlib
        matplotlib.use("Agg")   # files only: no display here, and none needed
    except ImportError:
        return [f"figures: matplotlib missing ({INSTALL_HINT})"]
    notes = []
    for name, draw in (("fig14.png", fig14), ("fig_traced.png", fig_traced), ("fig19.png", fig19)):
        if name == "fig19.png" and not any(n.startswith("fig19:") for n in _systems(_workloads(data), (OURS,))):
            continue   # not a step-by-step run
        if draw(data, out / name):
            notes.append(f"figure: {name}")
        else:
            notes.append(f"figure {name}: nothing to draw yet (no timed results)")
    return notes


def _workloads(data: dict, batch: int | None = None) -> list[dict]:
    return [w for w in data["workloads"].values()
            if w.get("systems") and (batch is None or w.get("batch") == batch)]


def _systems(workloads: list[dict], kinds: tuple[str, ...]) -> list[str]:
    names: list[str] = []
    for w in workloads:
        names += [n for n, e in w["systems"].items() if e.get("kind") in kinds and n not in names]
    return names


def _colors(data: dict) -> dict[str, str]:
    """One color per system in every panel and figure."""
    names: list[str] = []
    for w in data["workloads"].values():
        names += [n for n in w.get("systems", {}) if n not in names]
    return {name: f"C{i % 10}" for i, name in enumerate(names)}


def _baseline(systems: dict) -> float | None:
    """Figure 14 normalizes to ours: the fastest cocktailer backend (else the fastest system)."""
    ours = [e["median_s"] for e in systems.values() if e.get("kind") == OURS and ok(e)]
    timed = ours or [e["median_s"] for e in systems.values() if ok(e)]
    return min(timed) if timed else None


def fig14(data: dict, path: pathlib.Path) -> bool:
    import matplotlib.pyplot as plt
    batches = sorted({w["batch"] for w in _workloads(data)})
    if not batches or not any(ok(e) for w in _workloads(data) for e in w["systems"].values()):
        return False
    fig, axes = plt.subplots(len(batches), 1, figsize=(14, 3.6 * len(batches)), squeeze=False)
    for ax, batch in zip(axes[:, 0], batches):
        _fig14_panel(ax, _workloads(data, batch), batch, _colors(data))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _fig14_panel(ax, workloads: list[dict], batch: int, colors: dict):
    import matplotlib.patches as mpatches
    import matplotlib.transforms as mtransforms
    names = _systems(workloads, (PEER, OURS))
    width = 0.8 / max(len(names), 1)
    marks = mtransforms.blended_transform_factory(ax.transData, ax.transAxes)
    for i, name in enumerate(names):
        for x, w in enumerate(workloads):
            pos, entry, base = x - 0.4 + (i + 0.5) * width, w["systems"].get(name), _baseline(w["systems"])
            if ok(entry) and base:
                ax.bar(pos, entry["median_s"] / base, width, color=colors[name])
            elif entry is not None:   # no number: mark it, as the paper marks unsupported systems
                ax.text(pos, 0.02, "✗", transform=marks, ha="center", color=colors[name], fontsize=9)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(workloads)), [w["model"] for w in workloads])
    ax.set_ylabel("latency / cocktailer")
    ax.set_title(f"Normalized latency, batch {batch} (✗: no result: unsupported, missing, wrong or failed)")
    ax.legend(handles=[mpatches.Patch(color=colors[n], label=n) for n in names], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.0, 1.0))


def fig_traced(data: dict, path: pathlib.Path) -> bool:
    import matplotlib.pyplot as plt
    workloads = [w for w in _workloads(data, 1) if any(ok(e) for e in w["systems"].values())]
    if not workloads:
        return False
    cols = min(3, len(workloads))
    rows = math.ceil(len(workloads) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, w in zip(axes.flat, workloads):
        _traced_panel(ax, w, _colors(data))
    for ax in list(axes.flat)[len(workloads):]:
        ax.axis("off")
    fig.suptitle("Time with control flow (solid) vs its traced graph (hatched; dashed line: the eager traced "
                 "graph), batch 1; whiskers p10–p90")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _traced_panel(ax, w: dict, colors: dict):
    """Each system's bar next to its own traced graph (eager, JAX, each cocktailer backend);
    the other peers against the eager traced graph (dashed line)."""
    systems = w["systems"]
    labels, x = [], 0
    for name, e in systems.items():
        if e.get("kind") == TRACED or not ok(e):
            continue
        _bar(ax, x, e, colors[name], "")
        labels.append((x, name))
        own = e.get("traced")
        if own == "traced:reference" and name != "eager":
            own = None   # the eager traced graph is the dashed line for these peers
        traced = systems.get(own) if own else None
        if ok(traced):
            _bar(ax, x + 1, traced, colors[name], "//")
            labels.append((x + 1, "traced"))
            x += 1
        x += 1.5
    eager_traced = systems.get("traced:reference")
    if ok(eager_traced):
        ax.axhline(eager_traced["median_s"] * 1e3, color="grey", ls="--", lw=0.8)
    timed = [e for e in systems.values() if ok(e)]
    if max(e["p90_s"] for e in timed) > 30 * min(e["median_s"] for e in timed):   # one slow bar flattens the rest
        ax.set_yscale("log")
    ax.set_xticks([p for p, _ in labels], [n for _, n in labels], rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("ms")
    ax.set_title(w["model"])


def fig19(data: dict, path: pathlib.Path) -> bool:
    """Speedup of each step over the host level (control flow in Python), per model."""
    import matplotlib.pyplot as plt
    workloads = [w for w in _workloads(data, 1) if ok(w["systems"].get("fig19:host"))]
    steps = [n for n in _systems(workloads, (OURS,)) if n.startswith("fig19:")]
    if not workloads or not steps:
        return False
    fig, ax = plt.subplots(figsize=(12, 4))
    width, colors = 0.8 / len(steps), _colors(data)
    for i, name in enumerate(steps):
        for x, w in enumerate(workloads):
            entry = w["systems"].get(name)
            if ok(entry):
                speedup = w["systems"]["fig19:host"]["median_s"] / entry["median_s"]
                ax.bar(x - 0.4 + (i + 0.5) * width, speedup, width, color=colors[name], label=name if x == 0 else None)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(workloads)), [w["model"] for w in workloads])
    ax.set_ylabel("speedup over the host level")
    ax.set_title("The cpu backend step by step, batch 1 (each step on top of the previous one)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _bar(ax, x: float, e: dict, color: str, hatch: str):
    median = e["median_s"] * 1e3
    err = [[median - e["p10_s"] * 1e3], [e["p90_s"] * 1e3 - median]]
    ax.bar(x, median, 0.9, color=color, hatch=hatch, edgecolor="black" if hatch else color, yerr=err,
           capsize=2, alpha=0.6 if hatch else 1.0)
