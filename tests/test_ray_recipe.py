"""docs/batch-on-ray.md: `cocktailer.batch` inside Ray Data's `map_batches`, on a local Ray.

`BatchedPredictor` below is the recipe's class, word for word (the first test checks that the
doc shows exactly this source, and needs no Ray). The Ray test runs the recipe's script: unpadded
trees of 1 to 12 leaves (12 node counts) through it, 4 rows to a Ray batch, each result checked
against the model run eagerly on that instance alone.
"""
from __future__ import annotations

import inspect
import pathlib
import random
import re
import sys

import numpy as np
import pytest
import torch

import cocktailer
from cocktailer.data import random_tree
from cocktailer.models.tree import TreeLSTM, tree_inputs

DOC = pathlib.Path(__file__).parent.parent / "docs" / "batch-on-ray.md"


class BatchedPredictor:
    """A `map_batches` callable class: one Ray batch (a dict of numpy columns, one row per
    instance) in, one call of the batched function, the batch with an "output" column out."""

    def __init__(self, batched, columns):
        self.batched = batched      # unpickled here: the model is captured once per worker
        self.columns = columns      # the columns that are the model's arguments, in order

    def __call__(self, batch: dict) -> dict:
        rows = len(batch[self.columns[0]])
        instances = [tuple(torch.from_numpy(np.array(batch[c][k])) for c in self.columns)   # (a copy:
                     for k in range(rows)]                                                    # Ray's are read-only)
        with torch.no_grad():
            outs = self.batched(instances)
        output = np.empty(rows, dtype=object)      # one array per row: their shapes may differ
        for k, out in enumerate(outs):
            output[k] = out.numpy()
        rest = {name: column for name, column in batch.items() if name not in self.columns}
        return {**rest, "output": output}


COLUMNS = ("left", "right", "is_leaf", "inp", "root")   # TreeLSTM.forward's arguments


def test_the_doc_shows_this_class_verbatim():
    text = DOC.read_text()
    assert inspect.getsource(BatchedPredictor) in text, \
        "docs/batch-on-ray.md's BatchedPredictor differs from the one this test runs"
    for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
        compile(block, str(DOC), "exec")


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    """One light local Ray for the module: one CPU, no dashboard, a small object store, logs in
    a tmp dir; shut down after the module."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(address="local", num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING", object_store_memory=100 * 2**20,
                 _temp_dir=str(tmp_path_factory.mktemp("ray")))
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        # Workers cannot import this test module; a script's own class (in __main__) travels by value anyway.
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield ray
    finally:
        ray.shutdown()


def test_trees_of_different_sizes_through_ray_data_equal_eager(local_ray):
    ray = local_ray
    # ---- the recipe's script from here (docs/batch-on-ray.md), with one actor instead of two
    torch.manual_seed(0)
    model = TreeLSTM(16).eval()
    table = torch.randn(20, 16)                                    # word vectors of a 20-word vocabulary
    rng = random.Random(0)
    trees = [random_tree(n, seed) for seed, n in enumerate(rng.sample(range(1, 13), 12))]   # 1..12 leaves
    instances = [tree_inputs(t, [rng.randrange(20) for _ in range(t.num_leaves)], table, t.num_nodes)   # unpadded
                 for t in trees]

    batched = cocktailer.batch(model, example_inputs=instances[0])   # captured once, on the driver

    rows = [{"id": k, **{c: x.numpy() for c, x in zip(COLUMNS, instance)}} for k, instance in enumerate(instances)]
    ds = ray.data.from_items(rows).map_batches(
        BatchedPredictor, fn_constructor_args=(batched, COLUMNS), batch_size=4, batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=1))
    results = {int(row["id"]): row["output"] for row in ds.take_all()}
    # ---- to here

    assert len({x[0].shape[0] for x in instances}) == 12, "every tree has its own node count"
    assert sorted(results) == list(range(len(instances))), "one result per instance"
    with torch.no_grad():
        for k, instance in enumerate(instances):
            got, want = torch.from_numpy(np.array(results[k])), model(*instance)
            assert got.shape == want.shape, f"instance {k}: {tuple(got.shape)} != {tuple(want.shape)}"
            assert torch.allclose(got, want, atol=1e-5), f"instance {k}: off by {(got - want).abs().max()}"
