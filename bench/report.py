"""table.md from results.json: latency per system, speedup over the fastest peer, ratio to
the traced graph, fraction of the roofline; and the figures (plots.py)."""
from __future__ import annotations

import pathlib

from bench import contention, status
from bench.systems import PEER, TRACED

REASON_WIDTH = 90   # the table keeps reasons short; results.json has them whole


def write(data: dict, out: pathlib.Path) -> str:
    from bench import plots
    out.mkdir(parents=True, exist_ok=True)
    notes = plots.write_all(data, out)
    text = markdown(data, notes)
    (out / "table.md").write_text(text)
    return text


def markdown(data: dict, notes: list[str] = ()) -> str:
    parts = [_header(data), _matrix(data), _baseline_table(data), contention.table(data), _details(data),
             _compile_table(data), _roofline_table(data)]
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes))
    return "\n\n".join(p for p in parts if p) + "\n"


# -- derived numbers ---------------------------------------------------------------------------

def ok(entry: dict | None) -> bool:
    return bool(entry) and entry.get("status") == status.OK


def fastest_peer(systems: dict) -> tuple[str, float] | None:
    timed = [(e["median_s"], name) for name, e in systems.items() if e.get("kind") == PEER and ok(e)]
    return (min(timed)[1], min(timed)[0]) if timed else None


def traced_counterpart(entry: dict) -> str | None:
    """The traced graph a system is compared with: its own where it has one (eager, JAX,
    each cocktailer backend), else the eager one."""
    if entry.get("kind") == TRACED:
        return None
    return entry.get("traced") or "traced:reference"


def speedup_over_fastest_peer(systems: dict, name: str) -> float | None:
    best = fastest_peer(systems)
    entry = systems[name]
    return best[1] / entry["median_s"] if best and ok(entry) else None


def ratio_to_traced(systems: dict, name: str) -> float | None:
    entry = systems[name]
    traced = systems.get(traced_counterpart(entry) or "")
    return entry["median_s"] / traced["median_s"] if ok(entry) and ok(traced) else None


def cell(entry: dict | None, width: int = REASON_WIDTH) -> str:
    """An entry's status for a table cell: its time, or why there is none."""
    if entry is None:
        return "—"
    if ok(entry):
        return f"{entry['median_s'] * 1e3:.3g}"
    text = status.label(entry["status"], entry.get("reason", "")).replace("|", "/")
    return text if len(text) <= width else text[: width - 3] + "..."


def _short(entry: dict | None) -> str:
    """A matrix cell: the time, or only the status (the per-system table has the reason)."""
    if entry is None or ok(entry) or entry["status"] == status.MISSING:
        return cell(entry)
    return entry["status"]


# -- sections ----------------------------------------------------------------------------------

def _header(data: dict) -> str:
    m, run = data.get("machine", {}), data.get("run", {})
    v, git, meas = m.get("versions", {}), m.get("git", {}), m.get("measured", {})
    lib = ", ".join(f"{k} {v[k] or 'missing'}" for k in ("torch", "jax", "onnxruntime", "numpy", "python") if k in v)
    mem = f"{m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else "?"
    commit = (git.get("commit") or "?")[:12] + (" (dirty tree)" if git.get("dirty") else "")
    resumed = f", resumed {run['started']}" if run.get("resumed_from") else ""
    first = run.get("resumed_from") or run.get("started")
    lines = [f"# Benchmark `{run.get('name', '?')}` (size={run.get('size')}, started {first}{resumed})", "",
             f"- machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {mem}; {lib}",
             f"- commit: {commit}"]
    if meas:
        lines.append(f"- measured: memory bandwidth {meas['bandwidth_bytes_s'] / 1e9:.1f} GB/s (tensor copy), "
                     f"peak {meas['peak_flops'] / 1e9:.1f} GFLOP/s (float32 matmul, {meas.get('torch_threads')} threads)")
    load = m.get("load_average")
    if load and m.get("cores") and load[0] > 0.25 * m["cores"]:
        lines.append(f"- note: load average {load[0]:.2f} on {m['cores']} cores when the run started: other "
                     "processes shared the machine, so times are noisier than they should be")
    if _traced_left_out(data):
        lines.append("- some systems have no '/ traced' ratio: their traced graph was not in this run (--quick runs it "
                     "only eagerly and in JAX; --systems may leave it out)")
    lines.append("- times are medians of the timed runs, in ms; every result was checked against eager before timing")
    return "\n".join(lines)


def _traced_left_out(data: dict) -> bool:
    return any(e.get("traced") and e["traced"] not in w["systems"]
               for w in data["workloads"].values() for e in w.get("systems", {}).values())


def _system_names(data: dict) -> list[str]:
    names: list[str] = []
    for w in data["workloads"].values():
        names += [n for n in w.get("systems", {}) if n not in names]
    return names


def _matrix(data: dict) -> str:
    names = _system_names(data)
    if not names:
        return ""
    lines = ["## Latency (median ms)", "", "| model | batch | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for w in data["workloads"].values():
        systems = w.get("systems", {})
        if not systems:
            continue
        cells = [_short(systems.get(n)) for n in names]
        lines.append(f"| {w.get('model')} | {w.get('batch')} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _details(data: dict) -> str:
    lines = ["## Per system", "",
             "| model | batch | system | median ms | p10–p90 ms | runs | × fastest peer | / traced | roofline | notes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w in data["workloads"].values():
        lead = f"| {w.get('model')} | {w.get('batch')} |"
        if "error" in w or "skipped" in w:
            lines.append(f"{lead} — | {w.get('error') or 'skipped: ' + w['skipped']} | | | | | | |")
            continue
        for name, e in w.get("systems", {}).items():
            lines.append(f"{lead} {name} | " + " | ".join(_detail_cells(w["systems"], name)) + " |")
    return "\n".join(lines)


def _detail_cells(systems: dict, name: str) -> list[str]:
    e = systems[name]
    if not ok(e):
        return [cell(e), "", "", "", "", "", ""]
    spread = f"{e['p10_s'] * 1e3:.3g}–{e['p90_s'] * 1e3:.3g}"
    note = str(e.get("info", {}).get("note", "")).replace("|", "/")
    return [cell(e), spread, str(e["runs"]), _fmt(speedup_over_fastest_peer(systems, name), "×"),
            _fmt(ratio_to_traced(systems, name), "×"), _fmt(e.get("roofline_fraction"), "", pct=True), note]


def _compile_table(data: dict) -> str:
    """Compile times of the native backends: cold (empty library cache) and cached."""
    rows = [f"| {w['model']} | {w['batch']} | {name} | {e['info']['compile_cold_s']:.3g} | "
            f"{e['info']['compile_cached_s']:.3g} |"
            for w in data["workloads"].values() for name, e in w.get("systems", {}).items()
            if "compile_cold_s" in e.get("info", {})]
    if not rows:
        return ""
    return "\n".join(["## Compile time (s)", "",
                      "cold: into an empty library cache (capture, passes, schedule, code generation, C compiler); "
                      "cached: the same model compiled again in the same process (a cache hit: no compiler run); "
                      "`python -m bench --compile-times` adds a new process with the library on disk", "",
                      "| model | batch | system | cold s | cached s |", "|---|---|---|---|---|", *rows])


def _baseline_table(data: dict) -> str:
    """--baseline: each cocktailer system against the same system of the other commit, timed
    interleaved in the same run (ratio < 1: this commit is faster)."""
    ref = data.get("run", {}).get("baseline")
    if not ref:
        return ""
    lines = [f"## Against {ref} (interleaved, same inputs)", "", "| model | batch | system | this ms | "
             f"{ref} ms | ratio |", "|---|---|---|---|---|---|"]
    for w in data["workloads"].values():
        systems = w.get("systems", {})
        for name in [n for n in systems if f"{n}@{ref}" in systems]:
            mine, theirs = systems[name], systems[f"{name}@{ref}"]
            ratio = f"{mine['median_s'] / theirs['median_s']:.3f}" if ok(mine) and ok(theirs) else ""
            lines.append(f"| {w.get('model')} | {w.get('batch')} | {name} | {cell(mine)} | {cell(theirs)} | {ratio} |")
    return "\n".join(lines)


def _roofline_table(data: dict) -> str:
    lines = ["## Roofline (counted from the traced graph)", "",
             "| model | batch | GFLOP | MB moved | MB fused | bound ms | bound by |", "|---|---|---|---|---|---|---|"]
    for w in data["workloads"].values():
        r = w.get("roofline")
        if not r:
            continue
        if "error" in r:
            lines.append(f"| {w['model']} | {w['batch']} | {r['error'][:REASON_WIDTH]} | | | | |")
            continue
        by = "compute" if r["compute_s"] >= r["memory_s"] else "memory"
        lines.append(f"| {w['model']} | {w['batch']} | {r['flops'] / 1e9:.4g} | {r['bytes'] / 1e6:.4g} | "
                     f"{r['bytes_min'] / 1e6:.4g} | {r['bound_s'] * 1e3:.3g} | {by} |")
    return "\n".join(lines)


def _fmt(x: float | None, suffix: str, pct: bool = False) -> str:
    if x is None:
        return ""
    return f"{x * 100:.2g}%" if pct else f"{x:.3g}{suffix}"
