"""Recursion constructs: the RAE from the Cocktailer paper and variants. The tree is DATA:
each test compiles once and then runs trees of different structure (depth 0, 1, 2, 5, 20+,
random), all padded to the same number of nodes so the tensor shapes never change."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn

try:
    from tests.utils import assert_matches_eager, capture_text, count_ops, randn
except ImportError:  # tests/ on sys.path instead of the repository root
    from utils import assert_matches_eager, capture_text, count_ops, randn

NODES = 64   # every tree is padded to this many nodes
HIDDEN = 16


# --------------------------------------------------------------------------- tiny tree builder
# A shape is None (a leaf) or a pair (left shape, right shape).


def perfect(depth):
    return None if depth == 0 else (perfect(depth - 1), perfect(depth - 1))


def chain(depth, side="left"):
    if depth == 0:
        return None
    return (chain(depth - 1, side), None) if side == "left" else (None, chain(depth - 1, side))


def random_shape(leaves, rng):
    if leaves == 1:
        return None
    k = rng.randint(1, leaves - 1)
    return (random_shape(k, rng), random_shape(leaves - k, rng))


def depth_of(shape):
    return 0 if shape is None else 1 + max(depth_of(shape[0]), depth_of(shape[1]))


class Tree:
    """left/right: int64 (NODES,), -1 at leaves and padding; is_leaf: bool (NODES,);
    root: int. order='bfs' numbers the root 0, order='post' numbers children before
    parents (root last), so the root index is data too."""

    def __init__(self, shape, order="bfs"):
        index = self._number(shape, order)
        assert index["count"] <= NODES, index["count"]
        self.left = torch.full((NODES,), -1, dtype=torch.int64)
        self.right = torch.full((NODES,), -1, dtype=torch.int64)
        self.is_leaf = torch.ones(NODES, dtype=torch.bool)  # padding nodes are leaves
        for node, (l, r) in index["children"].items():
            self.left[node], self.right[node] = l, r
            self.is_leaf[node] = False
        self.root = index["root"]
        self.num_nodes = index["count"]
        self.depth = depth_of(shape)

    @staticmethod
    def _number(shape, order):
        children = {}
        if order == "bfs":
            root = 0
            queue = [(shape, 0)]
            counter = 1
            while queue:
                s, i = queue.pop(0)
                if s is not None:
                    l, r = counter, counter + 1
                    counter += 2
                    children[i] = (l, r)
                    queue.append((s[0], l))
                    queue.append((s[1], r))
            return {"children": children, "root": root, "count": counter}
        counter = 0

        def post(s):
            nonlocal counter
            if s is None:
                counter += 1
                return counter - 1
            l = post(s[0])
            r = post(s[1])
            counter += 1
            children[counter - 1] = (l, r)
            return counter - 1

        root = post(shape)
        return {"children": children, "root": root, "count": counter}

    def inputs(self, seed, root_as_tensor=True):
        inp = randn(NODES, HIDDEN, seed=seed)
        root = torch.tensor(self.root, dtype=torch.int64) if root_as_tensor else self.root
        return (self.left, self.right, self.is_leaf, inp, root)


def tree_zoo(order="bfs"):
    rng = random.Random(0)
    shapes = {
        "random8": random_shape(8, rng),
        "leaf": None,
        "depth1": perfect(1),
        "depth2": perfect(2),
        "depth2_uneven": ((None, None), None),
        "perfect5": perfect(5),
        "chain20": chain(20, "left"),
        "chain30_right": chain(30, "right"),
        "random20": random_shape(20, rng),
        "random32": random_shape(32, rng),
    }
    return {name: Tree(s, order) for name, s in shapes.items()}


def test_tree_builder_sanity():
    trees = tree_zoo()
    assert [trees[k].depth for k in ("leaf", "depth1", "depth2", "perfect5", "chain20", "chain30_right")] == [0, 1, 2, 5, 20, 30]
    assert trees["perfect5"].num_nodes == 63 and trees["leaf"].num_nodes == 1
    for order in ("bfs", "post"):
        for t in tree_zoo(order).values():
            internal = (~t.is_leaf).nonzero().flatten().tolist()
            assert len(internal) == (t.num_nodes - 1) // 2
            kids = sorted(t.left[internal].tolist() + t.right[internal].tolist())
            assert kids == sorted(set(range(t.num_nodes)) - {t.root})


def zoo_inputs(order="bfs", first=None, root_as_tensor=True, seed=0):
    trees = tree_zoo(order)
    names = list(trees)
    if first is not None:
        names.remove(first)
        names.insert(0, first)
    return [trees[n].inputs(seed + i, root_as_tensor) for i, n in enumerate(names)]


def seeded(cls, *args, seed=0, **kwargs):
    torch.manual_seed(seed)
    return cls(*args, **kwargs).eval()


# --------------------------------------------------------------------------- models


class RAE(nn.Module):
    """The paper's recursive autoencoder encoder."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.enc = nn.Linear(2 * hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root])
        r = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.enc(torch.cat([l, r], -1)))


class RAEItem(nn.Module):
    """The RAE with Python-int indices: `left[root].item()`."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.enc = nn.Linear(2 * hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root].item())
        r = self.forward(left, right, is_leaf, inp, right[root].item())
        return torch.tanh(self.enc(torch.cat([l, r], -1)))


class RAEMutual(nn.Module):
    """Two methods calling each other: levels alternate between two encoders."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.enc_even = nn.Linear(2 * hidden, hidden)
        self.enc_odd = nn.Linear(2 * hidden, hidden)

    def forward(self, left, right, is_leaf, inp, root):
        return self.even(left, right, is_leaf, inp, root)

    def even(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.odd(left, right, is_leaf, inp, left[root])
        r = self.odd(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.enc_even(torch.cat([l, r], -1)))

    def odd(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root] * 2
        l = self.even(left, right, is_leaf, inp, left[root])
        r = self.even(left, right, is_leaf, inp, right[root])
        return torch.relu(self.enc_odd(torch.cat([l, r], -1)))


class TreeLSTM(nn.Module):
    """Binary TreeLSTM-style recursion returning a tuple (h, c) from every call."""

    def __init__(self, hidden=HIDDEN):
        super().__init__()
        self.hidden = hidden
        self.leaf = nn.Linear(hidden, 2 * hidden)
        self.gates = nn.Linear(2 * hidden, 5 * hidden)

    def forward(self, left, right, is_leaf, inp, root):
        h, c = self.node(left, right, is_leaf, inp, root)
        return h, c

    def node(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            c, o = self.leaf(inp[root]).chunk(2, -1)
            return torch.sigmoid(o) * torch.tanh(c), c
        lh, lc = self.node(left, right, is_leaf, inp, left[root])
        rh, rc = self.node(left, right, is_leaf, inp, right[root])
        i, fl, fr, o, u = self.gates(torch.cat([lh, rh], -1)).chunk(5, -1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * lc + torch.sigmoid(fr) * rc
        return torch.sigmoid(o) * torch.tanh(c), c


def tree_sum(left, right, is_leaf, value, root):
    """A plain recursive function (not a module)."""
    if is_leaf[root]:
        return value[root]
    return tree_sum(left, right, is_leaf, value, left[root]) * 0.5 + tree_sum(left, right, is_leaf, value, right[root])


def fib(n):
    """Recursion on a 0-d tensor argument."""
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("first", ["random8", "leaf", "perfect5"])
def test_rae_tensor_index(first):
    assert_matches_eager(seeded(RAE), zoo_inputs(first=first))


def test_rae_post_order_root_is_data():
    """Root index differs per tree (post-order numbering: root last) and is a tensor."""
    inputs = zoo_inputs("post") + zoo_inputs("bfs", seed=100)
    assert len({int(s[4]) for s in inputs}) > 3
    assert_matches_eager(seeded(RAE), inputs)


def test_rae_item_index():
    assert_matches_eager(seeded(RAEItem), zoo_inputs(root_as_tensor=False))


def test_rae_item_index_root_int_varies():
    """The top-level root is a Python int that differs between calls."""
    inputs = zoo_inputs("post", root_as_tensor=False)
    assert len({s[4] for s in inputs}) > 3
    assert_matches_eager(seeded(RAEItem), inputs)


def test_rae_mutual_recursion():
    assert_matches_eager(seeded(RAEMutual), zoo_inputs())


def test_treelstm_tuple_returning_recursion():
    assert_matches_eager(seeded(TreeLSTM), zoo_inputs(), rtol=1e-4, atol=1e-5)


def test_plain_recursive_function():
    inputs = []
    for i, t in enumerate(tree_zoo("post").values()):
        left, right, is_leaf, _, root = t.inputs(i)
        inputs.append((left, right, is_leaf, randn(NODES, seed=500 + i), root))
    assert_matches_eager(tree_sum, inputs)


def test_fib_recursion_on_scalar_tensor():
    inputs = [(torch.tensor(n),) for n in [5, 0, 1, 2, 7, 10]]
    assert_matches_eager(fib, inputs)


@pytest.mark.parametrize("model_cls", [RAE, RAEMutual])
def test_recursion_is_captured_as_call_and_if(model_cls):
    text = capture_text(seeded(model_cls), tree_zoo()["depth2"].inputs(0))
    assert count_ops(text, "call") >= 1, text
    assert count_ops(text, "if") >= 1, text


def test_rae_hidden_sizes():
    for hidden in (8, 32):
        torch.manual_seed(1)
        model = RAE(hidden).eval()
        inputs = [(l, r, leaf, randn(NODES, hidden, seed=i), root) for i, (l, r, leaf, _, root) in enumerate(zoo_inputs())]
        assert_matches_eager(model, inputs)


def test_a_recursive_result_read_only_by_a_branch_that_does_nothing():
    """Seed 2004533: dead code must go as a whole. An `if` with an empty body reads the call's
    result through its condition; the call's result must not be dropped while that stays."""
    def rec(left, right, is_leaf, data, node):
        if is_leaf[node]:
            return data[node] * 2.0
        return torch.tanh(rec(left, right, is_leaf, data, left[node]) - rec(left, right, is_leaf, data, right[node]))

    def f(y, left, right, is_leaf, data, root):
        r = rec(left, right, is_leaf, data, root)
        if (torch.stack([y, r]) > 0.5).any():
            pass
        return y * 2
    tree = (torch.tensor([1, -1, -1]), torch.tensor([2, -1, -1]), torch.tensor([False, True, True]))
    assert_matches_eager(f, [(randn(3, seed=s), *tree, randn(3, 3, seed=s + 1), torch.tensor(0)) for s in range(2)])
