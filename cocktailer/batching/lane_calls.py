"""A masked block over instances of very different sizes, called once per instance at its own
size, the instances shared out among the workers by the native lane loop
(`codegen.level_loop`'s `ck_run_lanes`), each call on one worker.

A block that mixes an instance's rows (attention's products and softmax over a sentence's
tokens) runs over lanes padded to a common width, its padding masked; buckets of similar sizes
(`buckets.py`) cut the padding but still gather every input into padded rows, scatter the
outputs back, and run each op over the bucket's lanes with a barrier after it. Called for one
lane at a time, the block reads that lane's packed rows where they lie, computes at the lane's
own size (no padding, so its mask is all true) and writes its packed output rows: an
instance's products and softmax run in one worker's cache, with no barrier between them.

The block's entry is bound once per call at the largest lane (its arena then serves any smaller
lane, as a level program's serves fewer lanes); each lane's call runs with the lane count 1 and
the ragged size its own. Only where every output differs by lane and has that size first and
nowhere else (`buckets.bucketed_size`), every input that differs by lane has it first or not at
all, no other size differing by lane appears, and the entry may run on one worker while others
run it too (`backend.batched.may_call_by_lane`); with fewer than two lanes a worker, the block
runs over all lanes at once or in buckets as before.
"""
from __future__ import annotations

import torch

from cocktailer.backend.batched import may_call_by_lane, run_lanes
from cocktailer.batching.blocks import LANES, Block
from cocktailer.batching.buckets import bucketed_size
from cocktailer.batching.lanes import Packed, RowLayout, packed_rows, rows
from cocktailer.ir import Sym
from cocktailer.runtime.native import ERR_SIZES

LANES_PER_WORKER = 2   # fewer lanes than this a worker: one call over all of them shares the work better


def lane_call_size(block: Block, ragged) -> Sym | None:
    """The ragged size along which the block may be called one lane at a time (see the
    module's doc), if it may."""
    sym = bucketed_size(block, ragged)
    if sym is None or not all(block.varying_outputs) or block.compiled is None:
        return None
    others = set(ragged) - {sym}
    for v, lane in zip(block.inputs, block.varying_inputs):
        shape = v.type.shape
        rest = shape[1:] if lane and shape and shape[0] == sym else shape
        if sym in rest or others & set(rest):
            return None
    if any(others & set(v.type.shape) for v in block.outputs):
        return None
    if LANES not in {s for s, _, _ in block.compiled.entry.sizes}:
        return None
    return sym if may_call_by_lane(block.compiled) else None


def worth_it(count: int, workers: int) -> bool:
    return count >= LANES_PER_WORKER * workers


def run_by_lane(block: Block, env: dict, count: int, sym: Sym, layout: RowLayout, alloc, scratch) -> None:
    """Call the block once per lane at its own size (`backend.batched.run_lanes`); its outputs,
    packed under `layout`, into `env` (in memory from `alloc(shape, dtype)`; `scratch(key,
    numel, dtype)`: the workers' arenas, kept between calls)."""
    compiled = block.compiled
    lengths, offsets = layout.lengths.numpy(), layout.offsets.numpy()
    widest = int(lengths.argmax()) if count else 0
    n, at = int(lengths[widest]), int(offsets[widest])
    inputs, at_widest = [], []
    for v, lane in zip(block.inputs, block.varying_inputs):
        value = env[v.id]
        if not lane:
            t = value.contiguous()
            inputs.append((t, "shared"))
            at_widest.append(t)
        elif v.type.shape and v.type.shape[0] == sym:
            t = packed_rows(value, layout, count).contiguous()
            inputs.append((t, "packed"))
            at_widest.append(t[at:at + n].unsqueeze(0))
        else:
            t = rows(value, count).contiguous()
            inputs.append((t, "lane"))
            at_widest.append(t[widest:widest + 1])
    masks = [_everything(n, rank, dim) for _, rank, dim in block.masks]   # a lane at its own size: nothing to mask
    inputs += [(m, "shared") for m in masks]
    bound = compiled.bind(at_widest + masks)
    outputs = [alloc((layout.total, *y.shape[2:]), y.dtype) for y in bound.outputs]
    slots = {s: ERR_SIZES + k for k, (s, _, _) in enumerate(compiled.entry.sizes)}
    run_lanes(compiled, bound, slots[LANES], slots.get(sym, -1), inputs, outputs, offsets, lengths, scratch)
    for v, t in zip(block.outputs, outputs):
        env[v.id] = Packed(t, layout)


def _everything(width: int, rank: int, dim: int) -> torch.Tensor:
    """A mask input (`blocks.lane_mask`) of one lane at `width` with every position valid."""
    return torch.ones((1, *[width if d == dim else 1 for d in range(rank)]), dtype=torch.bool)
