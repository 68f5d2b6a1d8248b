"""Recursive models over binary trees: RAE (Cocktailer, Table 1), TreeLSTM and TreeFC (Cortex).

Every model is `forward(left, right, is_leaf, inp, root)` and recurses on itself (or a helper)
with `left[root]` / `right[root]`, so the recursion follows the tree given as data:

- left, right: int64 (nodes,), the children of each node, -1 at leaves and padding;
- is_leaf:     bool (nodes,), True at leaves and padding;
- inp:         float (nodes, hidden), the word embedding at each leaf, zeros elsewhere;
- root:        int64 0-d tensor.

Trees are padded to a fixed node count (by default the largest tree of the loaded SST data:
95 nodes in the bundled sample, 111 in the full treebank), so one compiled program serves every
tree. Leaf vectors come from a seeded embedding table indexed by token.

Trees diverge, so these models do not batch: at batch > 1 a workload runs one tree per call
(`batches=False`, `config["instances"]` holds one input tuple per tree).
"""
from __future__ import annotations

import functools
import random

import torch
import torch.nn as nn

from cocktailer.data import Tree, load_sst, perfect_tree, random_tree
from cocktailer.models.workload import Workload, build, generator, resolve_config


class RAE(nn.Module):
    """Recursive autoencoder's encoder (Socher et al.): a parent is tanh(W [left; right] + b)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.encode = nn.Linear(2 * hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root])
        r = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.encode(torch.cat([l, r], -1)))


class TreeLSTM(nn.Module):
    """Binary (N-ary, N = 2) TreeLSTM of Tai et al. (2015) over constituency trees: leaves read
    their word vector, internal nodes combine the children's (h, c) with one forget gate per child."""

    def __init__(self, hidden: int):
        super().__init__()
        self.leaf = nn.Linear(hidden, 3 * hidden)      # i, o, u from the word vector
        self.node = nn.Linear(2 * hidden, 5 * hidden)  # i, f_left, f_right, o, u from both children

    def forward(self, left, right, is_leaf, inp, root):
        h, c = self.encode(left, right, is_leaf, inp, root)
        return h

    def encode(self, left, right, is_leaf, inp, node):
        if is_leaf[node]:
            i, o, u = self.leaf(inp[node]).chunk(3, -1)
            c = torch.sigmoid(i) * torch.tanh(u)
            return torch.sigmoid(o) * torch.tanh(c), c
        h_l, c_l = self.encode(left, right, is_leaf, inp, left[node])
        h_r, c_r = self.encode(left, right, is_leaf, inp, right[node])
        i, f_l, f_r, o, u = self.node(torch.cat([h_l, h_r], -1)).chunk(5, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
        return torch.sigmoid(o) * torch.tanh(c), c


class TreeFC(nn.Module):
    """The benchmark model of Looks et al. (2017) that Cortex calls TreeFC: one fully connected
    layer per internal node over its two children, on perfect binary trees."""

    def __init__(self, hidden: int):
        super().__init__()
        self.left = nn.Linear(hidden, hidden)
        self.right = nn.Linear(hidden, hidden, bias=False)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root])
        r = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.left(l) + self.right(r))


# --------------------------------------------------------------------------- inputs


@functools.lru_cache(maxsize=4)
def sst_trees(directory: str | None = None) -> tuple[tuple[Tree, ...], dict[str, int]]:
    """The SST trees (bundled sample unless `directory`) and a token -> id vocabulary over them."""
    trees = tuple(load_sst(directory))
    vocab = {tok: i for i, tok in enumerate(sorted({tok for t in trees for tok in t.tokens}))}
    return trees, vocab


def tree_inputs(tree: Tree, token_ids: list[int], table: torch.Tensor, nodes: int) -> tuple:
    """(left, right, is_leaf, inp, root) for `tree`, padded to `nodes`; leaf k (sentence order)
    reads row token_ids[k] of the embedding table."""
    n = tree.num_nodes
    if n > nodes:
        raise ValueError(f"a tree of {n} nodes does not fit in {nodes} padded nodes")
    left = torch.full((nodes,), -1, dtype=torch.int64)
    right = torch.full((nodes,), -1, dtype=torch.int64)
    is_leaf = torch.ones(nodes, dtype=torch.bool)   # padding nodes are leaves nobody visits
    left[:n], right[:n], is_leaf[:n] = tree.left, tree.right, tree.is_leaf
    inp = torch.zeros(nodes, table.shape[1])
    leaves = torch.tensor(tree.leaves_in_order(), dtype=torch.int64)
    inp[leaves] = table[torch.tensor(token_ids, dtype=torch.int64)]
    return left, right, is_leaf, inp, torch.tensor(tree.root, dtype=torch.int64)


def _tree_workload(name: str, model: nn.Module, trees: list[Tree], token_ids: list[list[int]],
                   table: torch.Tensor, nodes: int, batch: int, cfg: dict) -> Workload:
    instances = [tree_inputs(t, ids, table, nodes) for t, ids in zip(trees, token_ids)]
    cfg.update(nodes=nodes, tree_nodes=[t.num_nodes for t in trees], tree_depths=[t.depth for t in trees],
               instances=instances)
    return Workload(name, model, instances[0], batch, cfg, batches=False)


def _parse_tree_workload(name: str, make_model, batch: int, size: str, seed: int, defaults: dict,
                         overrides: dict) -> Workload:
    """RAE and TreeLSTM: SST trees (paper) or random bracketings (small)."""
    cfg = resolve_config(name, size, defaults, overrides)
    model = build(lambda: make_model(cfg["hidden"]), seed)
    g = generator(seed + 1)
    if cfg["dataset"] == "sst":
        all_trees, vocab = sst_trees(cfg.get("sst_dir"))
        first = (seed if cfg.get("tree_index") is None else cfg["tree_index"]) % len(all_trees)
        cfg["tree_index"] = first
        trees = [all_trees[(first + k) % len(all_trees)] for k in range(batch)]
        token_ids = [[vocab[tok] for tok in t.tokens] for t in trees]
        nodes = cfg["nodes"] or max(t.num_nodes for t in all_trees)
        table = torch.randn(len(vocab), cfg["hidden"], generator=g)
    else:   # random bracketings of 1..max_leaves leaves, tokens from a small vocabulary
        rng = random.Random(seed)
        sizes = [rng.randint(1, cfg["max_leaves"]) for _ in range(batch)]
        trees = [random_tree(n, rng.randrange(1 << 30)) for n in sizes]
        token_ids = [[rng.randrange(cfg["vocab"]) for _ in range(n)] for n in sizes]
        nodes = cfg["nodes"] or 2 * cfg["max_leaves"] - 1
        table = torch.randn(cfg["vocab"], cfg["hidden"], generator=g)
    return _tree_workload(name, model, trees, token_ids, table, nodes, batch, cfg)


RAE_CONFIG = {
    "paper": {"hidden": 512, "dataset": "sst", "tree_index": None, "nodes": None, "sst_dir": None},
    "small": {"hidden": 8, "dataset": "random", "max_leaves": 8, "vocab": 20, "nodes": None},
}
TREELSTM_CONFIG = {
    "paper": {"hidden": 256, "dataset": "sst", "tree_index": None, "nodes": None, "sst_dir": None},
    "small": {"hidden": 8, "dataset": "random", "max_leaves": 8, "vocab": 20, "nodes": None},
}
TREEFC_CONFIG = {
    "paper": {"hidden": 256, "height": 7, "vocab": 1000, "nodes": None},
    "small": {"hidden": 8, "height": 3, "vocab": 20, "nodes": None},
}


def rae(batch: int, size: str, seed: int, **overrides) -> Workload:
    return _parse_tree_workload("rae", RAE, batch, size, seed, RAE_CONFIG, overrides)


def treelstm(batch: int, size: str, seed: int, **overrides) -> Workload:
    return _parse_tree_workload("treelstm", TreeLSTM, batch, size, seed, TREELSTM_CONFIG, overrides)


def treefc(batch: int, size: str, seed: int, **overrides) -> Workload:
    """Perfect binary trees of the given height; instances differ in their leaf tokens."""
    cfg = resolve_config("treefc", size, TREEFC_CONFIG, overrides)
    model = build(lambda: TreeFC(cfg["hidden"]), seed)
    g = generator(seed + 1)
    table = torch.randn(cfg["vocab"], cfg["hidden"], generator=g)
    tree = perfect_tree(cfg["height"])
    token_ids = torch.randint(cfg["vocab"], (batch, tree.num_leaves), generator=g).tolist()
    nodes = cfg["nodes"] or tree.num_nodes
    return _tree_workload("treefc", model, [tree] * batch, token_ids, table, nodes, batch, cfg)
