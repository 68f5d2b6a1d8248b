"""Tests for the SST tree loader (cocktailer.data)."""

import os
import pathlib

import pytest
import torch

from cocktailer.data import (
    Tree,
    chain_tree,
    load_sst,
    parse_stree,
    perfect_tree,
    random_tree,
    sst_sample_dir,
)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
FULL_LINES = 11855
FULL_MAX_DEPTH = 29


def full_sst_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("COCKTAILER_SST_DIR") or REPO_ROOT.parent / "shared" / "data" / "sst")


def check_invariants(tree: Tree) -> None:
    """Check a tree's structure independently of the loader's own bookkeeping."""
    left, right, is_leaf = tree.left.tolist(), tree.right.tolist(), tree.is_leaf.tolist()
    n_nodes, n = tree.num_nodes, tree.num_leaves
    assert tree.left.dtype == tree.right.dtype == torch.int64 and tree.is_leaf.dtype == torch.bool
    assert len(left) == len(right) == len(is_leaf) == n_nodes == 2 * n - 1
    # Leaves are the first n nodes; internal nodes have two children.
    assert is_leaf == [True] * n + [False] * (n_nodes - n)
    for k in range(n_nodes):
        if is_leaf[k]:
            assert left[k] == right[k] == -1
        else:
            assert 0 <= left[k] < n_nodes and 0 <= right[k] < n_nodes and left[k] != right[k]
    # Every node but the root has exactly one parent.
    parents = [0] * n_nodes
    for c in left + right:
        if c >= 0:
            parents[c] += 1
    assert parents[tree.root] == 0
    assert all(parents[k] == 1 for k in range(n_nodes) if k != tree.root)
    # Postorder: a permutation ending at the root, children before parents.
    post = tree.postorder()
    assert sorted(post) == list(range(n_nodes)) and post[-1] == tree.root
    pos = {node: i for i, node in enumerate(post)}
    for k in range(n_nodes):
        if not is_leaf[k]:
            assert pos[left[k]] < pos[k] and pos[right[k]] < pos[k]
    # Spans: the left child's leaves come right before the right child's.
    span, height = {}, {}
    for k in post:
        if is_leaf[k]:
            span[k], height[k] = (k, k), 0
        else:
            (a0, a1), (b0, b1) = span[left[k]], span[right[k]]
            assert a1 + 1 == b0
            span[k], height[k] = (a0, b1), 1 + max(height[left[k]], height[right[k]])
    assert span[tree.root] == (0, n - 1)
    assert tree.leaves_in_order() == list(range(n))
    assert tree.depth == height[tree.root]
    if tree.tokens is not None:
        assert len(tree.tokens) == n


# Hand-checked trees: (line, left, right, root, depth). Nodes are 0-based.
HAND_TREES = [
    ("3|3|0", [-1, -1, 0], [-1, -1, 1], 2, 1),  # (a b)
    ("4|4|5|5|0", [-1, -1, -1, 0, 3], [-1, -1, -1, 1, 2], 4, 2),  # ((a b) c): left child has the higher index
    ("5|4|4|5|0", [-1, -1, -1, 1, 0], [-1, -1, -1, 2, 3], 4, 2),  # (a (b c))
    ("5|5|4|0|4", [-1, -1, -1, 4, 0], [-1, -1, -1, 2, 1], 3, 2),  # ((a b) c), root not last
    ("0", [-1], [-1], 0, 0),  # a lone leaf
]


@pytest.mark.parametrize("line,left,right,root,depth", HAND_TREES)
def test_hand_checked(line, left, right, root, depth):
    tree = parse_stree(line)
    assert tree.left.tolist() == left
    assert tree.right.tolist() == right
    assert tree.is_leaf.tolist() == [c == -1 for c in left]
    assert tree.root == root
    assert tree.depth == depth
    assert tree.tokens is None
    check_invariants(tree)


def test_tokens_kept():
    tree = parse_stree("4|4|5|5|0\n", ["not", "very", "good"])
    assert tree.tokens == ("not", "very", "good")
    assert tree.num_leaves == 3 and tree.num_nodes == 5
    assert tree.postorder() == [0, 1, 3, 2, 4]


def test_first_bundled_line():
    (tree,) = load_sst(sst_sample_dir(), limit=1)
    # "The Rock is destined ... Segal ." : 36 tokens, 71 nodes, root is node 71 (1-based).
    assert tree.num_leaves == 36 and tree.num_nodes == 71 and tree.root == 70
    assert tree.tokens[:2] == ("The", "Rock") and tree.tokens[35] == "."
    # Nodes 1 and 2 point at 70, nodes 69 and 70 at 71: the root splits "The Rock" | rest.
    assert (tree.left[70].item(), tree.right[70].item()) == (69, 68)
    assert (tree.left[69].item(), tree.right[69].item()) == (0, 1)
    # Node 69 (0-based 68) has children 36 (".") and 68 (the rest); the period goes right.
    assert (tree.left[68].item(), tree.right[68].item()) == (67, 35)
    assert tree.depth == 17
    check_invariants(tree)


def test_bundled_sample(monkeypatch):
    monkeypatch.delenv("COCKTAILER_SST_DIR", raising=False)
    trees = load_sst()
    assert len(trees) == 110
    for tree in trees:
        check_invariants(tree)
    depths = [t.depth for t in trees]
    assert max(depths[:100]) == 24
    assert max(depths) == FULL_MAX_DEPTH  # the appended deepest sentences
    assert all(d >= 20 for d in depths[100:])
    assert load_sst(sst_sample_dir()) == trees
    assert (sst_sample_dir() / "README.md").is_file()


def test_limit():
    sample = sst_sample_dir()
    assert len(load_sst(sample, limit=0)) == 0
    assert load_sst(sample, limit=3) == load_sst(sample)[:3]
    with pytest.raises(ValueError):
        load_sst(sample, limit=-1)


@pytest.mark.parametrize("height", range(7))
def test_perfect_tree(height):
    tree = perfect_tree(height)
    assert tree.depth == height
    assert tree.num_leaves == 2**height
    check_invariants(tree)


@pytest.mark.parametrize("depth", [0, 1, 2, 5, 30])
def test_chain_tree(depth):
    tree = chain_tree(depth)
    assert tree.depth == depth
    assert tree.num_leaves == depth + 1
    check_invariants(tree)
    if depth:  # left-deep: the root's right child is the last leaf
        assert tree.right[tree.root].item() == depth


def test_deep_chain_needs_no_recursion():
    tree = chain_tree(5000)  # far beyond Python's default recursion limit
    assert tree.depth == 5000
    assert tree.leaves_in_order() == list(range(5001))
    assert tree.postorder()[-1] == tree.root


@pytest.mark.parametrize("num_leaves", [1, 2, 3, 7, 30])
def test_random_tree_valid(num_leaves):
    tree = random_tree(num_leaves, seed=num_leaves)
    assert tree.num_leaves == num_leaves
    check_invariants(tree)


def test_random_tree_deterministic():
    assert random_tree(20, seed=3) == random_tree(20, seed=3)
    assert hash(random_tree(20, seed=3)) == hash(random_tree(20, seed=3))
    assert len({random_tree(20, seed=s) for s in range(10)}) > 1


def test_synthetic_bad_sizes():
    for make in (lambda: perfect_tree(-1), lambda: chain_tree(-1), lambda: random_tree(0, seed=0)):
        with pytest.raises(ValueError):
            make()


@pytest.mark.parametrize(
    "line,tokens,match",
    [
        ("", None, "integer"),
        ("3|x|0", None, "integer"),
        ("3|3|9", None, "out of range"),
        ("3|3|-1", None, "out of range"),
        ("2|1", None, "no root"),
        ("3|3|0|0", None, "several roots"),
        ("2|0", None, "1 children"),
        ("4|4|0|4", None, "3 children"),
        ("0|1|1", None, "leaves must be"),
        ("5|5|6|7|0|7|6", None, "cycle"),
        ("5|6|5|6|7|7|0", None, "non-contiguous"),
        ("3|3|0", ["only"], "token count"),
    ],
)
def test_malformed(line, tokens, match):
    with pytest.raises(ValueError, match=match):
        parse_stree(line, tokens)


def write_sst(directory: pathlib.Path, stree: str, sostr: str) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "STree.txt").write_text(stree, encoding="utf-8")
    (directory / "SOStr.txt").write_text(sostr, encoding="utf-8")
    return directory


def test_env_var_honoured(tmp_path, monkeypatch):
    env_dir = write_sst(tmp_path / "env", "3|3|0\n4|4|5|5|0\n\n", "good|film\nnot|that|bad\n\n")
    monkeypatch.setenv("COCKTAILER_SST_DIR", str(env_dir))
    trees = load_sst()
    assert [t.tokens for t in trees] == [("good", "film"), ("not", "that", "bad")]
    # An explicit directory wins over the environment.
    arg_dir = write_sst(tmp_path / "arg", "3|3|0", "just|one")
    assert [t.tokens for t in load_sst(arg_dir)] == [("just", "one")]


def test_missing_files(tmp_path, monkeypatch):
    monkeypatch.setenv("COCKTAILER_SST_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="COCKTAILER_SST_DIR"):
        load_sst()
    (tmp_path / "STree.txt").write_text("3|3|0\n")
    with pytest.raises(FileNotFoundError, match="SOStr.txt"):
        load_sst(tmp_path)


def test_bad_file_names_line(tmp_path):
    directory = write_sst(tmp_path, "3|3|0\n3|3|3\n", "a|b\nc|d\n")
    with pytest.raises(ValueError, match="line 2"):
        load_sst(directory)


def test_misaligned_files(tmp_path):
    directory = write_sst(tmp_path, "3|3|0\n3|3|0\n", "a|b\n")
    with pytest.raises(ValueError, match="align"):
        load_sst(directory)


def test_full_file():
    directory = full_sst_dir()
    if not (directory / "STree.txt").is_file():
        pytest.skip(f"full SST data not found at {directory}")
    if directory.resolve() == sst_sample_dir():
        pytest.skip("COCKTAILER_SST_DIR points at the bundled sample, not the full data")
    trees = load_sst(directory)
    assert len(trees) == FULL_LINES
    for tree in trees:
        check_invariants(tree)
    depths = [t.depth for t in trees]
    assert max(depths) == FULL_MAX_DEPTH
    # The bundled sample is lines 1-100 plus the 10 deepest trees, in file order.
    deepest = sorted(sorted(range(100, len(trees)), key=lambda i: (-depths[i], i))[:10])
    assert load_sst(sst_sample_dir()) == trees[:100] + [trees[i] for i in deepest]
