"""A JAX `vmap` peer for throughput mode (many instances per call), for reference: the models of
`cocktailer.models.tree` (RAE, TreeLSTM, TreeFC) and of `cocktailer.models.throughput`
(TreeGRU, BiRNN) written the way JAX can express them, as masked execution.

`jax_vmapped(name, model)` copies the torch model's weights (float32) once and returns a
function from a list of instance argument tuples to the list of per-instance results, equal to
`model(*args)` per instance. Each call:

1. pads every instance to the batch's largest size, rounded up to a multiple of `BUCKET`
   (trees: node tables, the internal nodes numbered first; BiRNN: the sentence), in numpy:
   one copy per instance into the batch's arrays, then array ops over all instances at once
   (no Python loop over nodes); this preprocessing is part of the call and timed with it;
2. runs one `jax.jit`-compiled program (one compilation per padded shape, cached by `jax.jit`
   and shared by every peer of the same model), in which ONE instance's computation is
   written in JAX and `jax.vmap`-ed over the instances:
   - trees: node heights by a fixed point, then a `lax.fori_loop` over heights 1..max height
     of the batch; at every step EVERY internal node (padding included) is computed from its
     children's rows of the results table, and only the nodes of the current height keep the
     new value (`jnp.where`); leaves are computed once, before the loop;
   - BiRNN: both directions in one `lax.fori_loop` over the batch's longest sentence, every
     instance stepped at every position and the steps past its own length masked out (the
     input projections of all positions done up front as one product);
3. copies the roots' results back as torch tensors.

So every instance costs what the batch's extremes cost: a tree model computes (internal
nodes of the largest tree, bucketed) x (height of the deepest tree) nodes per instance, where
the level-by-level peers (`bench.batch_peers.hand_batched`, `cocktailer.batch`) compute each
node once; on the benchmark's 64 SST trees (`bench.batching.tree_workload`) that is 48 x 29
node computations per tree against about 19, on TreeFC's perfect trees 128 x 7 against 127.
This is masked execution, the reference the issue asks for ("JAX vmap where the model can be
expressed"), not a competitor built to lose: within it the peer is as fast as JAX allows, one
jitted program per call, every product one GEMM over all instances' nodes, no Python over
nodes or steps at call time (RAE at hidden 512, batch 64: the whole program within about 15%
of its loop's GEMMs alone).

JAX runs on the CPU (`JAX_PLATFORMS=cpu` if this module is what first imports jax and the
variable is unset; inputs and weights are placed on the CPU device in any case), in float32
whether or not another module enabled `jax_enable_x64` (every array's dtype is explicit). XLA
keeps its own thread pool; torch's thread settings are not touched.
"""
from __future__ import annotations

import os
import sys

if "jax" not in sys.modules:   # JAX on the CPU only, no probing for accelerators (read when jax is imported)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn as nn
from jax import lax

MODELS = ("rae", "treelstm", "treefc", "treegru", "birnn")
TREE_MODELS = ("rae", "treelstm", "treefc", "treegru")
BUCKET = 16      # padded sizes are rounded up to a multiple of this, to limit recompilation

Peer = Callable[[list], list]

_CPU = jax.devices("cpu")[0]


def bucket(n: int) -> int:
    """`n` rounded up to a multiple of BUCKET (at least BUCKET)."""
    return max(BUCKET, -(-n // BUCKET) * BUCKET)


def _f32(t: torch.Tensor) -> jax.Array:
    return jax.device_put(np.ascontiguousarray(t.detach().cpu().numpy(), dtype=np.float32), _CPU)


def _wt(linear: nn.Linear) -> jax.Array:
    """The weight of `linear` transposed, (in, out): x @ W + b is linear(x)."""
    return _f32(linear.weight.T)


# --------------------------------------------------------------------------- weights


def _params(name: str, model: nn.Module) -> dict:
    if name == "rae":
        return {"w": _wt(model.encode), "b": _f32(model.encode.bias)}
    if name == "treefc":   # left(l) + right(r) as one product over [l; r]
        return {"w": _f32(torch.cat([model.left.weight.T, model.right.weight.T], 0)), "b": _f32(model.left.bias)}
    if name == "treelstm":
        return {"w_leaf": _wt(model.leaf), "b_leaf": _f32(model.leaf.bias),
                "w_node": _wt(model.node), "b_node": _f32(model.node.bias)}
    if name == "treegru":
        return {"w_leaf": _wt(model.leaf), "b_leaf": _f32(model.leaf.bias),
                "w_gates": _wt(model.gates), "b_gates": _f32(model.gates.bias),
                "w_cand": _wt(model.candidate), "b_cand": _f32(model.candidate.bias)}
    if name == "birnn":
        def cell(c: nn.GRUCell) -> dict:
            return {"w_ih": _f32(c.weight_ih.T), "b_ih": _f32(c.bias_ih),
                    "w_hh": _f32(c.weight_hh.T), "b_hh": _f32(c.bias_hh)}
        return {"fwd": cell(model.forward_cell), "bwd": cell(model.backward_cell),
                "w_cls": _wt(model.classify), "b_cls": _f32(model.classify.bias)}
    raise ValueError(f"no JAX peer for {name!r}; have {MODELS}")


# --------------------------------------------------------------------------- one tree node, in JAX
# leaf(p, inp) -> the tables' values at every node as a leaf, each (nodes, hidden);
# node(p, *children) -> the tables' values at every internal node, from each table's children
# rows (internal, 2, hidden), [:, 0] the left child and [:, 1] the right.


def _pair(x):   # (n, 2, h) -> (n, 2h): [left; right], torch.cat([l, r], -1) per node
    return x.reshape(x.shape[0], -1)


def _rae_leaf(p, inp):
    return (inp,)


def _rae_node(p, h):
    return (jnp.tanh(_pair(h) @ p["w"] + p["b"]),)


def _treefc_node(p, h):
    return (jnp.tanh(_pair(h) @ p["w"] + p["b"]),)


def _treelstm_leaf(p, inp):
    i, o, u = jnp.split(inp @ p["w_leaf"] + p["b_leaf"], 3, -1)
    c = jax.nn.sigmoid(i) * jnp.tanh(u)
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def _treelstm_node(p, h, c):
    i, f_l, f_r, o, u = jnp.split(_pair(h) @ p["w_node"] + p["b_node"], 5, -1)
    c = jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(f_l) * c[:, 0] + jax.nn.sigmoid(f_r) * c[:, 1]
    return jax.nn.sigmoid(o) * jnp.tanh(c), c


def _treegru_leaf(p, inp):
    return (jnp.tanh(inp @ p["w_leaf"] + p["b_leaf"]),)


def _treegru_node(p, h):
    x = _pair(h)
    r_l, r_r, z = jnp.split(jax.nn.sigmoid(x @ p["w_gates"] + p["b_gates"]), 3, -1)
    h_new = jnp.tanh((jnp.concatenate([r_l, r_r], -1) * x) @ p["w_cand"] + p["b_cand"])
    return (z * (h[:, 0] + h[:, 1]) * 0.5 + (1 - z) * h_new,)


_TREE_CELLS = {"rae": (_rae_leaf, _rae_node), "treefc": (_rae_leaf, _treefc_node),
               "treelstm": (_treelstm_leaf, _treelstm_node), "treegru": (_treegru_leaf, _treegru_node)}


# --------------------------------------------------------------------------- one tree instance, masked
# An instance: inp (nodes, hidden), the node tables' inputs at their own node ids; kids
# (internal, 2) int32, each internal node's children as rows of the results table, which holds
# the internal nodes first (rows 0..internal-1, by rank) and then every node as a leaf (row
# internal + node id); root, its row. Padding internal rows point at row `internal` (a leaf).


def _heights(kids: jax.Array) -> jax.Array:
    """One instance's internal nodes' heights (a leaf's is 0): the fixed point of
    h = 1 + max(h[left], h[right]), all nodes at once per step, until nothing changes."""
    internal = kids.shape[0]

    def step(state):
        h, _, it = state
        child = jnp.where(kids < internal, h[jnp.minimum(kids, internal - 1)], 0)
        new = 1 + child.max(1)
        return new, jnp.any(new != h), it + 1

    h0 = jnp.ones(internal, jnp.int32)
    h, _, _ = lax.while_loop(lambda s: s[1] & (s[2] <= internal), step, (h0, jnp.bool_(True), jnp.int32(0)))
    return h


def _tree_instance(leaf, node):
    def run(p, inp, kids, root, height, max_height):
        internal = kids.shape[0]
        tables = tuple(jnp.concatenate([jnp.zeros((internal, t.shape[1]), t.dtype), t]) for t in leaf(p, inp))

        def level(k, tables):
            new = node(p, *(t[kids] for t in tables))      # every internal node, from its children
            at = (height == k)[:, None]                     # ... kept only at height k
            return tuple(lax.dynamic_update_slice(t, jnp.where(at, n, t[:internal]), (0, 0))
                         for t, n in zip(tables, new))

        tables = lax.fori_loop(jnp.int32(1), max_height + 1, level, tables)
        return tables[0][root]
    return run


@functools.lru_cache(maxsize=None)
def _tree_program(name: str):
    """The jitted program of a tree model: (params, inp (B, N, H), kids (B, I, 2), root (B,))
    -> (B, H). jax.jit compiles it once per shape."""
    run = jax.vmap(_tree_instance(*_TREE_CELLS[name]), in_axes=(None, 0, 0, 0, 0, None))

    def batched(p, inp, kids, root):
        height = jax.vmap(_heights)(kids)
        return run(p, inp, kids, root, height, height.max())
    return jax.jit(batched)


def _aligned(shape: tuple, dtype) -> np.ndarray:
    """An uninitialised array on a 64-byte boundary, which jax.device_put on the CPU takes
    without copying (numpy's own large arrays sit 16 bytes off a page, and are copied)."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _padded(instances: list[tuple], column: int, size: int, fill, dtype) -> np.ndarray:
    """Column `column` of every instance, stacked and padded with `fill` to `size` rows: one
    copy per instance straight into the batch's array. (numpy, single-threaded: torch.cat of
    64 tensors enters torch's thread pool once per tensor, which costs a scheduler slice per
    tensor when the machine's other cores are busy.)"""
    first = instances[0][column]
    out = _aligned((len(instances), size) + tuple(first.shape[1:]), dtype)
    out.fill(fill)
    for i, args in enumerate(instances):
        x = args[column]
        out[i, :x.shape[0]] = x.detach().numpy()
    return out


def pad_trees(instances: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(inp (B, N, H) float32, kids (B, I, 2) int32, root (B,) int32): the instances' tables
    padded to N (nodes) and I (internal nodes) rows, both bucketed, in the layout of
    `_tree_instance`; array ops over all instances at once, no loop over nodes."""
    b = len(instances)
    n = bucket(max(a[0].shape[0] for a in instances))
    left = _padded(instances, 0, n, -1, np.int64)
    right = _padded(instances, 1, n, -1, np.int64)
    is_leaf = _padded(instances, 2, n, True, np.bool_)     # padding nodes are leaves nobody reaches
    inp = _padded(instances, 3, n, 0, np.float32)
    roots = np.array([a[4].item() for a in instances], np.int64)[:, None]

    inner = ~is_leaf
    rank = np.cumsum(inner, 1) - 1                         # an internal node's row
    m = bucket(int(inner.sum(1).max()))

    def row(child):                                        # a child's row of the results table
        child = np.maximum(child, 0)
        return np.where(np.take_along_axis(is_leaf, child, 1), child + m, np.take_along_axis(rank, child, 1))

    kids = np.full((b * m, 2), m, np.int32)                # padding rows read leaf row 0
    kids[(np.arange(b)[:, None] * m + rank)[inner]] = np.stack([row(left), row(right)], -1)[inner]
    return inp, kids.reshape(b, m, 2), row(roots).reshape(b).astype(np.int32)


# --------------------------------------------------------------------------- BiRNN, masked scan


def _gru(p, gi, h):
    """torch.nn.GRUCell, from the input's projection gi = x @ W_ih + b_ih."""
    gh = h @ p["w_hh"] + p["b_hh"]
    i_r, i_z, i_n = jnp.split(gi, 3, -1)
    h_r, h_z, h_n = jnp.split(gh, 3, -1)
    r = jax.nn.sigmoid(i_r + h_r)
    z = jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def _birnn_instance(p, xs, length, steps):
    """One sentence xs (L, H) of `length` words, padded: step t runs the forward cell at word t
    and the backward cell at word steps - 1 - t, each kept only where the word exists."""
    gi_f = xs @ p["fwd"]["w_ih"] + p["fwd"]["b_ih"]     # every position's input projection, up front
    gi_b = xs @ p["bwd"]["w_ih"] + p["bwd"]["b_ih"]

    def step(t, state):
        h_f, h_b = state
        back = steps - 1 - t
        h_f = jnp.where(t < length, _gru(p["fwd"], gi_f[t], h_f), h_f)
        h_b = jnp.where(back < length, _gru(p["bwd"], gi_b[back], h_b), h_b)
        return h_f, h_b

    h0 = jnp.zeros(xs.shape[1], xs.dtype)
    h_f, h_b = lax.fori_loop(jnp.int32(0), steps, step, (h0, h0))
    return jnp.concatenate([h_f, h_b]) @ p["w_cls"] + p["b_cls"]


@functools.lru_cache(maxsize=None)
def _birnn_program():
    return jax.jit(jax.vmap(_birnn_instance, in_axes=(None, 0, 0, None)))


def pad_sentences(instances: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(xs (B, L, H) float32, lengths (B,) int32, steps () int32, the longest length), L bucketed."""
    lengths = np.array([a[0].shape[0] for a in instances], np.int32)
    return _padded(instances, 0, bucket(int(lengths.max())), 0, np.float32), lengths, lengths.max()


# --------------------------------------------------------------------------- the peer


def jax_vmapped(name: str, model: nn.Module) -> Peer:
    """instances -> each instance's result (`model(*args)`), from one jitted, vmapped, masked
    JAX program per call (see the module docstring). The weights are copied now."""
    params = _params(name, model)
    program = _birnn_program() if name == "birnn" else _tree_program(name)
    pad = pad_sentences if name == "birnn" else pad_trees

    def call(instances: list[tuple]) -> list[torch.Tensor]:
        with torch.inference_mode():
            args = jax.device_put(pad(instances), _CPU)
            out = np.array(program(params, *args))   # a copy torch may own
            return list(torch.from_numpy(out))
    call.params = params
    return call
