"""Stanford Sentiment Treebank (SST) parse trees, plus synthetic trees for tests.

STree.txt gives one tree per line in parent-pointer form: entry k (1-based) is
the parent of node k, 0 marks the root; the first n nodes are the leaves in
sentence order, where n is the token count of the matching SOStr.txt line.

A `Tree` keeps that numbering, made 0-based: leaves are 0..n-1 in sentence
order and internal nodes follow. Synthetic trees use the same convention.
"""

from __future__ import annotations

import os
import pathlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "Tree",
    "parse_stree",
    "load_sst",
    "sst_sample_dir",
    "perfect_tree",
    "chain_tree",
    "random_tree",
]

ENV_VAR = "COCKTAILER_SST_DIR"


@dataclass(frozen=True)
class Tree:
    """A binary tree as child-index tensors (leaves first, in sentence order)."""

    left: torch.Tensor  # int64 [num_nodes]; left child of each node, -1 for leaves
    right: torch.Tensor  # int64 [num_nodes]; right child, -1 for leaves
    is_leaf: torch.Tensor  # bool [num_nodes]
    root: int  # index of the root node
    tokens: tuple[str, ...] | None = None  # leaf words in sentence order, when known

    @property
    def num_nodes(self) -> int:
        """Number of nodes, leaves and internal."""
        return self.left.numel()

    @property
    def num_leaves(self) -> int:
        """Number of leaves."""
        return int(self.is_leaf.sum())

    @property
    def depth(self) -> int:
        """Edges on the longest root-to-leaf path (a lone leaf has depth 0)."""
        left, right = self.left.tolist(), self.right.tolist()
        best, stack = 0, [(self.root, 0)]
        while stack:  # explicit stack: chain trees can be deeper than the recursion limit
            node, d = stack.pop()
            if left[node] < 0:
                best = max(best, d)
            else:
                stack += [(left[node], d + 1), (right[node], d + 1)]
        return best

    def leaves_in_order(self) -> list[int]:
        """Leaf indices in left-to-right order."""
        left, right = self.left.tolist(), self.right.tolist()
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if left[node] < 0:
                out.append(node)
            else:
                stack += [right[node], left[node]]  # left is popped first
        return out

    def postorder(self) -> list[int]:
        """All nodes, children before parents (left subtree, right subtree, node)."""
        left, right = self.left.tolist(), self.right.tolist()
        out, stack = [], [self.root]
        while stack:  # build node-right-left preorder, then reverse it
            node = stack.pop()
            out.append(node)
            if left[node] >= 0:
                stack += [left[node], right[node]]
        out.reverse()
        return out

    def _key(self) -> tuple:
        """Plain-Python structure used for equality and hashing."""
        return (self.root, self.tokens, tuple(self.left.tolist()), tuple(self.right.tolist()))

    # The generated __eq__ would compare tensors elementwise and fail on bool();
    # compare structure instead so trees can be checked for equality and hashed.
    def __eq__(self, other: object) -> bool:
        """Structural equality (same children, root and tokens)."""
        return isinstance(other, Tree) and self._key() == other._key()

    def __hash__(self) -> int:
        """Hash consistent with structural equality."""
        return hash(self._key())


def _make_tree(left: list[int], right: list[int], root: int, tokens: Sequence[str] | None) -> Tree:
    lt = torch.tensor(left, dtype=torch.int64)
    return Tree(
        left=lt,
        right=torch.tensor(right, dtype=torch.int64),
        is_leaf=lt < 0,
        root=root,
        tokens=None if tokens is None else tuple(tokens),
    )


def parse_stree(line: str, tokens: Sequence[str] | None = None) -> Tree:
    """Parse one STree.txt line (1-based parent pointers, 0 = root) into a Tree."""
    # Error messages number nodes 1-based, as in the file.
    fields = line.strip().split("|")
    try:
        parent = [int(f) for f in fields]
    except ValueError:
        raise ValueError(f"parent indices must be integers, got {line.strip()!r}") from None
    n_nodes = len(parent)
    bad = [k + 1 for k, p in enumerate(parent) if not 0 <= p <= n_nodes]
    if bad:
        raise ValueError(f"parent index out of range 0..{n_nodes} for node(s) {bad[:5]}")
    roots = [k + 1 for k, p in enumerate(parent) if p == 0]
    if not roots:
        raise ValueError("no root (no node has parent 0)")
    if len(roots) > 1:
        raise ValueError(f"several roots: nodes {roots[:5]} have parent 0")

    children: list[list[int]] = [[] for _ in range(n_nodes)]  # 0-based from here on
    for k, p in enumerate(parent):
        if p:
            children[p - 1].append(k)
    for k, ch in enumerate(children):
        if len(ch) not in (0, 2):
            raise ValueError(f"node {k + 1} has {len(ch)} children; expected 0 or 2 (binary tree)")
    n_leaves = sum(not ch for ch in children)
    if any(children[k] for k in range(n_leaves)):
        raise ValueError(f"leaves must be the first {n_leaves} nodes")
    if tokens is not None and len(tokens) != n_leaves:
        raise ValueError(f"token count mismatch: {len(tokens)} tokens for {n_leaves} leaves")

    # Each non-root node has one parent, so any node unreachable from the root lies on a cycle.
    root = roots[0] - 1
    order, stack = [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        stack += children[node]
    if len(order) != n_nodes:
        raise ValueError(f"cycle: {n_nodes - len(order)} node(s) not reachable from the root")

    # Bottom-up: each node's span is [first, last] leaf. The left child is the one
    # whose span starts first; SST often numbers it higher than its sibling.
    first = list(range(n_nodes))
    last = list(range(n_nodes))
    left = [-1] * n_nodes
    right = [-1] * n_nodes
    for node in reversed(order):  # reversed preorder visits children before parents
        ch = children[node]
        if ch:
            a, b = ch if first[ch[0]] < first[ch[1]] else ch[::-1]
            if last[a] + 1 != first[b]:
                raise ValueError(f"node {node + 1} covers a non-contiguous span of leaves")
            left[node], right[node] = a, b
            first[node], last[node] = first[a], last[b]
    return _make_tree(left, right, root, tokens)


def sst_sample_dir() -> pathlib.Path:
    """Directory of the small SST sample bundled with the package."""
    return pathlib.Path(__file__).resolve().parent / "sst_sample"


def _read_lines(path: pathlib.Path) -> list[str]:
    # Split on '\n' only: str.splitlines() would also break on characters such as
    # U+2028 that could occur inside tokens. Trailing blank lines are dropped
    # (the real files end with one).
    lines = [ln.rstrip("\r") for ln in path.read_text(encoding="utf-8").split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def load_sst(directory: str | os.PathLike | None = None, *, limit: int | None = None) -> list[Tree]:
    """Load SST trees with tokens from STree.txt/SOStr.txt (default: $COCKTAILER_SST_DIR or the bundled sample)."""
    if directory is None:
        directory = os.environ.get(ENV_VAR) or sst_sample_dir()
    directory = pathlib.Path(directory)
    stree, sostr = directory / "STree.txt", directory / "SOStr.txt"
    missing = [str(p) for p in (stree, sostr) if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"SST files not found: {', '.join(missing)}. Pass a directory holding STree.txt and "
            f"SOStr.txt (Stanford Sentiment Treebank), or set ${ENV_VAR} to one."
        )
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    tree_lines, token_lines = _read_lines(stree), _read_lines(sostr)
    if len(tree_lines) != len(token_lines):
        raise ValueError(
            f"{stree} has {len(tree_lines)} lines but {sostr} has {len(token_lines)}; they must align"
        )
    trees = []
    for lineno, (tl, sl) in enumerate(zip(tree_lines[:limit], token_lines[:limit]), start=1):
        try:
            trees.append(parse_stree(tl, sl.split("|")))
        except ValueError as e:
            raise ValueError(f"{stree}: line {lineno}: {e}") from None
    return trees


def perfect_tree(height: int) -> Tree:
    """Complete binary tree with 2**height leaves and depth == height."""
    if height < 0:
        raise ValueError(f"height must be >= 0, got {height}")
    n = 2**height
    left, right = [-1] * n, [-1] * n
    level = list(range(n))
    while len(level) > 1:  # pair up adjacent subtrees, one level at a time
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            nxt.append(len(left))
            left.append(a)
            right.append(b)
        level = nxt
    return _make_tree(left, right, level[0], None)


def chain_tree(depth: int) -> Tree:
    """Left-deep tree of the given depth (depth + 1 leaves), for deep-recursion tests."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    n = depth + 1
    left, right = [-1] * n, [-1] * n
    top = 0
    for leaf in range(1, n):  # ((((0 1) 2) 3) ...)
        left.append(top)
        right.append(leaf)
        top = len(left) - 1
    return _make_tree(left, right, top, None)


def random_tree(num_leaves: int, seed: int) -> Tree:
    """Random binary bracketing of num_leaves leaves, deterministic by seed."""
    if num_leaves < 1:
        raise ValueError(f"num_leaves must be >= 1, got {num_leaves}")
    rng = random.Random(seed)
    left, right = [-1] * num_leaves, [-1] * num_leaves
    frontier = list(range(num_leaves))  # roots of the subtrees built so far, in order
    while len(frontier) > 1:  # merge a random adjacent pair until one tree remains
        i = rng.randrange(len(frontier) - 1)
        left.append(frontier[i])
        right.append(frontier[i + 1])
        frontier[i : i + 2] = [len(left) - 1]
    return _make_tree(left, right, frontier[0], None)
