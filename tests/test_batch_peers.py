"""The throughput-mode peers (bench/batch_peers.py) give per-instance eager PyTorch's results:
the hand-batched level-by-level torch code, and the DyNet port under each autobatching
strategy (each in a fresh process, since DyNet fixes its strategy once per process). Results
only: nothing here times anything."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # bench/ is a top-level package

from cocktailer import models  # noqa: E402
from bench.batch_peers import MODELS, hand_batched  # noqa: E402


def _assert_eager(model, instances, got):
    with torch.inference_mode():
        expected = [model(*a) for a in instances]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def _mix(name: str) -> tuple[torch.nn.Module, list]:
    """One model over instances of different sizes and paddings (and single-leaf trees for the
    parsed models), from several seeds."""
    base = models.make(name, 4, size="small", seed=0)
    shapes = [{"height": 1}, {"height": 2}, {"height": 4}] if name == "treefc" else \
             [{"max_leaves": 1}, {"max_leaves": 3, "nodes": 9}, {"max_leaves": 12}]
    instances = list(base.config["instances"])
    for seed, shape in enumerate(shapes, 1):
        instances += models.make(name, 3, size="small", seed=seed, **shape).config["instances"]
    return base.model, instances


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("batch", [1, 8])
def test_hand_batched_equals_eager(name, batch):
    w = models.make(name, batch, size="small", seed=batch)
    instances = w.config["instances"]
    _assert_eager(w.model, instances, hand_batched(name, w.model)(instances))


@pytest.mark.parametrize("name", MODELS)
def test_hand_batched_mixed_sizes(name):
    model, instances = _mix(name)
    _assert_eager(model, instances, hand_batched(name, model)(instances))


@pytest.mark.parametrize("strategy", ["agenda", "depth"])
@pytest.mark.parametrize("name", MODELS)
def test_dynet_port_equals_eager(name, strategy):
    pytest.importorskip("dynet")
    from bench.batch_peers import dynet_time
    report = dynet_time(name, "small", 8, 0, strategy, runs=1, mem_mb=32)   # small pools start fast
    assert report["autobatch"] > 0 and report["close"], report
