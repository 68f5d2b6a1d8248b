"""The ACROBAT / Cortex evaluation models (cocktailer/models/throughput.py) in throughput mode:
every instance's result from `cocktailer.batch` equals the model run on it alone in eager
PyTorch, on the generators' instances and on mixes of very different ones."""
import pytest
import torch

import cocktailer

from cocktailer.data import chain_tree, perfect_tree, random_tree
from cocktailer.models import throughput
from cocktailer.models.throughput import INSTANCES, exit_layers, generated_nodes, transitions_for
from cocktailer.models.tree import tree_inputs
from cocktailer.runtime import find_compiler
from test_batch import assert_batch_matches
from utils import randn


def _shapes(instances) -> set:
    return {tuple(tuple(a.shape) for a in args) for args in instances}


@pytest.mark.parametrize("name", list(INSTANCES))
def test_model_batched_equals_each_instance(name):
    model, instances = INSTANCES[name](8, size="small", seed=0)
    assert len(instances) == 8
    assert_batch_matches(model, instances)


@pytest.mark.parametrize("name", list(INSTANCES))
def test_generators_are_deterministic_and_sized(name):
    model, instances = INSTANCES[name](3, size="small", seed=1)
    again, same = INSTANCES[name](3, size="small", seed=1)
    for a, b in zip(instances, same):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ValueError, match="size must be one of"):
        INSTANCES[name](1, size="medium")


def test_instances_really_differ():
    """Tree shapes, sentence lengths, inner trip counts, generated trees and exit layers vary."""
    for name in ("treegru", "mvrnn", "birnn", "stackrnn", "nestedrnn", "berxit"):
        _, instances = INSTANCES[name](8, size="small", seed=0)
        assert len(_shapes(instances)) >= 4, name
    _, instances = INSTANCES["nestedrnn"](8, size="small", seed=0)
    counts = torch.cat([steps for _, steps in instances])
    assert 20 <= int(counts.min()) < int(counts.max()) <= 40
    model, instances = INSTANCES["drnn"](8, size="small", seed=0)
    assert len({generated_nodes(model, *args) for args in instances}) >= 2
    model, instances = INSTANCES["berxit"](8, size="small", seed=0)
    assert len({exit_layers(model, xs) for (xs,) in instances}) >= 2


# --------------------------------------------------------------------------- very different instances


def _trees(hidden: int, trees) -> list[tuple]:
    g = torch.Generator().manual_seed(3)
    table = torch.randn(30, hidden, generator=g)
    return [tree_inputs(t, torch.randint(30, (t.num_leaves,), generator=g).tolist(), table, t.num_nodes)
            for t in trees]


MIXED_TREES = [random_tree(1, 0), chain_tree(20), perfect_tree(3), random_tree(12, 5), random_tree(2, 1)]


def test_treegru_one_leaf_beside_a_depth_20_chain():
    model, _ = INSTANCES["treegru"](1, size="small", seed=0)
    assert_batch_matches(model, _trees(8, MIXED_TREES))


def test_mvrnn_one_leaf_beside_a_depth_20_chain():
    model, _ = INSTANCES["mvrnn"](1, size="small", seed=0)
    h = 16
    instances = []
    for k, (left, right, is_leaf, vec, root) in enumerate(_trees(h, MIXED_TREES)):
        mat = torch.eye(h).expand(len(left), h, h) + randn(len(left), h, h, seed=k, scale=0.02)
        instances.append((left, right, is_leaf, vec, mat * is_leaf[:, None, None], root))
    assert_batch_matches(model, instances)


def test_birnn_one_word_beside_sixty():
    model, _ = INSTANCES["birnn"](1, size="small", seed=0)
    assert_batch_matches(model, [(randn(n, 8, seed=n),) for n in (1, 60, 2, 33, 60)])


def test_stackrnn_one_word_beside_sixty():
    model, _ = INSTANCES["stackrnn"](1, size="small", seed=0)
    trees = [random_tree(1, 0), chain_tree(59), random_tree(60, 1), random_tree(2, 2), perfect_tree(3)]
    batched = assert_batch_matches(model, [(randn(t.num_leaves, 8, seed=k), transitions_for(t))
                                           for k, t in enumerate(trees)])
    if find_compiler() is not None:   # the loop, its SHIFT/REDUCE branch and its stack written in place: one call
        assert batched.schedule.loop_programs == 1 and not batched.schedule.stepped_loops


def test_nestedrnn_one_word_beside_twelve_with_20_and_40_inner_steps():
    model, _ = INSTANCES["nestedrnn"](1, size="small", seed=0)
    instances = [(randn(1, 8, seed=0), torch.tensor([40])),
                 (randn(12, 8, seed=1), torch.full((12,), 20)),
                 (randn(12, 8, seed=2), torch.tensor([20, 40] * 6)),
                 (randn(3, 8, seed=3), torch.tensor([33, 21, 40]))]
    assert_batch_matches(model, instances)


def test_drnn_root_only_beside_a_full_depth_6_tree():
    model, _ = INSTANCES["drnn"](1, size="small", seed=0)
    model.threshold = 0.0   # every node within the budget expands: 2^(budget+1) - 1 nodes
    instances = [(randn(8, seed=k), torch.tensor(b)) for k, b in enumerate([0, 6, 1, 3, 0])]
    assert [generated_nodes(model, *args) for args in instances] == [1, 127, 3, 15, 1]
    assert_batch_matches(model, instances)


def test_berxit_one_token_beside_sixty():
    model, _ = INSTANCES["berxit"](1, size="small", seed=0)
    instances = [(randn(n, 16, seed=n),) for n in (1, 60, 7, 60, 2)]
    assert_batch_matches(model, instances)


def test_berxit_attention_runs_in_buckets_of_similar_lengths():
    """Sentences of 1 to 60 tokens: attention (masked, padded to a width) runs once per bucket
    of similar lengths, padded to each bucket's longest; every result is eager's, with the
    buckets and without (one call over all, padded to 60)."""
    from cocktailer.batching import Techniques
    model, _ = INSTANCES["berxit"](1, size="small", seed=0)
    model.threshold = 2.0   # nobody leaves early: every layer sees every length
    lengths = [1, 60, 7, 60, 2, 3, 33, 5, 4, 9, 58, 2, 6, 1, 12, 8, 3, 45, 2, 5]
    instances = [(randn(n, 16, seed=k),) for k, n in enumerate(lengths)]
    batched = assert_batch_matches(model, instances, techniques=Techniques(lane_calls=False))
    assert batched.schedule.bucketed_calls >= 2 * len(model.layers)
    assert "buckets of instances of similar sizes" in cocktailer.explain(batched)
    unbucketed = assert_batch_matches(model, instances, techniques=Techniques(buckets=False, lane_calls=False))
    assert unbucketed.schedule.bucketed_calls == 0
    few = assert_batch_matches(model, instances[:5], techniques=Techniques(lane_calls=False))   # too few to split
    assert few.schedule.bucketed_calls == 0


def test_berxit_attention_runs_once_per_sentence_at_its_own_length():
    """By default the same sentences' attention runs as one call per sentence at its own
    length (the native lane loop), on the workers at once: no bucket, no padding; every
    result is eager's, the explanation says so, and a batch of fewer sentences than two a
    worker runs attention as one call over all of them."""
    from cocktailer.runtime.native import default_workers
    model, _ = INSTANCES["berxit"](1, size="small", seed=0)
    model.threshold = 2.0
    # (no sentence of one token: size 1 is compiled apart, its sentences a batch of their own)
    lengths = [2, 60, 7, 60, 2, 3, 33, 5, 4, 9, 58, 2, 6, 3, 12, 8, 3, 45, 2, 5]
    lengths *= -(-2 * default_workers() // len(lengths))   # two sentences a worker at least
    instances = [(randn(n, 16, seed=k),) for k, n in enumerate(lengths)]
    batched = assert_batch_matches(model, instances)
    assert batched.schedule.lane_calls == len(lengths) * len(model.layers)
    assert batched.schedule.bucketed_calls == 0
    assert "one per instance at its own size" in cocktailer.explain(batched)
    few = assert_batch_matches(model, instances[:2 * default_workers() - 1])   # fewer than two a worker
    assert few.schedule.lane_calls == 0


def test_an_encoder_layer_is_one_packed_block_before_attention_and_one_after():
    """Berxit's query, key and value Linears, each followed by its split into heads (a size
    read, a view, a transpose), make one packed block, not three, and the splits go to the
    attention block; the output projection, both LayerNorms and the FFN make another: with
    attention and the exit head, four native calls a layer. Every result is eager's."""
    from cocktailer.batching.blocks import Block
    model, _ = INSTANCES["berxit"](1, size="small", seed=0)
    model.threshold = 2.0
    instances = [(randn(n, 16, seed=n),) for n in (3, 9, 2, 14, 6)]   # (a sentence of 1 is a program of its own)
    batched = assert_batch_matches(model, instances)
    (executor,) = batched._executors.values()
    blocks = [p for parts in executor._segments.values() for p in parts if isinstance(p, Block)]
    assert len(blocks) == 4 * len(model.layers)
    products = [sum(op.op.name == "MATMUL" for op in b.ops) for b in blocks if b.packed is not None]
    assert products == [3, 3] * len(model.layers)   # (query, key, value), (out, ff1, ff2)
    # the splits into heads are views the attention block reads, not copies the first block makes
    for before, attention in zip(blocks[0::4], blocks[1::4]):
        assert "RESHAPE" not in {op.op.name for op in before.ops}
        assert sum(op.op.name == "RESHAPE" for op in attention.ops) == 3 and attention.masks


def test_buckets_split_lanes_of_very_different_sizes_only():
    from cocktailer.batching.buckets import buckets
    from cocktailer.batching.lanes import RowLayout
    even = RowLayout(torch.full((32,), 20), 20)
    assert buckets(even) is None                     # one call costs least
    sizes = torch.tensor([50, 3, 4, 48, 5, 2, 6, 7] * 4)
    layout = RowLayout(sizes, 50)
    plan = buckets(layout)
    assert plan is not None and 2 <= len(plan) <= 4
    together = torch.cat(plan.lanes)
    assert sorted(together.tolist()) == list(range(32))           # each lane in one bucket
    assert sizes[together].tolist() == sorted(sizes.tolist())     # shortest first
    # every bucket's padded rows hold its lanes' own rows first, the last one repeated after
    rows = torch.arange(layout.total)
    padded = rows[plan.gather]
    for lanes, width, start in zip(plan.lanes, plan.widths, plan.starts):
        assert width == int(sizes[lanes].max())
        for k, lane in enumerate(lanes.tolist()):
            own = rows[layout.offsets[lane]:layout.offsets[lane] + sizes[lane]]
            got = padded[start + k * width:start + (k + 1) * width]
            assert got.tolist() == own.tolist() + [own[-1].item()] * (width - len(own))
    assert torch.equal(padded[plan.scatter], rows)                # packing the padded rows gives them back


def test_sizes_have_their_hidden_dims():
    """The benchmark's sizes (building the models only: no instance is run)."""
    for size, hidden in (("256", 256), ("large512", 512)):
        model, instances = throughput.birnn_instances(2, size=size, seed=0)
        assert model.forward_cell.hidden_size == hidden and instances[0][0].shape[1] == hidden
