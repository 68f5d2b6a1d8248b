"""Hand-batched PyTorch peers for the throughput benchmark's models (cocktailer.models.throughput):
what a skilled PyTorch user writes by hand to run a whole list of single-instance argument tuples
in one batched computation, giving each instance the result of `model(*args)`.

`throughput_hand_batched(name, model)` returns `call(instances) -> [result per instance]`. All
preprocessing (linearization, packing, sorting, padding) happens inside `call`, so a benchmark
that times `call` times it too. Every peer reads the model's own submodules and parameters at
call time (no copies that could drift from the model).

- treegru: the trees are linearized into global index arrays (`bench.batch_peers.linearize`:
  reachable nodes, heights by tensor ops); all leaves in one GEMM, then level by level (one
  batched step per height over every instance), one GEMM per Linear per level, children gathered
  from a results table by global node id.
- mvrnn: the same linearization, its tables laid out by reader (each level's left children, then
  its right children, level after level, the roots last), so a level reads its children as two
  contiguous slices instead of gathering h x h matrices; matrices are stored transposed, so the
  parents' W_M [A; B] of a whole level is two GEMMs, and the children's matrix-vector products
  two `bmm`s. Leaf matrices are copied into the table instance by instance (only the leaves').
  At the larger sizes each node's W_M [A; B] is already a sizeable GEMM for the eager model, and
  the level tables stream one h x h matrix per node through memory, so batching gains least here.
- birnn: `pack_sequence` (sorted by length inside) and one bidirectional `nn.GRU` whose weights
  ARE the model's two GRUCells' parameters (shared, not copied): the packed recurrence shrinks
  its batch as sentences end, and the reverse direction starts at each sentence's own last word,
  so h_n holds exactly the final states of the model's two loops. The GRU is built per call on
  the meta device (about 0.3 ms) and pointed at the cells' current parameters.
- stackrnn: sentences sorted by transition count (the active instances are a prefix that shrinks);
  all stack pointers, shifted-word rows and stack rows of every step are computed up front with
  cumsums over the padded transitions, all leaf vectors in one GEMM; each step then runs one
  GEMM for the instances that REDUCE (gathered from a flat stack table) and one tracker GRUCell
  over every active instance. Transitions are taken to be well formed (as `transitions_for` makes
  them: no REDUCE with fewer than two entries on the stack).
- nestedrnn: outer loop as a shrinking, length-sorted batch over packed words; per word, the
  inner RNN's input projection is computed once (for all words of all instances, one GEMM, before
  the loops) and the inner loop runs over the active instances sorted by their own trip count,
  so it shrinks too: one addmm + tanh per inner step.
- drnn: breadth-first over the frontier of every instance at once: one expansion-gate GEMM per
  depth, the expanding nodes' children in two GEMMs, then the subtree sums bottom-up level by
  level in the model's own order ((h + first) + second).
- berxit: tokens of all sentences packed into one (tokens, d) matrix for every position-wise
  Linear, LayerNorm and FFN (no padding waste), scattered into a padded (instances, heads, L, hd)
  batch only for attention, masked by each sentence's own length; after each layer the sentences
  whose exit head is confident leave the batch (and the padding shrinks to the longest left).

DRNN and Berxit decide data-dependently (expand a node / leave at this layer) by comparing a
probability with a threshold. Batched GEMMs round differently from the model's per-instance ones,
so a probability within `DECISION_MARGIN` of the threshold could decide the other way than eager
PyTorch: such (rare) instances are recomputed one by one with the model itself, so every
instance's result matches eager's exactly in its decisions.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.utils.rnn import pack_sequence, pad_sequence

from bench.batch_peers import linearize
from cocktailer.models.throughput import REDUCE, SHIFT

MODELS = ("treegru", "mvrnn", "birnn", "stackrnn", "nestedrnn", "drnn", "berxit")
# Largest gap between a batched and an eager decision probability that is still taken as a tie:
# batched vs per-instance rounding moves these probabilities by ~1e-7, so this is ample.
DECISION_MARGIN = 1e-5

Peer = Callable[[list], list]


def throughput_hand_batched(name: str, model: nn.Module) -> Peer:
    """instances (argument tuples of `model`) -> [model(*args) for each], computed batched."""
    run = _PEERS[name]

    def call(instances: list[tuple]) -> list:
        with torch.no_grad():
            return run(model, instances)
    return call


def _unsort(rows: torch.Tensor, order: torch.Tensor) -> list[torch.Tensor]:
    """Rows computed in `order` (row j is instance order[j]) as a list in instance order."""
    out = torch.empty_like(rows)
    out[order] = rows
    return list(out)


def _by_length(lengths: torch.Tensor) -> torch.Tensor:
    """The instances ordered longest first, so that the ones still running are always a prefix."""
    return torch.argsort(lengths, descending=True, stable=True)


# --------------------------------------------------------------------------- trees


def _children(table: torch.Tensor, left, right, idx) -> tuple[torch.Tensor, torch.Tensor]:
    return table.index_select(0, left.index_select(0, idx)), table.index_select(0, right.index_select(0, idx))


def _treegru(model, instances: list[tuple]) -> list[torch.Tensor]:
    left, right, _, inp, roots, leaves, levels = linearize(instances)
    h = torch.empty_like(inp)   # results by global node id (rows of unreached nodes unused)
    h.index_copy_(0, leaves, torch.tanh(model.leaf(inp.index_select(0, leaves))))
    for idx in levels:
        h_l, h_r = _children(h, left, right, idx)
        r_l, r_r, z = torch.sigmoid(model.gates(torch.cat([h_l, h_r], 1))).chunk(3, 1)
        h_new = torch.tanh(model.candidate(torch.cat([r_l * h_l, r_r * h_r], 1)))
        h.index_copy_(0, idx, z * (h_l + h_r) * 0.5 + (1 - z) * h_new)
    return list(h.index_select(0, roots))


def _mvrnn(model, instances: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    trees = [(l, r, leaf, v, root) for l, r, leaf, v, _, root in instances]   # linearize's layout
    left, right, _, vec, roots, leaves, levels = linearize(trees)
    slot, rows = _reader_slots(left, right, roots, levels)
    h = vec.shape[1]
    vectors = vec.new_empty(rows, h).index_copy_(0, slot[leaves], vec.index_select(0, leaves))
    matrices_t = _leaf_matrices_transposed(instances, leaves, slot, rows)
    w_first, w_second = model.compose_matrix[:, :h].t(), model.compose_matrix[:, h:].t()
    start = 0
    for idx in levels:
        n = idx.shape[0]
        a, b = vectors[start:start + n], vectors[start + n:start + 2 * n]
        At, Bt = matrices_t[start:start + n], matrices_t[start + n:start + 2 * n]
        Ba = torch.bmm(a.unsqueeze(1), Bt).squeeze(1)     # (B a)' = a' B'
        Ab = torch.bmm(b.unsqueeze(1), At).squeeze(1)
        parents = slot.index_select(0, idx)
        vectors.index_copy_(0, parents, torch.tanh(model.compose(torch.cat([Ba, Ab], 1))))
        # P' = (W_M [A; B])' = A' W_1' + B' W_2': two GEMMs over every parent of the level at once
        P_t = torch.mm(At.view(-1, h), w_first).addmm_(Bt.view(-1, h), w_second)
        matrices_t.index_copy_(0, parents, P_t.view(n, h, h))
        start += 2 * n
    count = len(instances)   # the roots' rows come last, in instance order
    return list(zip(vectors[start:start + count], matrices_t[start:start + count].mT.contiguous()))


def _reader_slots(left, right, roots, levels) -> tuple[torch.Tensor, int]:
    """A row for every reachable node (slot[global id]; -1 if unreached) and the row count, laid
    out by who reads it: level after level, that level's left children then its right children,
    and the roots last. A level then reads its children as two contiguous slices, no gathers."""
    readers = torch.cat([torch.cat([left[idx], right[idx]]) for idx in levels] + [roots])
    slot = torch.full(left.shape, -1, dtype=torch.int64)
    slot[readers] = torch.arange(readers.shape[0])
    return slot, readers.shape[0]


def _leaf_matrices_transposed(instances: list[tuple], leaves, slot, rows: int) -> torch.Tensor:
    """The (rows, h, h) table of transposed node matrices with the reachable leaves' filled in
    (parents are written level by level), copied instance by instance from the inputs: a
    concatenation of the inputs would copy every internal node's unused matrix as well, and at
    these sizes the table is what costs (one h x h matrix per node)."""
    sizes = torch.tensor([a[0].shape[0] for a in instances])
    ends = torch.cumsum(sizes, 0)
    per_instance = leaves.tensor_split(torch.searchsorted(leaves, ends[:-1]))   # leaves are sorted
    table = instances[0][4].new_empty(rows, *instances[0][4].shape[1:])
    for a, first, ids in zip(instances, (ends - sizes).tolist(), per_instance):
        table.index_copy_(0, slot.index_select(0, ids), a[4].index_select(0, ids - first).mT)
    return table


# --------------------------------------------------------------------------- sentences


_GRU_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


def _birnn(model, instances: list[tuple]) -> list[torch.Tensor]:
    gru = _shared_bidirectional_gru(model)   # per call (~0.3 ms), so it always has the cells' current weights
    _, h_n = gru(pack_sequence([a[0] for a in instances], enforce_sorted=False))   # h_n in instance order
    return list(model.classify(torch.cat([h_n[0], h_n[1]], 1)))


def _shared_bidirectional_gru(model) -> nn.GRU:
    """A bidirectional nn.GRU whose parameters are the model's forward and backward GRUCells'
    own tensors (GRUCell and GRU share the gate layout r, z, n). Built on the meta device, so
    no weights are allocated or initialised, then pointed at the cells' parameters."""
    hidden = model.hidden
    gru = nn.GRU(hidden, hidden, bidirectional=True, device="meta")
    for suffix, cell in (("", model.forward_cell), ("_reverse", model.backward_cell)):
        for kind in _GRU_PARAMETERS:
            setattr(gru, f"{kind}_l0{suffix}", getattr(cell, kind))
    return gru


def _stackrnn(model, instances: list[tuple]) -> list[torch.Tensor]:
    order = _by_length(torch.tensor([a[1].shape[0] for a in instances]))
    words = [instances[i][0] for i in order]
    plan = _StackPlan([instances[i][1] for i in order], [w.shape[0] for w in words])
    leaf_vectors = torch.tanh(model.leaf(torch.cat(words)))   # every SHIFT's push, one GEMM
    stack = leaf_vectors.new_zeros(plan.stack_rows, model.hidden)
    tracking = leaf_vectors.new_zeros(len(words), model.hidden)
    for active, shifts, shifted, reduces, reduced, writes in plan.steps:
        new_top = leaf_vectors.new_empty(active, model.hidden)
        new_top.index_copy_(0, shifts, leaf_vectors.index_select(0, shifted))
        if reduces.numel():
            left, right = stack.index_select(0, reduced), stack.index_select(0, reduced + 1)
            composed = model.compose(torch.cat([left, right, tracking.index_select(0, reduces)], 1))
            new_top.index_copy_(0, reduces, torch.tanh(composed))
        stack.index_copy_(0, writes, new_top)
        tracking[:active] = model.tracker(new_top, tracking[:active])   # reads the new top of the stack
    return _unsort(stack.index_select(0, plan.final_tops), order)


class _StackPlan:
    """Every step's index arrays for a batch of transition sequences sorted longest first, over
    a flat stack table with one block of rows per instance (as many rows as it has words).

    steps[t] = (active, shifts, shifted, reduces, reduced, writes): the first `active` instances
    still run; `shifts` / `reduces` are the positions among them that SHIFT / REDUCE; `shifted`
    the rows of the words they push (in the concatenated words); `reduced` the stack rows of the
    reducing instances' second-from-top entry (left operand, and where the result goes; the right
    operand is the row above); `writes` every active instance's new top row."""

    def __init__(self, transitions: list[torch.Tensor], word_counts: list[int]):
        counts = torch.tensor(word_counts)
        moves = pad_sequence(transitions, batch_first=True, padding_value=-1)   # (instances, steps)
        is_shift, is_reduce = moves == SHIFT, moves == REDUCE
        top = torch.cumsum(is_shift.long() - is_reduce.long(), 1)       # stack height after each step
        block = (torch.cumsum(counts, 0) - counts).unsqueeze(1)         # first row of each instance
        new_top_row = block + top - 1       # after a REDUCE: also where its left operand was
        word_row = block + torch.cumsum(is_shift.long(), 1) - 1
        self.stack_rows = int(counts.sum())
        lengths = torch.tensor([t.shape[0] for t in transitions])
        self.final_tops = new_top_row[torch.arange(len(transitions)), lengths - 1]
        active = (moves >= 0).sum(0).tolist()
        shifts, shifted = _per_step(is_shift, word_row)
        reduces, reduced = _per_step(is_reduce, new_top_row)
        writes = new_top_row.T.contiguous()
        self.steps = [(k, shifts[t], shifted[t], reduces[t], reduced[t], writes[t, :k])
                      for t, k in enumerate(active)]


def _per_step(where: torch.Tensor, values: torch.Tensor) -> tuple[tuple, tuple]:
    """For a (instances, steps) mask: per step, the instances where it holds and their `values`."""
    step, instance = where.T.nonzero().unbind(1)     # ordered by step, then instance
    sizes = torch.bincount(step, minlength=where.shape[1]).tolist()
    return instance.split(sizes), values.T[where.T].split(sizes)


def _nestedrnn(model, instances: list[tuple]) -> list[torch.Tensor]:
    order = _by_length(torch.tensor([a[0].shape[0] for a in instances]))
    words = pack_sequence([instances[i][0] for i in order])      # time-major, batch shrinking
    trips = pack_sequence([instances[i][1] for i in order]).data
    cell = model.inner
    # The inner cell's input term is the same on every inner step of a word: once, for all words.
    # (RNNCell computes tanh(x W_ih' + b_ih + g W_hh' + b_hh); this adds the same terms.)
    inner_input = F.linear(words.data, cell.weight_ih, cell.bias_ih) + cell.bias_hh
    h = words.data.new_zeros(len(instances), model.hidden)
    start = 0
    for active in words.batch_sizes.tolist():
        rows = slice(start, start + active)
        g = _inner_loop(cell.weight_hh, inner_input[rows], trips[rows], h[:active])
        h[:active] = model.outer(g, h[:active])
        start += active
    return _unsort(h, order)


def _inner_loop(weight_hh, inner_input, trips, g0) -> torch.Tensor:
    """g <- tanh(inner_input + g W_hh') for trips[i] steps on row i, over the rows sorted by trip
    count (most first), so each step runs on a shrinking prefix of them."""
    order = torch.argsort(trips, descending=True, stable=True)
    base, g = inner_input.index_select(0, order), g0.index_select(0, order)
    running = torch.bincount(trips, minlength=int(trips.max()) + 1).flip(0).cumsum(0).flip(0)[1:]
    for m in running.tolist():   # m: rows with more than s trips at inner step s
        g[:m] = torch.tanh(torch.addmm(base[:m], g[:m], weight_hh.t()))
    return torch.empty_like(g).index_copy_(0, order, g)


# --------------------------------------------------------------------------- data-dependent decisions


def _drnn(model, instances: list[tuple]) -> list[torch.Tensor]:
    roots = torch.stack([a[0] for a in instances])
    budget = torch.stack([a[1] for a in instances])
    owner = torch.arange(len(instances))
    depths = []   # per depth: (node states, positions of the nodes that expand)
    ties = []     # per depth: the instances of nodes whose gate is too close to the threshold to trust
    states = roots
    while states.shape[0]:
        may_expand = (budget > 0).nonzero().squeeze(1)
        gate = torch.sigmoid(model.expand(states.index_select(0, may_expand)))[:, 0]
        expands = may_expand[gate > model.threshold]
        ties.append(owner[may_expand[(gate - model.threshold).abs() < DECISION_MARGIN]])
        depths.append((states, expands))
        parents = states.index_select(0, expands)
        ancestral = model.ancestral(parents)
        first = torch.tanh(ancestral)
        second = torch.tanh(ancestral + model.fraternal(first))
        # The children of the j-th expanding node are rows 2j and 2j + 1 of the next depth.
        states = torch.stack([first, second], 1).flatten(0, 1)
        budget = budget.index_select(0, expands).repeat_interleave(2) - 1
        owner = owner.index_select(0, expands).repeat_interleave(2)
    totals = _subtree_sums(depths)
    return _recompute(model, instances, list(totals), torch.cat(ties))


def _subtree_sums(depths: list[tuple]) -> torch.Tensor:
    """Bottom-up, deepest level first: a node's total is its state, or (state + first child's
    total) + second child's total when it expanded (the model's summation order)."""
    below = None
    for states, expands in reversed(depths):
        totals = states.clone()
        if expands.numel():
            totals.index_copy_(0, expands, (states.index_select(0, expands) + below[0::2]) + below[1::2])
        below = totals
    return below


def _recompute(model, instances: list[tuple], results: list, ties: torch.Tensor) -> list:
    """The results, with the instances that met a (near-)tie on a decision recomputed by the model."""
    for i in torch.unique(ties).tolist():
        results[i] = model(*instances[i])
    return results


def _berxit(model, instances: list[tuple]) -> list[torch.Tensor]:
    x = torch.cat([a[0] for a in instances])        # every sentence's tokens, packed
    lengths = torch.tensor([a[0].shape[0] for a in instances])
    alive = torch.arange(len(instances))
    results: list = [None] * len(instances)
    ties = [torch.zeros(0, dtype=torch.int64)]   # sentences whose exit is too close to call
    last = len(model.layers) - 1
    for depth, (layer, exit_head) in enumerate(zip(model.layers, model.exits)):
        x = _encoder_layer(layer, x, lengths)
        firsts = torch.cumsum(lengths, 0) - lengths
        p = torch.softmax(exit_head(x.index_select(0, firsts)), -1)
        confidence = p.max(-1).values
        tie = (confidence - model.threshold).abs() < DECISION_MARGIN
        leave = (confidence > model.threshold) | tie | (depth == last)
        for i, p_i in zip(alive[leave].tolist(), p[leave]):
            results[i] = p_i
        if depth < last:   # at the last layer every sentence leaves, whatever its confidence
            ties.append(alive[tie])
        stay = ~leave
        x, lengths, alive = x[stay.repeat_interleave(lengths)], lengths[stay], alive[stay]
        if not alive.numel():
            break
    return _recompute(model, instances, results, torch.cat(ties))


def _encoder_layer(layer, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """`layer` (EncoderLayer) on packed tokens x (tokens, d) of sentences of `lengths`."""
    count, longest, d = lengths.shape[0], int(lengths.max()), x.shape[1]
    position = torch.arange(longest)
    valid = position < lengths.unsqueeze(1)                  # (sentences, longest): real tokens
    slots = valid.flatten().nonzero().squeeze(1)             # each packed token's padded slot

    def padded_heads(t):   # packed (tokens, d) -> (sentences, heads, longest, head_dim), zero padding
        out = t.new_zeros(count * longest, d).index_copy_(0, slots, t)
        return out.view(count, longest, layer.heads, layer.head_dim).transpose(1, 2)

    q, k, v = padded_heads(layer.query(x)), padded_heads(layer.key(x)), padded_heads(layer.value(x))
    scores = q @ k.transpose(2, 3) / math.sqrt(layer.head_dim)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))   # padding keys take no part
    y = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(count * longest, d).index_select(0, slots)
    x = layer.norm1(x + layer.out(y))
    return layer.norm2(x + layer.ff2(F.gelu(layer.ff1(x))))


_PEERS = {
    "treegru": _treegru,
    "mvrnn": _mvrnn,
    "birnn": _birnn,
    "stackrnn": _stackrnn,
    "nestedrnn": _nestedrnn,
    "drnn": _drnn,
    "berxit": _berxit,
}
