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


def buckets(layout: RowLayout) -> list[torch.Tensor] | None:
    """The lanes in buckets of similar size (each sorted by size), or None where one call over
    all lanes costs less: a call's work taken as lanes x width^2, one more call as CALL_COST of
    a call over all lanes at the full width."""
    count, width = layout.count, layout.width
    if count < MIN_LANES:
        return None
    order = torch.argsort(layout.lengths, stable=True)
    sizes = layout.lengths[order].tolist()
    whole = count * width * width
    best, best_cost = None, whole
    for k in range(2, MAX_BUCKETS + 1):
        bounds = [count * i // k for i in range(k + 1)]
        cost = sum((hi - lo) * max(sizes[hi - 1], 1) ** 2 for lo, hi in zip(bounds, bounds[1:]))
        cost += (k - 1) * CALL_COST * whole
        if cost < best_cost:
            best, best_cost = [order[lo:hi] for lo, hi in zip(bounds, bounds[1:])], cost
    return best


def run_bucketed(block: Block, env: dict, count: int, sym: Sym, layout: RowLayout, groups: list[torch.Tensor],
                 alloc) -> None:
    """Call the block once per bucket of lanes, each padded to its own longest; its per-lane
    outputs, packed under `layout`, into `env` (in memory from `alloc(shape, dtype)`)."""
    outputs = [None] * len(block.outputs)
    for lanes in groups:
        lengths = layout.lengths[lanes]
        width = max(int(lengths.max()), 1)
        inputs = [_padded(env[v.id], v, sym, lanes, width, layout, count) if lane else env[v.id]
                  for v, lane in zip(block.inputs, block.varying_inputs)]
        masks = [lane_mask(lengths, width, rank, dim) for _, rank, dim in block.masks]
        outs = block.compiled(inputs + masks, alloc)
        own = RowLayout(lengths, width)
        at = layout.lane_rows(lanes)
        for k, (lane, t) in enumerate(zip(block.varying_outputs, outs)):
            if not lane:   # the same in every bucket
                outputs[k] = t
                continue
            if outputs[k] is None:
                outputs[k] = alloc((layout.total, *t.shape[2:]), t.dtype)
            outputs[k].index_copy_(0, at, own.pack(t))
    for v, lane, t in zip(block.outputs, block.varying_outputs, outputs):
        env[v.id] = Packed(t, layout) if lane else t


def _padded(value, v, sym: Sym, lanes: torch.Tensor, width: int, layout: RowLayout, count: int) -> torch.Tensor:
    """Lanes `lanes` of a lane value, its dims of size `sym` cut to `width`. Rows of a packed
    value are gathered straight into that width (`RowLayout.pad_index_of`)."""
    shape = v.type.shape
    if isinstance(value, Packed) and value.layout.same(layout) and shape and shape[0] == sym and sym not in shape[1:]:
        index = layout.pad_index_of(lanes, width)
        return value.packed.index_select(0, index).view(len(lanes), width, *value.packed.shape[1:])
    t = rows(value, count).index_select(0, lanes)
    for d, size in enumerate(shape):
        if size == sym:
            t = t.narrow(d + 1, 0, width)
    return t
