"""Recursion over trees of Python node objects: linearized into index tables at call time
(cocktailer/frontend/nodes.py), so one compiled program serves every tree of a node count,
and what the program assigns on the nodes is on the real nodes afterwards, as in eager."""
import copy
import warnings

import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer.models import corpus
from utils import backends_under_test, randn


class BinNode:
    def __init__(self, x, left=None, right=None):
        self.x, self.left, self.right = x, left, right

    def is_leaf(self):
        return self.left is None


class BinaryTreeRNN(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.w = nn.Linear(2 * d, d)

    def forward(self, node):
        if node.is_leaf():
            node.state = torch.tanh(node.x)
            return node.state
        a = self.forward(node.left)
        b = self.forward(node.right)
        node.state = torch.tanh(self.w(torch.cat([a, b])))
        return node.state


def binary_tree(seed: int, nodes: int) -> BinNode:
    g = torch.Generator().manual_seed(seed)

    def grow(n):
        if n == 1:
            return BinNode(torch.randn(4, generator=g))
        k = int(torch.randint(1, n, (), generator=g))
        return BinNode(torch.randn(4, generator=g), grow(k), grow(n - k))
    return grow(nodes)


def walk(node):
    yield node
    for child in [getattr(node, "left", None), getattr(node, "right", None), *getattr(node, "children", [])]:
        if child is not None:
            yield from walk(child)


def assert_trees_match(model, trees, backend, field="state", compiles=1):
    """The compiled model on each tree (a copy of it) against eager on another copy: the
    results, and `field` on every node; `compiles` programs in all."""
    fast = cocktailer.compile(model.eval(), backend=backend)
    for tree in trees:
        eager_tree, compiled_tree = copy.deepcopy(tree), copy.deepcopy(tree)
        with torch.no_grad():
            expected, actual = model(eager_tree), fast(compiled_tree)
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)
        for e, c in zip(walk(eager_tree), walk(compiled_tree)):
            assert type(getattr(c, field)) is torch.Tensor   # a real tensor, not a capture-time stand-in
            torch.testing.assert_close(getattr(c, field), getattr(e, field), rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(c.x, e.x)
    assert len(fast.cache) == compiles
    return fast


@pytest.mark.parametrize("backend", backends_under_test())
def test_one_program_for_every_binary_tree_of_a_size(backend):
    torch.manual_seed(0)
    trees = [binary_tree(s, 6) for s in range(4)]
    assert len({str([n.left is None for n in walk(t)]) for t in trees}) > 1   # shapes differ
    assert_trees_match(BinaryTreeRNN(), trees, backend)


@pytest.mark.parametrize("backend", backends_under_test())
def test_child_sum_tree_lstm_over_children_lists(backend):
    torch.manual_seed(0)
    trees = [corpus.random_tree(s, nodes=7) for s in range(4)]
    assert len({max(len(n.children) for n in walk(t)) for t in trees}) > 1   # different branching
    assert_trees_match(corpus.ChildSumTreeLSTM(), trees, backend)


def test_another_node_count_is_another_program():
    torch.manual_seed(0)
    assert_trees_match(BinaryTreeRNN(), [binary_tree(0, 5), binary_tree(1, 7), binary_tree(2, 5)], "reference",
                       compiles=2)


class Scaled(nn.Module):
    """Reads a number field, tests `is not None` and truthiness of a node, writes a node's
    tensor in place."""

    def forward(self, node):
        out = node.x * node.weight
        if node.left is not None:
            out = out + self.forward(node.left)
        if node.right:
            out = out + self.forward(node.right)
        node.x.mul_(2.0)
        return out


def weighted_tree(seed):
    tree = binary_tree(seed, 5)
    for k, node in enumerate(walk(tree)):
        node.weight = 0.5 * k + seed
    return tree


@pytest.mark.parametrize("backend", backends_under_test())
def test_number_fields_truthiness_and_in_place_writes_into_node_tensors(backend):
    fast = cocktailer.compile(Scaled(), backend=backend)
    for seed in range(3):
        eager_tree, compiled_tree = weighted_tree(seed), weighted_tree(seed)
        with torch.no_grad():
            torch.testing.assert_close(fast(compiled_tree), Scaled()(eager_tree))
        for e, c in zip(walk(eager_tree), walk(compiled_tree)):
            torch.testing.assert_close(c.x, e.x)   # the node's own tensor was doubled
    assert len(fast.cache) == 1


class ByLabel(nn.Module):
    """Decides on a string field: trees cannot be tables, and each tree is its own program."""

    def forward(self, node):
        out = node.x if node.label == "keep" else -node.x
        for child in (node.left, node.right):
            if child is not None:
                out = out + self.forward(child)
        return out


def test_a_field_tables_cannot_hold_compiles_per_tree_as_before():
    trees = [binary_tree(s, 3) for s in range(2)]
    for t in trees:
        for k, node in enumerate(walk(t)):
            node.label = "keep" if k % 2 else "flip"
    fast = cocktailer.compile(ByLabel(), backend="reference")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in trees:
            torch.testing.assert_close(fast(t), ByLabel()(t))
    assert len(fast.cache) == 2


def test_a_number_field_the_program_needs_as_a_python_int_compiles_per_tree():
    """`SCALES[node.depth]` needs a Python int: the table's tensor cannot be one, so the tree
    is read as Python objects (one program per tree) instead of refused. (`range(node.depth)`
    needs none: it is a loop with a tensor trip count.)"""
    scales = [0.5, 2.0, -1.0, 3.0]

    def repeat(x, node):
        for _ in range(node.depth):
            x = x * 0.5 + 1.0
        x = x * scales[node.depth]
        for child in node.children:
            x = repeat(x, child)
        return x

    class Tree:
        def __init__(self, depth, children=()):
            self.depth, self.children = depth, list(children)
    fast = cocktailer.compile(repeat, backend="reference")
    for tree in [Tree(2, [Tree(1)]), Tree(3, [Tree(0)])]:
        torch.testing.assert_close(fast(randn(3, seed=0), tree), repeat(randn(3, seed=0), tree))
    assert len(fast.cache) == 2 and fast._kept_as_objects == {Tree}


class AddsIntoChildState(nn.Module):
    def forward(self, node):
        if node.left is None:
            node.state = node.x * 2.0
            return node.state
        a = self.forward(node.left)
        b = self.forward(node.right)
        a.add_(torch.tanh(node.x))          # in eager, this is the left child's `state` itself
        node.state = torch.tanh(a - b)
        return node.state


@pytest.mark.parametrize("backend", backends_under_test())
@pytest.mark.parametrize("run_before", [False, True])
def test_writes_through_a_read_field_reach_the_node(backend, run_before):
    """Found by fuzzing the linearizer: where nodes already held `state` (the tree ran
    before), reading it gave a copy, and the parent's in-place write missed the child."""
    trees = [binary_tree(s, 5) for s in range(3)]
    if run_before:
        with torch.no_grad():
            for t in trees:
                AddsIntoChildState()(t)
    assert_trees_match(AddsIntoChildState(), trees, backend)


class StatesByLabel(nn.Module):
    """Assigns a field on every node, and decides on a string field (so it compiles per tree)."""

    def forward(self, node):
        out = node.x if node.label == "keep" else -node.x
        for child in (node.left, node.right):
            if child is not None:
                out = out + self.forward(child)
        node.state = torch.tanh(out)
        return node.state


@pytest.mark.parametrize("backend", backends_under_test())
def test_a_tree_compiled_per_object_gets_the_fields_the_program_assigns_on_every_node(backend):
    """Capture assigns on the user's nodes while it traces: every one of them is restored
    (they held capture's placeholders before), and the call assigns what eager would."""
    def labelled(seed):
        tree = binary_tree(seed, 3)
        for k, node in enumerate(walk(tree)):
            node.label = "keep" if k % 2 else "flip"
        return tree
    fast = cocktailer.compile(StatesByLabel(), backend=backend)
    for seed in range(2):
        mine, eager = labelled(seed), labelled(seed)
        with torch.no_grad():
            torch.testing.assert_close(fast(mine), StatesByLabel()(eager), rtol=1e-4, atol=1e-5)
        for m, e in zip(walk(mine), walk(eager)):
            assert type(m.state) is torch.Tensor
            torch.testing.assert_close(m.state, e.state, rtol=1e-4, atol=1e-5)
