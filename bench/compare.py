"""Is a system's result the same as eager PyTorch's? Results of every system are turned
into a flat list of numpy arrays (torch tensors, numpy arrays, JAX arrays, Python numbers)
in the order of the model's output structure, then compared element by element."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

# float32 over long recurrences (1000 RNN steps, deep trees) in another library's kernels
# (XLA, MLAS) rounds differently; this still catches a wrong branch, step count or weight.
RTOL, ATOL = 1e-3, 1e-4


@dataclass
class Check:
    passed: bool
    max_abs_diff: float
    detail: str = ""

    def to_json(self) -> dict:
        return {**asdict(self), "rtol": RTOL, "atol": ATOL}


def leaves(result: Any) -> list[np.ndarray]:
    if isinstance(result, (tuple, list)):
        return [a for item in result for a in leaves(item)]
    if isinstance(result, dict):
        return [a for key in result for a in leaves(result[key])]
    if isinstance(result, torch.Tensor):
        return [result.detach().cpu().numpy()]
    return [np.asarray(result)]   # numpy, JAX arrays, Python numbers


def compare(actual: Any, expected: Any) -> Check:
    got, want = leaves(actual), leaves(expected)
    if len(got) != len(want):
        return Check(False, float("inf"), f"{len(got)} outputs, eager has {len(want)}")
    worst = 0.0
    for n, (a, e) in enumerate(zip(got, want)):
        if a.shape != e.shape:
            return Check(False, float("inf"), f"output {n}: shape {a.shape}, eager {e.shape}")
        diff = _max_abs_diff(a, e)
        worst = max(worst, diff)
        if not _close(a, e):
            return Check(False, worst, f"output {n}: max |diff| {diff:.3g}")
    return Check(True, worst)


def _max_abs_diff(a: np.ndarray, e: np.ndarray) -> float:
    if a.size == 0:
        return 0.0
    d = np.abs(a.astype(np.float64) - e.astype(np.float64))
    d = d[~np.isnan(d)]
    return float(d.max()) if d.size else 0.0


def _close(a: np.ndarray, e: np.ndarray) -> bool:
    if e.dtype.kind in "biu":   # token ids, tree indices, flags: exactly equal
        return np.array_equal(a, e)
    scale = max(1.0, float(np.nanmax(np.abs(e)))) if e.size else 1.0
    return bool(np.allclose(a.astype(np.float64), e.astype(np.float64), rtol=RTOL, atol=ATOL * scale,
                            equal_nan=True))
