"""The JAX vmap peer of throughput mode (bench/jax_peers.py: masked execution, jitted and
vmapped over instances) gives per-instance eager PyTorch's results, on batches of instances of
different sizes (trees of different node counts and heights, padded tables, single leaves;
sentences of different lengths). Results only: nothing here times anything."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

jax = pytest.importorskip("jax")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # bench/ is a top-level package

from bench.jax_peers import MODELS, jax_vmapped  # noqa: E402
from cocktailer import models  # noqa: E402
from cocktailer.data import chain_tree, perfect_tree, random_tree  # noqa: E402
from cocktailer.models.throughput import BiRNN, TreeGRU  # noqa: E402
from cocktailer.models.tree import tree_inputs  # noqa: E402
from cocktailer.models.workload import build, generator  # noqa: E402
from test_batch_peers import _assert_eager  # noqa: E402

HIDDEN = 16
TREE_ZOO = ("rae", "treelstm", "treefc")   # built by cocktailer.models.make


def _zoo(name: str, batch: int, seed: int, **shape) -> tuple[torch.nn.Module, list]:
    w = models.make(name, batch, size="small", seed=seed, hidden=HIDDEN, **shape)
    return w.model, list(w.config["instances"])


def _trees(trees, seed: int, nodes=None) -> list:
    """Tree instances over `trees`, each padded to `nodes` (default: its own node count)."""
    table = torch.randn(20, HIDDEN, generator=generator(seed))
    rng = random.Random(seed)
    return [tree_inputs(t, [rng.randrange(20) for _ in range(t.num_leaves)], table, nodes or t.num_nodes)
            for t in trees]


def _sentences(lengths, seed: int) -> list:
    g = generator(seed)
    return [(torch.randn(n, HIDDEN, generator=g),) for n in lengths]


def _instances(name: str, batch: int, seed: int) -> tuple[torch.nn.Module, list]:
    """`batch` small instances of different sizes, hidden 16."""
    if name in TREE_ZOO:
        return _zoo(name, batch, seed)
    rng = random.Random(seed)
    if name == "treegru":
        model = build(lambda: TreeGRU(HIDDEN), seed)
        return model, _trees([random_tree(rng.randint(1, 10), rng.randrange(1 << 30)) for _ in range(batch)], seed)
    model = build(lambda: BiRNN(HIDDEN), seed)
    return model, _sentences([rng.randint(1, 20) for _ in range(batch)], seed)


def _mix(name: str) -> tuple[torch.nn.Module, list]:
    """One model over very different instances: single leaves, padded tables, deep chains and
    perfect trees; sentences of 1 to 40 words (more than one padding bucket)."""
    if name in TREE_ZOO:   # as test_batch_peers._mix, at hidden 16
        model, instances = _zoo(name, 4, 0)
        shapes = [{"height": 1}, {"height": 2}, {"height": 4}] if name == "treefc" else \
                 [{"max_leaves": 1}, {"max_leaves": 3, "nodes": 9}, {"max_leaves": 12}]
        for seed, shape in enumerate(shapes, 1):
            instances += _zoo(name, 3, seed, **shape)[1]
        return model, instances
    if name == "treegru":
        model = build(lambda: TreeGRU(HIDDEN), 3)
        trees = [random_tree(1, 0), perfect_tree(3), chain_tree(12), random_tree(9, 5), random_tree(2, 1)]
        return model, _trees(trees, 3) + _trees([random_tree(4, 2), perfect_tree(1)], 4, nodes=21)
    model = build(lambda: BiRNN(HIDDEN), 3)
    return model, _sentences([1, 40, 7, 16, 17, 2], 3)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("batch", [1, 8])
def test_jax_vmapped_equals_eager(name, batch):
    model, instances = _instances(name, batch, seed=batch)
    _assert_eager(model, instances, jax_vmapped(name, model)(instances))


@pytest.mark.parametrize("name", MODELS)
def test_jax_vmapped_mixed_sizes(name):
    model, instances = _mix(name)
    peer = jax_vmapped(name, model)
    _assert_eager(model, instances, peer(instances))
    # the same peer on another batch: other padded shapes, other heights and lengths
    _assert_eager(model, instances[::2], peer(instances[::2]))


def test_weights_are_copied_when_the_peer_is_made():
    model, instances = _instances("rae", 4, seed=0)
    with torch.inference_mode():
        expected = [model(*a) for a in instances]
    peer = jax_vmapped("rae", model)
    with torch.no_grad():
        model.encode.weight.mul_(2)
    for got, want in zip(peer(instances), expected):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_float32_and_torch_threads_with_x64_enabled():
    """In float32 even where another module turned on jax_enable_x64 (bench/jax_ports.py does),
    and running JAX leaves torch's thread settings alone."""
    threads = torch.get_num_threads()
    enable_x64 = getattr(jax, "enable_x64", None)
    if enable_x64 is None:   # jax < 0.6
        from jax.experimental import enable_x64
    with enable_x64(True):
        for name in ("treelstm", "birnn"):
            model, instances = _instances(name, 3, seed=5)
            _assert_eager(model, instances, jax_vmapped(name, model)(instances))
    assert torch.get_num_threads() == threads


def test_unknown_model():
    with pytest.raises(ValueError, match="no JAX peer"):
        jax_vmapped("mvrnn", torch.nn.Linear(2, 2))
