"""A padded block over lanes of very different sizes, run as a few calls of lanes of similar
size, each padded only to its own longest (bucketing by length).

A block that mixes a lane's rows (attention's products and softmax over a sentence's tokens)
runs on lanes padded to the batch's longest, so its work grows with lanes x longest^2 while
the real work is the sum of each lane's size^2: for Berxit's 64 SST sentences of 4 to 44
tokens, 30% of it. The block is compiled with that size symbolic and masks past each lane's own
size, so it runs as well on any subset of lanes at any width of at least their longest: the
lanes sorted by size go to a few buckets, each called at its own width. Its inputs are padded
from the packed rows directly, and its outputs (each lane's rows of that size, `Packed`) are
written where those lanes' rows lie.

Only where every output the block gives per lane has that size first and nowhere else, and
the block masks along no other size; else it runs over all lanes at once (`blocks.run_block`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cocktailer.batching.blocks import Block, lane_mask
from cocktailer.batching.lanes import Packed, RowLayout, rows
from cocktailer.ir import Sym

MIN_LANES = 16       # fewer lanes than this: one call
MAX_BUCKETS = 4
CALL_COST = 0.04     # one more call, as a share of one call over all lanes at the full width


def bucketed_size(block: Block, ragged) -> Sym | None:
    """The ragged size a block may run bucketed along, if it may (see the module's doc)."""
    if block.packed is not None or not block.masks:
        return None
    syms = {sym for sym, _, _ in block.masks}
    if len(syms) != 1:
        return None
    (sym,) = syms
    if sym not in ragged:
        return None
    for v, lane in zip(block.outputs, block.varying_outputs):
        shape = v.type.shape
        if lane and (not shape or shape[0] != sym or sym in shape[1:]):
            return None
    return sym


@dataclass
class Buckets:
    """Lanes in buckets of similar size and where their rows lie padded: bucket b holds the
    lanes `lanes[b]` (sorted by size) at width `widths[b]`, as rows `starts[b]` .. of one
    buffer of `rows` padded rows (lane after lane, `widths[b]` rows each)."""
    lanes: list[torch.Tensor]
    sizes: list[torch.Tensor]   # the bucket's lanes' own sizes
    widths: list[int]
    starts: list[int]
    rows: int
    gather: torch.Tensor      # each padded row's packed row (a lane's last row past its size)
    scatter: torch.Tensor     # each packed row's padded row

    def __len__(self) -> int:
        return len(self.lanes)


def buckets(layout: RowLayout) -> Buckets | None:
    """The lanes in buckets of similar size, or None where one call over all lanes costs less:
    a call's work taken as lanes x width^2, one more call as CALL_COST of a call over all lanes
    at the full width. Worked out with numpy: a few dozen lanes' index arithmetic costs more in
    torch ops' overhead than in arithmetic (Berxit: 5 ms a batch of 64 in torch)."""
    count, width = layout.count, layout.width
    if count < MIN_LANES or layout.total == 0:
        return None
    lengths = layout.lengths.numpy()
    order = np.argsort(lengths, kind="stable")
    sizes = lengths[order]
    whole = count * width * width
    best, best_cost = None, whole
    for k in range(2, MAX_BUCKETS + 1):
        bounds = [count * i // k for i in range(k + 1)]
        cost = sum((hi - lo) * max(int(sizes[hi - 1]), 1) ** 2 for lo, hi in zip(bounds, bounds[1:]))
        cost += (k - 1) * CALL_COST * whole
        if cost < best_cost:
            best, best_cost = bounds, cost
    return None if best is None else _placed(layout, lengths, order, best)


def _placed(layout: RowLayout, lengths: np.ndarray, order: np.ndarray, bounds: list[int]) -> Buckets:
    """The buckets `order[lo:hi]` for consecutive bounds, with their rows' places."""
    offsets = layout.offsets.numpy()
    lanes, sizes, widths, starts, gathers = [], [], [], [], []
    first_row = np.empty(layout.count, dtype=np.int64)   # each lane's first padded row
    start = 0
    for lo, hi in zip(bounds, bounds[1:]):
        group = order[lo:hi]
        own = lengths[group]
        w = max(int(own.max()), 1)
        gathers.append(layout.pad_index_of(group, w))
        first_row[group] = start + np.arange(len(group)) * w
        lanes.append(torch.from_numpy(group))
        sizes.append(torch.from_numpy(own))
        widths.append(w)
        starts.append(start)
        start += len(group) * w
    gather = np.concatenate(gathers)
    scatter = np.repeat(first_row - offsets, lengths) + np.arange(layout.total)
    return Buckets(lanes, sizes, widths, starts, start, torch.from_numpy(gather), torch.from_numpy(scatter))


def run_bucketed(block: Block, env: dict, count: int, sym: Sym, layout: RowLayout, plan: Buckets, alloc) -> None:
    """Call the block once per bucket of lanes, each padded to its own longest; its per-lane
    outputs, packed under `layout`, into `env` (in memory from `alloc(shape, dtype)`).

    A packed input is gathered into every bucket's padded rows at once (one index_select), each
    bucket's outputs are written into one buffer of padded rows, and that is packed at once."""
    whole = [_padded_rows(env[v.id], v, sym, layout, plan, alloc) if lane else None
             for v, lane in zip(block.inputs, block.varying_inputs)]
    buffers: list = [None] * len(block.outputs)
    shared: list = [None] * len(block.outputs)
    for b, lanes in enumerate(plan.lanes):
        n, w, at = len(lanes), plan.widths[b], plan.starts[b]
        inputs = [env[v.id] if not lane else
                  rows_[at:at + n * w].view(n, w, *rows_.shape[1:]) if rows_ is not None else
                  _padded(env[v.id], v, sym, lanes, w, count)
                  for v, lane, rows_ in zip(block.inputs, block.varying_inputs, whole)]
        masks = [lane_mask(plan.sizes[b], w, rank, dim) for _, rank, dim in block.masks]
        outs = block.compiled(inputs + masks, _into_buffers(block, buffers, at, n * w, plan.rows, alloc))
        for k, (lane, t) in enumerate(zip(block.varying_outputs, outs)):
            if not lane:   # the same in every bucket
                shared[k] = t
            elif buffers[k] is None or t.data_ptr() != buffers[k][at].data_ptr():   # (memory of its own)
                if buffers[k] is None:
                    buffers[k] = alloc((plan.rows, *t.shape[2:]), t.dtype)
                buffers[k][at:at + n * w].view(t.shape).copy_(t)
    for k, (v, lane) in enumerate(zip(block.outputs, block.varying_outputs)):
        if lane:
            out = alloc((layout.total, *buffers[k].shape[1:]), buffers[k].dtype)
            env[v.id] = Packed(torch.index_select(buffers[k], 0, plan.scatter, out=out), layout)
        else:
            env[v.id] = shared[k]


def _into_buffers(block: Block, buffers: list, at: int, count: int, rows: int, alloc):
    """An allocator for one bucket's call: its lane-varying outputs (lanes, width, ...) go
    straight into their rows `at` .. `at + count` of one buffer of every bucket's padded rows
    (`buffers`, made at the first bucket), anything else where `alloc` puts it."""
    taken = 0

    def give(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        nonlocal taken
        k, taken = taken, taken + 1
        if k < len(buffers) and block.varying_outputs[k] and len(shape) >= 2 and shape[0] * shape[1] == count:
            if buffers[k] is None:
                buffers[k] = alloc((rows, *shape[2:]), dtype)
            if buffers[k].shape[1:] == tuple(shape[2:]) and buffers[k].dtype == dtype:
                return buffers[k][at:at + count].view(shape)
        return alloc(shape, dtype)
    return give


def _padded_rows(value, v, sym: Sym, layout: RowLayout, plan: Buckets, alloc) -> torch.Tensor | None:
    """Every bucket's padded rows of a packed lane value of `layout` whose first dim is `sym`
    (its only one), gathered at once; None for any other value (`_padded`, bucket by bucket)."""
    shape = v.type.shape
    if not (isinstance(value, Packed) and value.layout.same(layout) and shape and shape[0] == sym
            and sym not in shape[1:]):
        return None
    packed = value.packed
    return torch.index_select(packed, 0, plan.gather, out=alloc((plan.rows, *packed.shape[1:]), packed.dtype))


def _padded(value, v, sym: Sym, lanes: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """Lanes `lanes` of a lane value, its dims of size `sym` cut to `width`."""
    t = rows(value, count).index_select(0, lanes)
    for d, size in enumerate(v.type.shape):
        if size == sym:
            t = t.narrow(d + 1, 0, width)
    return t
