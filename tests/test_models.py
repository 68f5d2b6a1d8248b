"""The evaluation models (cocktailer.models): each runs eagerly, is captured with its control
flow intact, and the reference backend reproduces eager PyTorch on inputs whose decisions
(trip counts, skipped blocks, trees) differ. Input generators are deterministic and follow
their parameters. Everything runs at size="small"; size="paper" is only constructed."""
from __future__ import annotations

import statistics

import pytest
import torch

import cocktailer
from cocktailer import models

try:
    from tests.utils import assert_same, count_ops
except ImportError:  # tests/ on sys.path instead of the repository root
    from utils import assert_same, count_ops

NAMES = models.names()
CONTROL_FLOW = {  # the IR op that must survive capture, not unrolled away
    "lstm": "loop", "nasrnn": "loop", "attention": "loop", "seq2seq": "loop",
    "blockdrop": "if", "skipnet": "if",
    "rae": "call", "treelstm": "call", "treefc": "call",
}
SEEDS = (0, 1, 2, 3)
EDGE_CASES = {  # overrides that keep the shapes and push the decisions to their extremes
    "seq2seq": [{"target_length": 1}, {"target_length": 8}],
    "blockdrop": [{"exec_fraction": 0.0}, {"exec_fraction": 1.0}],
    "skipnet": [{"exec_fraction": 0.0}, {"exec_fraction": 1.0}],
    "rae": [{"max_leaves": 1, "nodes": 15}],        # a tree that is a single leaf
    "treelstm": [{"max_leaves": 1, "nodes": 15}],
}


def _instances(w: models.Workload) -> list[tuple]:
    return w.config["instances"] if not w.batches else [w.inputs]


def _clone(inputs: tuple) -> tuple:
    return tuple(x.clone() for x in inputs)


def test_names():
    assert NAMES == ["lstm", "nasrnn", "attention", "seq2seq", "blockdrop", "skipnet", "rae", "treelstm", "treefc"]
    assert set(CONTROL_FLOW) == set(NAMES)
    with pytest.raises(ValueError, match="unknown model"):
        models.make("resnet50")
    with pytest.raises(ValueError, match="unknown override"):
        models.make("lstm", size="small", hiden=4)
    with pytest.raises(ValueError, match="size"):
        models.make("lstm", size="huge")


# --------------------------------------------------------------------------- compiled == eager


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", NAMES)
def test_compiled_matches_eager(name, batch):
    """Compiled ONCE (seed 0's model and inputs); then the inputs of several seeds (other trip
    counts, skipped blocks, trees: the shapes stay the same) go through that one program."""
    w = models.make(name, batch, size="small", seed=0)
    assert not any(p.requires_grad for p in w.model.parameters()) and not w.model.training
    fast = cocktailer.compile(w.model, _clone(w.inputs), backend="reference")
    variants = [{"seed": s} for s in SEEDS] + EDGE_CASES.get(name, [])
    for variant in variants:
        for k, inputs in enumerate(_instances(models.make(name, batch, size="small", **variant))):
            with torch.no_grad():
                expected = w.model(*_clone(inputs))
                actual = fast(*_clone(inputs))
            assert_same(actual, expected, rtol=1e-4, atol=1e-6, path=f"{name} batch {batch} {variant} instance {k}")
    assert len(fast.cache) == 1   # no recompilation


@pytest.mark.parametrize("name", NAMES)
def test_compiled_matches_eager_other_weights(name):
    """Weights come from the seed too: another seed's model, compiled, still matches."""
    w = models.make(name, 2, size="small", seed=11)
    fast = cocktailer.compile(w.model, _clone(w.inputs), backend="reference")
    with torch.no_grad():
        assert_same(fast(*_clone(w.inputs)), w.model(*_clone(w.inputs)), rtol=1e-4, atol=1e-6, path=name)


@pytest.mark.parametrize("name", NAMES)
def test_control_flow_is_captured(name):
    w = models.make(name, 2, size="small")
    text = str(cocktailer.capture(w.model, _clone(w.inputs)))
    op = CONTROL_FLOW[name]
    if op == "call":   # recursion: the function calls itself (directly or through a helper)
        assert count_ops(text, "call") >= 2 and "func @" in text.split("\n\n", 1)[1], text
    elif name in ("blockdrop", "skipnet"):   # one `if` per residual block
        assert count_ops(text, "if") >= w.config["blocks"], text
    else:
        assert count_ops(text, "loop") >= 1, text


def test_loops_are_not_unrolled():
    """The program does not grow with the trip count."""
    for name, key in [("lstm", "seq_len"), ("nasrnn", "seq_len"), ("attention", "max_len"), ("seq2seq", "max_len")]:
        short = str(cocktailer.capture(*_model_inputs(name, **{key: 6})))
        long = str(cocktailer.capture(*_model_inputs(name, **{key: 12})))
        assert len(short.splitlines()) == len(long.splitlines()), (name, short, long)


def _model_inputs(name, **overrides):
    w = models.make(name, 2, size="small", **overrides)
    return w.model, _clone(w.inputs)


# --------------------------------------------------------------------------- input generators


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("name", NAMES)
def test_generators_are_deterministic(name):
    a, b = models.make(name, 2, size="small", seed=5), models.make(name, 2, size="small", seed=5)
    assert _equal(a.inputs, b.inputs) and _equal(a.config, b.config)
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    c = models.make(name, 2, size="small", seed=6)
    assert not _equal(a.inputs, c.inputs)
    # the global RNG is left alone
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models.make(name, 2, size="small", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_seeds_change_decisions():
    """Different seeds give different trees, lengths and block patterns."""
    for name, key in [("rae", "tree_nodes"), ("treelstm", "tree_nodes"), ("seq2seq", "target_lengths"),
                      ("blockdrop", "policy"), ("skipnet", "policy")]:
        patterns = {repr(models.make(name, 3, size="small", seed=s).config[key]) for s in range(4)}
        assert len(patterns) > 1, (name, patterns)
    sst = {models.make("rae", 1, seed=s, hidden=8).config["tree_nodes"][0] for s in range(4)}
    assert len(sst) > 1


# --------------------------------------------------------------------------- decision patterns


def _count_block_runs(model: torch.nn.Module, inputs: tuple) -> int:
    """How many residual block bodies eager PyTorch runs for these inputs."""
    calls = []
    hooks = [b.body.register_forward_hook(lambda *_: calls.append(1)) for b in model.blocks]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return len(calls)


@pytest.mark.parametrize("name", ["blockdrop", "skipnet"])
@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_executed_block_fraction_follows_parameter(name, fraction):
    w = models.make(name, 1, size="small", exec_fraction=fraction, seed=3)
    blocks = w.config["blocks"]
    expected = round(fraction * blocks)
    assert w.config["executed_blocks"] == [expected]
    assert _count_block_runs(w.model, w.inputs) == expected
    # at batch > 1 each sample runs its own share; the batch runs a block when any sample does
    w = models.make(name, 4, size="small", exec_fraction=fraction, seed=3)
    assert w.config["executed_blocks"] == [expected] * 4
    assert w.config["executed_fraction"] == pytest.approx(expected / blocks)
    assert _count_block_runs(w.model, w.inputs) == round(w.config["block_run_fraction"] * blocks)
    shared = models.make(name, 4, size="small", exec_fraction=fraction, seed=3, shared=True)
    assert _count_block_runs(shared.model, shared.inputs) == expected


def test_skipnet_gates_follow_the_pattern_per_sample():
    """The gate network's own decision (sigmoid(logit + bias) > 0.5) is the generated pattern."""
    w = models.make("skipnet", 3, size="small", exec_fraction=0.5, seed=4)
    logits = []
    hook = w.model.gate_proj.register_forward_hook(lambda m, i, o: logits.append(o.squeeze(1)))
    try:
        with torch.no_grad():
            w.model(*w.inputs)
    finally:
        hook.remove()
    gate_bias = w.inputs[1]
    decisions = torch.sigmoid(torch.stack(logits, 1) + gate_bias) > 0.5
    assert decisions.int().tolist() == w.config["policy"]
    assert torch.stack(logits).abs().max() < 11 / 10 ** 0.5   # a hard bound: the +-10 bias decides


def test_blockdrop_policy_is_per_sample():
    """A sample's result only depends on its own policy row, as if it ran alone."""
    w = models.make("blockdrop", 3, size="small", exec_fraction=0.5, seed=2)
    x, policy = w.inputs
    with torch.no_grad():
        together = w.model(x, policy)
        alone = torch.cat([w.model(x[i:i + 1], policy[i:i + 1]) for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)


def _decoded_lengths(tokens: torch.Tensor, eos: int) -> list[int]:
    return [int((row == eos).nonzero()[0]) + 1 if (row == eos).any() else 0 for row in tokens]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_seq2seq_lengths_follow_targets(seed):
    w = models.make("seq2seq", 4, size="small", seed=seed)
    fast = cocktailer.compile(w.model, w.inputs, backend="reference")
    targets = w.config["target_lengths"]
    for out in (w.model(*w.inputs), fast(*w.inputs)):
        assert _decoded_lengths(out, w.model.eos) == targets
        steps = max(targets)   # the loop ran exactly as long as the longest sequence
        assert (out[:, steps:] == w.model.pad).all() and (out[:, :steps] != w.model.pad).all()


def test_seq2seq_explicit_lengths():
    w = models.make("seq2seq", 3, size="small", target_lengths=[1, 8, 3])
    with torch.no_grad():
        assert _decoded_lengths(w.model(*w.inputs), w.model.eos) == [1, 8, 3]
    w = models.make("seq2seq", 2, size="small", target_length=5)
    assert w.config["target_lengths"] == [5, 5] and w.config["decode_steps"] == 5
    with pytest.raises(ValueError):
        models.make("seq2seq", 2, size="small", target_lengths=[1, 9])


def test_seq2seq_length_distribution():
    lengths = models.make("seq2seq", 2000, size="paper", hidden=4, vocab=8).config["target_lengths"]
    assert 1 <= min(lengths) and max(lengths) <= 50
    assert 9.0 < statistics.mean(lengths) < 11.0
    assert len(set(lengths)) > 10


def test_tree_workloads_run_one_tree_per_call():
    w = models.make("rae", 3, size="small", seed=1)
    assert not w.batches and len(w.config["instances"]) == 3
    assert w.inputs is w.config["instances"][0]
    left, right, is_leaf, inp, root = w.inputs
    nodes = w.config["nodes"]
    assert left.shape == right.shape == is_leaf.shape == (nodes,) and inp.shape == (nodes, 8)
    assert root.shape == () and root.dtype == torch.int64
    assert all(all(x.shape == y.shape for x, y in zip(inst, w.inputs)) for inst in w.config["instances"])
    # SST: padded to the largest tree, leaves read their token's embedding
    w = models.make("treelstm", 2, tree_index=3, hidden=8)
    trees, vocab = models.tree.sst_trees()
    assert w.config["nodes"] == max(t.num_nodes for t in trees)
    tree = trees[3]
    assert w.config["tree_nodes"] == [tree.num_nodes, trees[4].num_nodes]
    left, right, is_leaf, inp, root = w.inputs
    assert int(root) == tree.root and torch.equal(left[: tree.num_nodes], tree.left)
    assert (inp[~is_leaf] == 0).all() and (inp[tree.num_nodes:] == 0).all()
    first, second = tree.leaves_in_order()[:2]
    same_word = tree.tokens[0] == tree.tokens[1]
    assert torch.equal(inp[first], inp[second]) == same_word


# --------------------------------------------------------------------------- paper sizes


PAPER_SHAPES = {  # batch 2; the shapes of Cocktailer Table 1 (and Cortex for treelstm/treefc)
    "lstm": [(64, 2, 256)],
    "nasrnn": [(1000, 2, 256)],
    "attention": [(2, 32, 768)],
    "seq2seq": [(2, 256), (2, 256), (50, 2)],
    "blockdrop": [(2, 3, 32, 32), (2, 15)],
    "skipnet": [(2, 3, 224, 224), (2, 33)],
    "rae": [(95,), (95,), (95,), (95, 512), ()],
    "treelstm": [(95,), (95,), (95,), (95, 256), ()],
    "treefc": [(255,), (255,), (255,), (255, 256), ()],
}


@pytest.mark.parametrize("name", NAMES)
def test_paper_workloads_construct(name):
    w = models.make(name, 2)
    assert w.name == name and w.batch == 2 and not w.model.training
    assert [tuple(x.shape) for x in w.inputs] == PAPER_SHAPES[name]
    assert w.batches == (name not in ("rae", "treelstm", "treefc"))


def test_paper_model_sizes():
    lstm = models.make("lstm").model
    assert len(lstm.cells) == 10 and lstm.cells[0].hidden_size == 256
    attention = models.make("attention")
    assert attention.config["decode_steps"] == 32 and attention.config["hidden"] == 768
    seq2seq = models.make("seq2seq").model
    assert seq2seq.proj.out_features == 3797 and seq2seq.max_len == 50
    blockdrop = models.make("blockdrop")
    assert blockdrop.config["blocks"] == 15 and blockdrop.config["executed_blocks"] == [7]
    assert [b.body[-1][0].out_channels for b in blockdrop.model.blocks][::5] == [16, 32, 64]
    skipnet = models.make("skipnet")
    assert skipnet.config["blocks"] == 33 and skipnet.config["executed_blocks"] == [23]
    assert sum(p.numel() for p in skipnet.model.blocks.parameters()) > 40e6   # ResNet-101 body
    assert models.make("treefc", hidden=512).inputs[3].shape == (255, 512)
    assert models.make("treelstm", hidden=512).model.node.in_features == 1024
    assert models.make("rae").model.encode.in_features == 1024
