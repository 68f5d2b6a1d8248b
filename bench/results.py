"""results.json: written after every system, so a long run can be stopped and resumed
(entries already there are not run again) and a crash loses at most one measurement."""
from __future__ import annotations

import json
import math
import os
import pathlib

from bench.status import MISSING

SCHEMA = 1
RETRY = {MISSING}   # a peer installed since the last run gets its measurement


class ResultStore:
    def __init__(self, path: pathlib.Path, run: dict, fresh: bool = False):
        self.path = path
        self.data = {"schema": SCHEMA, "run": run, "machine": {}, "workloads": {}}
        if path.exists() and not fresh:
            self._resume(json.loads(path.read_text()), run)

    def _resume(self, old: dict, run: dict):
        if old.get("run", {}).get("size") != run.get("size"):
            raise SystemExit(f"{self.path} holds results for size={old.get('run', {}).get('size')!r}, not "
                             f"{run.get('size')!r}: pass --fresh or another --out")
        self.data["workloads"] = old.get("workloads", {})
        self.data["run"]["resumed_from"] = old.get("run", {}).get("started")

    def workload(self, key: str) -> dict:
        return self.data["workloads"].setdefault(key, {"systems": {}})

    def done(self, key: str, system: str) -> bool:
        entry = self.data["workloads"].get(key, {}).get("systems", {}).get(system)
        return entry is not None and entry.get("status") not in RETRY

    def put(self, key: str, system: str, entry: dict):
        self.workload(key)["systems"][system] = entry
        self.save()

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(json_safe(self.data), indent=1))
        os.replace(tmp, self.path)   # atomic: a reader never sees half a file


def write_small_run(out: pathlib.Path, data: dict, table: str):
    """A one-shot benchmark's results.json and table.md (the table printed too)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(json_safe(data), indent=1))
    (out / "table.md").write_text(table)
    print(table)


def json_safe(value):
    """JSON has no inf/nan: write them as strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
