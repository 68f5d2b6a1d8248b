"""Ops and modules that decoding, routing and attention code uses: gather, scatters, topk,
sort, cumsum, list indexing, Tensor.new, attention, and nn.LSTM/GRU/RNN as cell loops. Each
against eager on every backend, on inputs that take different values (and ties, duplicates)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cocktailer
from utils import assert_matches_eager, capture_text, count_ops, randn


def _index(seed, high, *shape):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def test_gather_on_every_dim():
    def f(x, i0, i1, i2):
        return torch.gather(x, 0, i0), x.gather(1, i1), torch.gather(x, -1, i2)
    sets = [(randn(3, 4, 5, seed=s), _index(s, 3, 2, 4, 5), _index(s + 1, 4, 3, 2, 5), _index(s + 2, 5, 3, 4, 7))
            for s in range(2)]
    assert_matches_eager(f, sets)


def _rows(i):
    return torch.cat([i, i[:, :2]], 1) % 4   # (4, 5) targets along dim 0, with duplicates


def test_scatters_and_index_add():
    def f(x, src, i, rows):
        a = torch.zeros(4, 5).scatter_add(1, i, src)
        b = x.clone().scatter_(1, i, src)                 # duplicate targets: the last write wins
        c = x.scatter(0, _rows(i), 2.5)
        d = x.index_add(0, rows, torch.ones(3, 5), alpha=0.5)
        return a, b, c, d
    sets = [(randn(4, 5, seed=s), randn(4, 3, seed=s + 9), _index(s, 5, 4, 3), _index(s, 4, 3)) for s in range(3)]
    assert_matches_eager(f, sets)


def test_topk_sort_argsort():
    def f(x, y):
        v, i = torch.topk(x, 3)
        w, j = x.topk(2, dim=0, largest=False)
        s, k = torch.sort(y, dim=1, descending=True)
        return v, i, w, j, s, k, torch.argsort(x, dim=1)
    assert_matches_eager(f, [(randn(2, 5, seed=s), randn(3, 6, seed=s + 1)) for s in range(2)])


def test_topk_and_sort_of_ties():
    """torch leaves the order of equal values to topk (and sorts them stably on the CPU): the
    values match, the indices point at them, and sort's order among equal values is stable."""
    def f(x):
        return torch.topk(x, 3), torch.sort(x, descending=True), torch.sort(x)
    ties = torch.tensor([[1.0, 3.0, 3.0, 0.0, 2.0], [5.0, 5.0, 5.0, 1.0, 0.0]])
    for backend in ("reference", "cpu"):
        (v, i), desc, asc = cocktailer.compile(f, (ties,), backend=backend)(ties)
        (ev, _), edesc, easc = f(ties)
        assert torch.equal(v, ev) and torch.equal(ties.gather(1, i), v)
        assert torch.equal(desc.indices, edesc.indices) and torch.equal(asc.indices, easc.indices)


def test_cumsum_of_floats_ints_and_bools():
    def f(x, i, m):
        return torch.cumsum(x, 1), x.cumsum(dim=0), i.cumsum(-1), m.cumsum(0)
    sets = [(randn(4, 6, seed=s), _index(s, 9, 4, 6), _index(s, 2, 5).bool()) for s in range(2)]
    assert_matches_eager(f, sets, rtol=1e-5, atol=1e-5)


def test_list_index_and_legacy_new():
    def f(x):
        last = x[:, [-1], :]               # a constant list index keeps the dim
        picked = x[[0, 2, 2]]
        base = x.new(2, 3)                 # uninitialized in torch: only its shape and dtype are used
        return last, picked, base.shape == (2, 3), x.new([1.0, 2.0]) + x.new_tensor([3.0, 4.0])
    assert_matches_eager(f, [(randn(3, 4, 5, seed=0),)])


def test_a_list_index_out_of_range_is_refused_at_the_line():
    def f(x):
        return x[:, [0, 7]]
    with pytest.raises(cocktailer.UnsupportedError, match=r"test_library_ops.py:\d+.*out of range"):
        cocktailer.compile(f, (torch.randn(3, 4),), backend="reference")


@pytest.mark.parametrize("causal", [False, True])
def test_scaled_dot_product_attention(causal):
    def f(q, k, v, mask):
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal), masked
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    sets = [(randn(2, 3, 5, 8, seed=s), randn(2, 3, 5, 8, seed=s + 1), randn(2, 3, 5, 8, seed=s + 2), mask)
            for s in range(2)]
    assert_matches_eager(f, sets)


@pytest.mark.parametrize("batch_first", [False, True])
def test_multihead_attention_module(batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first).eval()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = mha

        def forward(self, x, pad):
            out, weights = self.mha(x, x, x, key_padding_mask=pad)
            plain, none = self.mha(x, x, x, need_weights=False, attn_mask=torch.ones(4, 4).triu(1).bool())
            return out, weights, plain, none is None
    x = randn(2, 4, 8, seed=0) if batch_first else randn(4, 2, 8, seed=0)
    pad = torch.tensor([[False, False, False, True], [False, False, False, False]])
    assert_matches_eager(Block(), [(x, pad)])


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("layers, bidirectional, batch_first", [(1, False, False), (2, True, True)])
def test_recurrent_modules_match_eager(kind, layers, bidirectional, batch_first):
    torch.manual_seed(0)
    cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
    model = cls(5, 6, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first)
    shape = (2, 7, 5) if batch_first else (7, 2, 5)
    assert_matches_eager(model, [(randn(*shape, seed=s),) for s in range(2)])


def test_recurrent_module_with_state_and_unbatched_input():
    torch.manual_seed(0)
    model = nn.LSTM(5, 6)
    state = (randn(1, 6, seed=1), randn(1, 6, seed=2))
    assert_matches_eager(model, [(randn(7, 5, seed=0), state)])


def test_recurrent_module_is_one_loop_per_layer_and_direction():
    """The same loops as hand-written cells, not a time loop unrolled at capture."""
    text = capture_text(nn.LSTM(5, 6, num_layers=2, bidirectional=True).eval(), [torch.randn(9, 2, 5)])
    assert count_ops(text, "loop") == 4


def test_packed_sequences_are_refused_clearly():
    model = nn.GRU(5, 6).eval()
    packed = nn.utils.rnn.pack_padded_sequence(torch.randn(4, 2, 5), torch.tensor([4, 2]))
    with pytest.raises(cocktailer.UnsupportedError, match="PackedSequence"):
        cocktailer.compile(model, (packed,), backend="reference")


def test_named_tuples_are_results_and_other_objects_are_refused():
    from collections import namedtuple
    from dataclasses import dataclass
    Pair = namedtuple("Pair", "low high")

    def named(x):
        return Pair(x.min(), x.max()), torch.max(x, 0)   # torch's result tuples too

    assert_matches_eager(named, [(randn(3, 4, seed=0),)])
    out = cocktailer.compile(named, (torch.ones(2, 2),), backend="reference")(torch.ones(2, 2))
    assert isinstance(out[0], Pair) and isinstance(out[1], torch.return_types.max)

    @dataclass
    class Out:
        y: torch.Tensor

    def boxed(x):
        return Out(x + 1)
    with pytest.raises(cocktailer.UnsupportedError, match="returning a `Out` object"):
        cocktailer.compile(boxed, (torch.ones(2),), backend="reference")


def test_topk_and_sort_with_infinities_and_extreme_integers():
    """Data holding what a round masks taken positions with (-inf, the dtype's maximum): each
    position is taken once. (topk's order among ties is torch's choice: values and positions
    are compared, not the order of equal values.)"""
    def f(x, i):
        return torch.topk(x, 4), torch.sort(x, dim=1), torch.topk(i, 3, largest=False)
    x = torch.tensor([[0.5, float("-inf"), float("-inf"), 1.0, float("inf")], [float("-inf")] * 5])
    i = torch.tensor([[torch.iinfo(torch.int64).max] * 4 + [3]])
    for backend in ("reference", "cpu"):
        (v, vi), (s, si), (w, wi) = cocktailer.compile(f, (x, i), backend=backend)(x, i)
        (ev, _), (es, esi), (ew, _) = f(x, i)
        assert torch.equal(v, ev) and torch.equal(w, ew) and torch.equal(s, es) and torch.equal(si, esi)
        for values, positions, source in ((v, vi, x), (w, wi, i)):
            assert torch.equal(source.gather(1, positions), values)
            assert all(len(set(row.tolist())) == len(row) for row in positions)   # no position twice


def test_var_and_std_as_torch_computes_them():
    """Over all dims, some dims, with keepdim, unbiased or not, a correction, a normalization
    written with them, and a dim of one row (a count at the correction: nan, as torch)."""
    def f(x):
        normed = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
        return (x.var(), x.std(1), torch.var(x, 0, keepdim=True), torch.std(x, dim=(0, 1), correction=0),
                x.var(False), normed, x[:1].var(0), torch.var(x, dim=None, keepdim=True))
    import warnings
    with warnings.catch_warnings():   # torch warns of the one-row dim's degrees of freedom
        warnings.simplefilter("ignore", UserWarning)
        assert_matches_eager(f, [(randn(4, 7, seed=s, scale=3.0),) for s in range(2)])
    with pytest.raises(cocktailer.UnsupportedError, match="floating"):
        cocktailer.capture(lambda x: x.var(), (torch.arange(4),))
