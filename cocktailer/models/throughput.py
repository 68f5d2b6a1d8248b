"""The evaluation models of ACROBAT (Table 3) and Cortex, for throughput mode (`cocktailer.batch`).

Every model is written for ONE instance, in plain PyTorch, the way a user writes it: recursion
and loops in Python, with trip counts and decisions that differ from instance to instance.
`<name>_instances(count, size, seed)` returns the model (weights from `seed`, eval mode) and a
list of `count` argument tuples, one per instance, whose sizes differ (tree shapes, sentence
lengths, inner trip counts, exit layers, generated tree sizes):

    model, instances = INSTANCES["treegru"](64, size="256", seed=0)
    batched = cocktailer.batch(model, instances[0])
    outs = batched(instances)        # == [model(*args) for args in instances]

| name      | control flow                                                  | one instance                  |
|-----------|---------------------------------------------------------------|-------------------------------|
| treegru   | recursion over a binary tree (Cortex's TreeGRU)               | tree index tables             |
| mvrnn     | recursion over a binary tree, a vector and a matrix per node  | tree tables + node matrices   |
| birnn     | two loops over the sentence (forward, backward)               | word vectors (n, hidden)      |
| stackrnn  | loop over shift/reduce transitions, a branch per step         | word vectors, transitions     |
| nestedrnn | loop over words, an inner loop of 20-40 steps per word        | word vectors, inner counts    |
| drnn      | recursion whose expansion depends on the generated state      | root state, depth bound       |
| berxit    | transformer layers, leaving after the first confident exit    | token embeddings (n, hidden)  |

Sizes: "small" (hidden 8-16, for tests), "256" and "512" (the benchmark's hidden sizes; the
aliases "small256" and "large512" name the same). Trees, as in `cocktailer.models.tree`, are
index tables `(left, right, is_leaf, inp, root)` at each tree's own node count (no padding:
`batch` takes instances of different sizes); small trees are random bracketings of 1-8 leaves,
the 256 / 512 sizes use the SST trees (the bundled sample unless $COCKTAILER_SST_DIR). Sentences
are random lengths in the small size and the SST sentences (their own lengths) otherwise, word
vectors rows of a seeded embedding table indexed by token.

Exceptions to hidden = 256 / 512: MV-RNN keeps an h x h matrix at every node (cost cubic in h,
and an (nodes, h, h) table per instance), so its 256 / 512 sizes use h = 64 / 128.
"""
from __future__ import annotations

import math
import random
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from cocktailer.data import Tree, random_tree
from cocktailer.models.tree import sst_trees, tree_inputs
from cocktailer.models.workload import build, generator

__all__ = ["TreeGRU", "MVRNN", "BiRNN", "StackRNN", "NestedRNN", "DRNN", "Berxit", "INSTANCES", "SIZES",
           "treegru_instances", "mvrnn_instances", "birnn_instances", "stackrnn_instances",
           "nestedrnn_instances", "drnn_instances", "berxit_instances"]

SIZES = ("small", "256", "512")
_ALIASES = {"small256": "256", "large512": "512"}


def _size(size: str) -> str:
    size = _ALIASES.get(str(size), str(size))
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES} (or {sorted(_ALIASES)}), got {size!r}")
    return size


# --------------------------------------------------------------------------- models


class TreeGRU(nn.Module):
    """Binary Tree-GRU (Cortex): a leaf is tanh(W x); an internal node gates its two children
    with a reset gate each and an update gate, h = z * (h_l + h_r) / 2 + (1 - z) * h~."""

    def __init__(self, hidden: int):
        super().__init__()
        self.leaf = nn.Linear(hidden, hidden)
        self.gates = nn.Linear(2 * hidden, 3 * hidden)     # r_left, r_right, z
        self.candidate = nn.Linear(2 * hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return torch.tanh(self.leaf(inp[root]))
        h_l = self.forward(left, right, is_leaf, inp, left[root])
        h_r = self.forward(left, right, is_leaf, inp, right[root])
        r_l, r_r, z = torch.sigmoid(self.gates(torch.cat([h_l, h_r]))).chunk(3)
        h_new = torch.tanh(self.candidate(torch.cat([r_l * h_l, r_r * h_r])))
        return z * (h_l + h_r) * 0.5 + (1 - z) * h_new


class MVRNN(nn.Module):
    """Matrix-vector RNN (Socher et al., 2012): every node has a vector and a matrix; a parent of
    (a, A) and (b, B) is p = tanh(W [B a; A b] + bias), P = W_M [A; B]. Returns the root's (p, P)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.compose = nn.Linear(2 * hidden, hidden)
        eye = torch.eye(hidden)   # W_M starts near [I I] / 2, so matrices stay O(1) in deep trees
        self.compose_matrix = nn.Parameter(torch.cat([eye, eye], 1) * 0.5 + torch.randn(hidden, 2 * hidden) * 0.01)

    def forward(self, left, right, is_leaf, vec, mat, root):
        if is_leaf[root]:
            return vec[root], mat[root]
        a, A = self.forward(left, right, is_leaf, vec, mat, left[root])
        b, B = self.forward(left, right, is_leaf, vec, mat, right[root])
        p = torch.tanh(self.compose(torch.cat([B @ a, A @ b])))
        P = self.compose_matrix @ torch.cat([A, B], 0)
        return p, P


class BiRNN(nn.Module):
    """Bidirectional GRU over one sentence, the final states of both directions concatenated
    and classified."""

    def __init__(self, hidden: int, classes: int = 5):
        super().__init__()
        self.hidden = hidden
        self.forward_cell = nn.GRUCell(hidden, hidden)
        self.backward_cell = nn.GRUCell(hidden, hidden)
        self.classify = nn.Linear(2 * hidden, classes)

    def forward(self, xs):
        n = xs.shape[0]
        h_f = xs.new_zeros(self.hidden)
        h_b = xs.new_zeros(self.hidden)
        for t in range(n):
            h_f = self.forward_cell(xs[t], h_f)
        for t in range(n):
            h_b = self.backward_cell(xs[-1 - t], h_b)
        return self.classify(torch.cat([h_f, h_b]))


SHIFT, REDUCE = 1, 0


class StackRNN(nn.Module):
    """A shift-reduce (stack) RNN in the manner of SPINN: SHIFT pushes the next word's leaf
    vector, REDUCE pops the top two entries and pushes their composition (with the tracker's
    state), and after every transition a tracker GRU reads the new top of the stack. The stack
    is a tensor of one row per word (it never holds more) with a pointer to its free row.
    Returns the final top of the stack."""

    def __init__(self, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.leaf = nn.Linear(hidden, hidden)
        self.tracker = nn.GRUCell(hidden, hidden)
        self.compose = nn.Linear(3 * hidden, hidden)

    def forward(self, xs, transitions):
        stack = torch.zeros_like(xs)
        top = torch.tensor(0)      # the next free row
        word = torch.tensor(0)     # the next word to shift
        tracking = xs.new_zeros(self.hidden)
        for t in range(transitions.shape[0]):
            if transitions[t] == SHIFT:
                stack[top] = torch.tanh(self.leaf(xs[word]))
                top = top + 1
                word = word + 1
            else:
                right, left = stack[top - 1], stack[top - 2]
                stack[top - 2] = torch.tanh(self.compose(torch.cat([left, right, tracking])))
                top = top - 1
            tracking = self.tracker(stack[top - 1], tracking)
        return stack[top - 1]


class NestedRNN(nn.Module):
    """Two nested recurrences: an outer GRU over the words, and for each word an inner RNN that
    runs `inner_steps[t]` steps (20-40) on that word before the outer step reads its result."""

    def __init__(self, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.inner = nn.RNNCell(hidden, hidden)
        self.outer = nn.GRUCell(hidden, hidden)

    def forward(self, xs, inner_steps):
        h = xs.new_zeros(self.hidden)
        for t in range(xs.shape[0]):
            g = h
            for _ in range(inner_steps[t]):
                g = self.inner(xs[t], g)
            h = self.outer(g, h)
        return h


class DRNN(nn.Module):
    """Doubly-recurrent network (Alvarez-Melis & Jaakkola, 2017), simplified to binary top-down
    tree generation. A node expands while the depth budget lasts and its expansion gate
    sigmoid(w . h + b) exceeds `threshold`; its first child's state comes from the parent's
    (ancestral recurrence), the second's from the parent's and its sibling's (fraternal
    recurrence). Returns the sum of the generated nodes' states."""

    def __init__(self, hidden: int, threshold: float = 0.5):
        super().__init__()
        self.threshold = threshold
        self.ancestral = nn.Linear(hidden, hidden)
        self.fraternal = nn.Linear(hidden, hidden, bias=False)
        self.expand = nn.Linear(hidden, 1)

    def forward(self, root_state, depth_budget):
        return self.generate(root_state, depth_budget)

    def spawn(self, h):
        first = torch.tanh(self.ancestral(h))
        second = torch.tanh(self.ancestral(h) + self.fraternal(first))
        return first, second

    def generate(self, h, budget):
        total = h
        if budget > 0 and torch.sigmoid(self.expand(h))[0] > self.threshold:
            first, second = self.spawn(h)
            total = total + self.generate(first, budget - 1) + self.generate(second, budget - 1)
        return total


class EncoderLayer(nn.Module):
    """A post-norm BERT encoder layer over one sentence x (n, d), written with torch ops the way
    BERT implementations do (separate query, key and value projections)."""

    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ffn)
        self.ff2 = nn.Linear(ffn, d)
        self.norm2 = nn.LayerNorm(d)

    def split_heads(self, x):   # (n, d) -> (heads, n, head_dim)
        return x.view(x.shape[0], self.heads, self.head_dim).transpose(0, 1)

    def forward(self, x):
        n, d = x.shape
        q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        attention = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(self.head_dim), -1)
        y = (attention @ v).transpose(0, 1).contiguous().view(n, d)
        x = self.norm1(x + self.out(y))
        return self.norm2(x + self.ff2(F.gelu(self.ff1(x))))


class Berxit(nn.Module):
    """Early-exit BERT (BERxiT / DeeBERT style): after every encoder layer a classifier reads the
    first token; the sentence leaves as soon as the largest class probability exceeds
    `threshold`. Returns the class probabilities of the layer it left at."""

    def __init__(self, d: int, heads: int, layers: int, ffn: int, classes: int = 2, threshold: float = 0.9):
        super().__init__()
        self.threshold = threshold
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ffn) for _ in range(layers))
        self.exits = nn.ModuleList(nn.Linear(d, classes) for _ in range(layers))

    def forward(self, x):
        for layer, exit_head in zip(self.layers, self.exits):
            x = layer(x)
            p = torch.softmax(exit_head(x[0]), -1)
            if p.max() > self.threshold:
                return p
        return p


# --------------------------------------------------------------------------- inputs


def _config(configs: dict, size: str) -> dict:
    return dict(configs[_size(size)])


def _trees(count: int, cfg: dict, seed: int) -> tuple[list[Tree], list[list[int]], int]:
    """`count` trees with the token ids of their leaves (sentence order), and the vocabulary size:
    SST trees (drawn with replacement) or random bracketings of 1..max_leaves leaves."""
    rng = random.Random(seed)
    if cfg["dataset"] == "sst":
        all_trees, vocab = sst_trees()
        trees = [all_trees[rng.randrange(len(all_trees))] for _ in range(count)]
        return trees, [[vocab[tok] for tok in t.tokens] for t in trees], len(vocab)
    sizes = [rng.randint(1, cfg["max_leaves"]) for _ in range(count)]
    trees = [random_tree(n, rng.randrange(1 << 30)) for n in sizes]
    return trees, [[rng.randrange(cfg["vocab"]) for _ in range(n)] for n in sizes], cfg["vocab"]


def _sentences(count: int, cfg: dict, seed: int) -> tuple[list[list[int]], int]:
    """Token ids of `count` sentences and the vocabulary size: SST sentences, or random lengths
    in 1..max_len."""
    if cfg["dataset"] == "sst":
        _, token_ids, vocab = _trees(count, cfg, seed)
        return token_ids, vocab
    rng = random.Random(seed)
    return [[rng.randrange(cfg["vocab"]) for _ in range(rng.randint(1, cfg["max_len"]))] for _ in range(count)], cfg["vocab"]


def _between(values: list[float], fraction: float) -> float:
    """A threshold with about `fraction` of `values` above it, halfway between two of them (so
    that no value of the calibration lies on it)."""
    values = sorted(set(values))
    if len(values) == 1:
        return values[0] - 1e-3
    k = min(len(values) - 2, max(0, int(len(values) * (1 - fraction)) - 1))
    return (values[k] + values[k + 1]) / 2


def _table(vocab: int, hidden: int, seed: int) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=generator(seed))


def transitions_for(tree: Tree) -> torch.Tensor:
    """The shift-reduce transitions that build `tree` (its post-order: SHIFT at a leaf, REDUCE
    at an internal node), int64 (2 * leaves - 1,)."""
    left = tree.left.tolist()
    return torch.tensor([SHIFT if left[node] < 0 else REDUCE for node in tree.postorder()], dtype=torch.int64)


TREEGRU_CONFIG = {
    "small": {"hidden": 8, "dataset": "random", "max_leaves": 8, "vocab": 20},
    "256": {"hidden": 256, "dataset": "sst"},
    "512": {"hidden": 512, "dataset": "sst"},
}
MVRNN_CONFIG = {
    "small": {"hidden": 16, "dataset": "random", "max_leaves": 8, "vocab": 20},
    "256": {"hidden": 64, "dataset": "sst"},
    "512": {"hidden": 128, "dataset": "sst"},
}
SENTENCE_CONFIG = {
    "small": {"hidden": 8, "dataset": "random", "max_len": 20, "vocab": 20},
    "256": {"hidden": 256, "dataset": "sst"},
    "512": {"hidden": 512, "dataset": "sst"},
}
NESTED_CONFIG = {
    "small": {"hidden": 8, "dataset": "random", "max_len": 8, "vocab": 20, "inner": (20, 40)},
    "256": {"hidden": 256, "dataset": "sst", "inner": (20, 40)},
    "512": {"hidden": 512, "dataset": "sst", "inner": (20, 40)},
}
DRNN_CONFIG = {
    "small": {"hidden": 8, "max_depth": 5, "expand_fraction": 0.6},
    "256": {"hidden": 256, "max_depth": 7, "expand_fraction": 0.6},
    "512": {"hidden": 512, "max_depth": 7, "expand_fraction": 0.6},
}
BERXIT_CONFIG = {
    "small": {"hidden": 16, "heads": 2, "layers": 4, "ffn": 32, "dataset": "random", "max_len": 20, "vocab": 20},
    "256": {"hidden": 256, "heads": 4, "layers": 12, "ffn": 1024, "dataset": "sst"},
    "512": {"hidden": 512, "heads": 8, "layers": 12, "ffn": 2048, "dataset": "sst"},
}


def treegru_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """TreeGRU over `count` trees, each at its own node count."""
    cfg = _config(TREEGRU_CONFIG, size)
    model = build(lambda: TreeGRU(cfg["hidden"]), seed)
    trees, token_ids, vocab = _trees(count, cfg, seed)
    table = _table(vocab, cfg["hidden"], seed + 1)
    return model, [tree_inputs(t, ids, table, t.num_nodes) for t, ids in zip(trees, token_ids)]


def mvrnn_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """MV-RNN over `count` trees: (left, right, is_leaf, vec, mat, root), a word's matrix the
    identity plus noise (Socher et al.'s initialization), zeros at internal nodes."""
    cfg = _config(MVRNN_CONFIG, size)
    h = cfg["hidden"]
    model = build(lambda: MVRNN(h), seed)
    trees, token_ids, vocab = _trees(count, cfg, seed)
    table = _table(vocab, h, seed + 1)
    g = generator(seed + 2)
    instances = []
    for t, ids in zip(trees, token_ids):
        left, right, is_leaf, vec, root = tree_inputs(t, ids, table, t.num_nodes)
        mat = torch.zeros(t.num_nodes, h, h)
        leaves = torch.tensor(t.leaves_in_order(), dtype=torch.int64)
        mat[leaves] = torch.eye(h) + torch.randn(len(leaves), h, h, generator=g) * (0.1 / math.sqrt(h))
        instances.append((left, right, is_leaf, vec, mat, root))
    return model, instances


def birnn_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """BiRNN over `count` sentences: (xs,), xs (length, hidden)."""
    cfg = _config(SENTENCE_CONFIG, size)
    model = build(lambda: BiRNN(cfg["hidden"]), seed)
    token_ids, vocab = _sentences(count, cfg, seed)
    table = _table(vocab, cfg["hidden"], seed + 1)
    return model, [(table[torch.tensor(ids)],) for ids in token_ids]


def stackrnn_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """StackRNN over `count` sentences with their parse's transitions: (xs, transitions), the
    transitions those of the SST tree or of a random bracketing."""
    cfg = _config(SENTENCE_CONFIG, size)
    model = build(lambda: StackRNN(cfg["hidden"]), seed)
    if cfg["dataset"] == "sst":
        trees, token_ids, vocab = _trees(count, cfg, seed)
    else:
        token_ids, vocab = _sentences(count, cfg, seed)
        trees = [random_tree(len(ids), seed * 7919 + k) for k, ids in enumerate(token_ids)]
    table = _table(vocab, cfg["hidden"], seed + 1)
    return model, [(table[torch.tensor(ids)], transitions_for(t)) for t, ids in zip(trees, token_ids)]


def nestedrnn_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """NestedRNN over `count` sentences: (xs, inner_steps), inner_steps int64 (length,) in 20..40."""
    cfg = _config(NESTED_CONFIG, size)
    model = build(lambda: NestedRNN(cfg["hidden"]), seed)
    token_ids, vocab = _sentences(count, cfg, seed)
    table = _table(vocab, cfg["hidden"], seed + 1)
    low, high = cfg["inner"]
    g = generator(seed + 2)
    return model, [(table[torch.tensor(ids)], torch.randint(low, high + 1, (len(ids),), generator=g))
                   for ids in token_ids]


def generated_nodes(model: DRNN, root_state: torch.Tensor, depth_budget) -> int:
    """How many nodes `model` generates from this root (the root included), in eager PyTorch."""
    with torch.no_grad():
        def count(h, budget):
            if budget > 0 and torch.sigmoid(model.expand(h))[0] > model.threshold:
                return 1 + sum(count(child, budget - 1) for child in model.spawn(h))
            return 1
        return count(root_state, int(depth_budget))


def _calibrate_drnn(model: DRNN, roots: torch.Tensor, depth: int, expand_fraction: float) -> float:
    """The gate threshold at which `expand_fraction` of the nodes of full trees of `depth` (grown
    from `roots`) would expand: a fixed model, whatever the instances asked for."""
    gates = []
    with torch.no_grad():
        frontier = list(roots)
        for _ in range(depth):
            gates += [float(torch.sigmoid(model.expand(h))[0]) for h in frontier]
            frontier = [child for h in frontier for child in model.spawn(h)]
    return _between(gates, expand_fraction)


def drnn_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """DRNN generating `count` trees: (root_state, depth_budget), the budget a 0-d int64 in
    1..max_depth; the expansion threshold is set once per model so that about `expand_fraction`
    of the nodes would expand, so instances stop at different depths and sizes."""
    cfg = _config(DRNN_CONFIG, size)
    h = cfg["hidden"]
    model = build(lambda: DRNN(h), seed)
    calibration = torch.randn(8, h, generator=generator(seed + 3))
    model.threshold = _calibrate_drnn(model, calibration, 4, cfg["expand_fraction"])
    g = generator(seed + 1)
    rng = random.Random(seed)
    roots = torch.randn(count, h, generator=g)
    return model, [(roots[k].clone(), torch.tensor(rng.randint(1, cfg["max_depth"]))) for k in range(count)]


def exit_layers(model: Berxit, xs: torch.Tensor) -> int:
    """The layer (1-based) at which `model` lets this sentence leave, in eager PyTorch."""
    with torch.no_grad():
        for depth, (layer, exit_head) in enumerate(zip(model.layers, model.exits), 1):
            xs = layer(xs)
            if torch.softmax(exit_head(xs[0]), -1).max() > model.threshold:
                return depth
        return len(model.layers)


def _calibrate_berxit(model: Berxit, sentences: list[torch.Tensor]) -> float:
    """The threshold that spreads these sentences' exit layers most evenly (largest entropy),
    halfway between two of the confidences seen (so that no calibration sentence lies on it)."""
    confidences = []
    with torch.no_grad():
        for xs in sentences:
            row = []
            for layer, exit_head in zip(model.layers, model.exits):
                xs = layer(xs)
                row.append(float(torch.softmax(exit_head(xs[0]), -1).max()))
            confidences.append(row)
    seen = sorted({c for row in confidences for c in row})
    best, best_entropy = 0.5, -1.0
    for threshold in [(a + b) / 2 for a, b in zip(seen, seen[1:])]:
        exits: dict[int, int] = {}
        for row in confidences:
            layer = next((k for k, c in enumerate(row) if c > threshold), len(row) - 1)
            exits[layer] = exits.get(layer, 0) + 1
        entropy = -sum(n / len(confidences) * math.log(n / len(confidences)) for n in exits.values())
        if entropy > best_entropy:
            best, best_entropy = threshold, entropy
    return best


def berxit_instances(count: int, size: str = "small", seed: int = 0) -> tuple[nn.Module, list[tuple]]:
    """Berxit over `count` sentences: (xs,), xs (length, hidden) token embeddings; the exit
    threshold is set once per model (from 32 calibration sentences) so that sentences leave at
    different layers."""
    cfg = _config(BERXIT_CONFIG, size)
    d = cfg["hidden"]
    model = build(lambda: Berxit(d, cfg["heads"], cfg["layers"], cfg["ffn"]), seed)
    token_ids, vocab = _sentences(count, cfg, seed)
    table = _table(vocab, d, seed + 1)
    calibration_ids, _ = _sentences(32, cfg, seed + 1000)
    model.threshold = _calibrate_berxit(model, [table[torch.tensor(ids)] for ids in calibration_ids])
    return model, [(table[torch.tensor(ids)],) for ids in token_ids]


INSTANCES: dict[str, Callable[..., tuple[nn.Module, list[tuple]]]] = {
    "treegru": treegru_instances,
    "mvrnn": mvrnn_instances,
    "birnn": birnn_instances,
    "stackrnn": stackrnn_instances,
    "nestedrnn": nestedrnn_instances,
    "drnn": drnn_instances,
    "berxit": berxit_instances,
}
