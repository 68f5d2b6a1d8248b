"""The hand-batched PyTorch peers of the throughput models (bench/throughput_peers.py) give every
instance the result of eager `model(*args)`: single instances, batches, batches that mix very
different sizes (long sentences next to one-word ones, big trees next to single leaves, deep
generated trees next to lone roots, inner loops of 0 steps), the benchmark's 256 size, and
decisions (DRNN's expansion, Berxit's exit) that sit exactly on their threshold. Results only:
nothing here times anything."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # bench/ is a top-level package

from cocktailer.models import throughput  # noqa: E402
from bench.throughput_peers import MODELS, throughput_hand_batched  # noqa: E402

# Configurations that stretch the "small" size: (config table, overrides).
_WIDE = {
    "treegru": ("TREEGRU_CONFIG", {"max_leaves": 32}),
    "mvrnn": ("MVRNN_CONFIG", {"max_leaves": 32}),
    "birnn": ("SENTENCE_CONFIG", {"max_len": 60}),
    "stackrnn": ("SENTENCE_CONFIG", {"max_len": 60}),
    "nestedrnn": ("NESTED_CONFIG", {"max_len": 30, "inner": (0, 50)}),
    "drnn": ("DRNN_CONFIG", {"max_depth": 9}),
    "berxit": ("BERXIT_CONFIG", {"max_len": 60}),
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tests run thousands of tiny eager ops (the references, Berxit's calibration): with
    intra-op threads each one pays an OpenMP barrier, which on a busy 2-core machine stalls for
    milliseconds. Results do not depend on it; the thread count is restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _assert_eager(model, instances, got):
    with torch.no_grad():
        expected = [model(*a) for a in instances]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is type(e)
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def _hand_batched(name, model, instances):
    with torch.no_grad():   # as the benchmark calls peers
        return throughput_hand_batched(name, model)(instances)


def test_every_throughput_model_has_a_peer():
    assert set(MODELS) == set(throughput.INSTANCES)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("batch", [1, 8])
def test_hand_batched_equals_eager(name, batch):
    model, instances = throughput.INSTANCES[name](batch, size="small", seed=batch)
    _assert_eager(model, instances, _hand_batched(name, model, instances))


@pytest.mark.parametrize("name", MODELS)
def test_hand_batched_mixed_sizes(name, monkeypatch):
    model, instances = throughput.INSTANCES[name](8, size="small", seed=1)
    table, overrides = _WIDE[name]
    for key, value in overrides.items():
        monkeypatch.setitem(getattr(throughput, table)["small"], key, value)
    _, wide = throughput.INSTANCES[name](8, size="small", seed=2)
    mixed = [args for pair in zip(wide, instances) for args in pair]   # instances are data: one model runs all 16
    _assert_eager(model, mixed, _hand_batched(name, model, mixed))


@pytest.mark.parametrize("name", MODELS)
def test_hand_batched_equals_eager_at_256(name):
    model, instances = throughput.INSTANCES[name](8, size="256", seed=0)
    _assert_eager(model, instances, _hand_batched(name, model, instances))


def test_drnn_expansion_exactly_on_the_threshold():
    model, instances = throughput.drnn_instances(16, size="small", seed=3)
    root = next(a[0] for a in instances if int(a[1]) > 0)
    with torch.no_grad():
        model.threshold = float(torch.sigmoid(model.expand(root))[0])   # eager does not expand this root
    _assert_eager(model, instances, _hand_batched("drnn", model, instances))


def test_berxit_exit_exactly_on_the_threshold():
    model, instances = throughput.berxit_instances(16, size="small", seed=3)
    with torch.no_grad():
        first_layer = model.layers[0](instances[0][0])
        model.threshold = float(torch.softmax(model.exits[0](first_layer[0]), -1).max())   # eager stays
    _assert_eager(model, instances, _hand_batched("berxit", model, instances))
