"""Construct tests for the public API: every model is plain, idiomatic PyTorch; each test
compiles ONCE and calls the compiled object on several inputs whose VALUES take different
branches and trip counts, comparing with eager PyTorch. Recursion is in
test_constructs_recursion.py."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import cocktailer

try:
    from tests.utils import assert_matches_eager, assert_same, capture_text, count_ops, gen, randn
except ImportError:  # tests/ on sys.path instead of the repository root
    from utils import assert_matches_eager, assert_same, capture_text, count_ops, gen, randn

B, D, H = 2, 4, 8  # batch, input features, hidden size: small so the suite stays fast


def seeded(cls, *args, seed=0, **kwargs):
    """Build a module with parameters from a fixed seed, in eval mode."""
    torch.manual_seed(seed)
    return cls(*args, **kwargs).eval()


def i64(v: int) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.int64)


# =========================================================================== 1. range loops


class RNNFixedSteps(nn.Module):
    """`for i in range(n)` with n a Python int fixed at construction."""

    def __init__(self, steps: int):
        super().__init__()
        self.steps = steps
        self.lin = nn.Linear(D, H)
        self.rec = nn.Linear(H, H, bias=False)

    def forward(self, x, h):
        for i in range(self.steps):
            h = torch.tanh(self.lin(x[:, i]) + self.rec(h))
        return h


class RNNShapeSteps(nn.Module):
    """`for i in range(x.shape[1])`: trip count from a tensor shape."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, H)
        self.rec = nn.Linear(H, H, bias=False)

    def forward(self, x, h):
        for i in range(x.shape[1]):
            h = torch.tanh(self.lin(x[:, i]) + self.rec(h))
        return h


class RNNTensorSteps(nn.Module):
    """`for i in range(n)` with n a 0-d int64 tensor input: trip count is data."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, H)
        self.rec = nn.Linear(H, H, bias=False)

    def forward(self, x, h, n):
        for i in range(n):
            h = torch.tanh(self.lin(x[:, i]) + self.rec(h))
        return h


class LoopVarArithmetic(nn.Module):
    """The loop variable used as a value, plus two loop-carried values."""

    def forward(self, x, n):
        acc = torch.zeros_like(x[:, 0])
        total = torch.zeros((), dtype=torch.int64)
        for i in range(n):
            acc = acc + x[:, i] * (i + 1)
            total = total + i
        return acc, total


@pytest.mark.parametrize("steps", [0, 1, 5])
def test_range_python_int(steps):
    model = seeded(RNNFixedSteps, steps)
    inputs = [(randn(B, 6, D, seed=s), randn(B, H, seed=100 + s)) for s in range(3)]
    assert_matches_eager(model, inputs)


def test_range_python_int_is_a_loop_op():
    model = seeded(RNNFixedSteps, 5)
    text = capture_text(model, (randn(B, 6, D, seed=0), randn(B, H, seed=1)))
    assert "loop" in text and count_ops(text, "loop") >= 1, text
    # Not unrolled: the same program size for 3 and 9 steps.
    short = capture_text(seeded(RNNFixedSteps, 3), (randn(B, 9, D, seed=0), randn(B, H, seed=1)))
    long = capture_text(seeded(RNNFixedSteps, 9), (randn(B, 9, D, seed=0), randn(B, H, seed=1)))
    assert len(short.splitlines()) == len(long.splitlines()), f"{short}\n-----\n{long}"


@pytest.mark.parametrize("steps", [0, 1, 7])
def test_range_tensor_shape(steps):
    model = seeded(RNNShapeSteps)
    inputs = [(randn(B, steps, D, seed=s), randn(B, H, seed=100 + s)) for s in range(3)]
    assert_matches_eager(model, inputs)


def test_range_tensor_shape_is_a_loop_op():
    model = seeded(RNNShapeSteps)
    short = capture_text(model, (randn(B, 3, D, seed=0), randn(B, H, seed=1)))
    long = capture_text(model, (randn(B, 9, D, seed=0), randn(B, H, seed=1)))
    assert count_ops(short, "loop") >= 1 and count_ops(long, "loop") >= 1, long
    assert len(short.splitlines()) == len(long.splitlines()), f"{short}\n-----\n{long}"


def test_range_tensor_trip_count():
    """One compiled object; the trip count is a tensor VALUE: 0, 1, 7 (and the example, 3)."""
    model = seeded(RNNTensorSteps)
    T = 8
    inputs = [(randn(B, T, D, seed=s), randn(B, H, seed=100 + s), i64(n)) for s, n in enumerate([3, 0, 1, 7, 0, 7])]
    assert_matches_eager(model, inputs)


def test_range_tensor_trip_count_is_a_loop_op():
    model = seeded(RNNTensorSteps)
    text = capture_text(model, (randn(B, 8, D, seed=0), randn(B, H, seed=1), i64(3)))
    assert "loop" in text and count_ops(text, "loop") >= 1, text


def test_range_loop_variable_as_value():
    inputs = [(randn(B, 9, D, seed=s), i64(n)) for s, n in enumerate([4, 0, 1, 9])]
    assert_matches_eager(LoopVarArithmetic(), inputs)


# =========================================================================== 2. lists, ModuleList


class ModuleListMLP(nn.Module):
    """`for layer in self.layers`."""

    def __init__(self, depth=3):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in range(depth)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
        return x


class PythonListScales(nn.Module):
    """Loops over a plain Python list of floats and zip over a ModuleList."""

    def __init__(self):
        super().__init__()
        self.scales = [0.5, 2.0, -1.0]
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in self.scales])

    def forward(self, x):
        outs = []
        for scale, layer in zip(self.scales, self.layers):
            x = torch.tanh(layer(x) * scale)
            outs.append(x)
        return torch.stack(outs, 0).sum(0), outs[-1]


class EnumerateModuleList(nn.Module):
    """enumerate over a ModuleList with a Python-value branch on the index."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in range(4)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            if i % 2 == 0:
                x = torch.relu(layer(x))
            else:
                x = torch.sigmoid(layer(x)) * x
        return x


class RangeIndexesModuleList(nn.Module):
    """`for i in range(len(self.layers))` with `self.layers[i](x)` in the body."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(H, H) for _ in range(3)])

    def forward(self, x):
        for i in range(len(self.layers)):
            x = torch.tanh(self.layers[i](x)) + 0.1 * i
        return x


def _hidden_inputs(n=3):
    return [(randn(B, H, seed=s),) for s in range(n)]


def test_modulelist_loop():
    assert_matches_eager(seeded(ModuleListMLP), _hidden_inputs())


def test_python_list_and_zip_loop():
    assert_matches_eager(seeded(PythonListScales), _hidden_inputs())


def test_enumerate_modulelist_python_branch():
    assert_matches_eager(seeded(EnumerateModuleList), _hidden_inputs())


def test_range_indexes_modulelist():
    assert_matches_eager(seeded(RangeIndexesModuleList), _hidden_inputs())


# =========================================================================== 3. while / break / continue


class GrowUntilNorm(nn.Module):
    """`while x.norm() < 10` with two loop-carried values."""

    def forward(self, x):
        steps = torch.zeros((), dtype=torch.int64)
        while x.norm() < 10:
            x = x * 1.5
            steps = steps + 1
        return x, steps


class WhileCounterAndTensorCond(nn.Module):
    """A Python-int counter and a tensor condition combined with `and`."""

    def __init__(self, max_steps=6):
        super().__init__()
        self.max_steps = max_steps
        self.lin = nn.Linear(H, H)

    def forward(self, x, limit):
        i = 0
        while i < self.max_steps and x.abs().sum() < limit:
            x = x + torch.tanh(self.lin(x)) + 0.5
            i += 1
        return x


class ForWithBreak(nn.Module):
    """`for` loop that breaks when `x.sum() > t`."""

    def __init__(self, max_steps=8):
        super().__init__()
        self.max_steps = max_steps
        self.lin = nn.Linear(H, H)

    def forward(self, x, t):
        count = torch.zeros((), dtype=torch.int64)
        for _ in range(self.max_steps):
            x = x + torch.sigmoid(self.lin(x))
            count = count + 1
            if x.sum() > t:
                break
        return x, count


class WhileTrueBreak(nn.Module):
    """`while True:` with a tensor-conditioned break."""

    def forward(self, x, t):
        steps = torch.zeros((), dtype=torch.int64)
        while True:
            if x.abs().max() > t:
                break
            x = x * 2.0
            steps += 1
        return x, steps


class ForWithContinue(nn.Module):
    """`continue` skips time steps whose input sums to a negative value."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, H)

    def forward(self, x):
        acc = torch.zeros(x.shape[0], H)
        used = torch.zeros((), dtype=torch.int64)
        for i in range(x.shape[1]):
            xi = x[:, i]
            if xi.sum() < 0:
                continue
            acc = acc + torch.tanh(self.lin(xi))
            used = used + 1
        return acc, used


class WhileWithContinueAndBreak(nn.Module):
    def forward(self, x, n):
        i = torch.zeros((), dtype=torch.int64)
        acc = torch.zeros_like(x[0])
        while i < n:
            row = x[i]
            i = i + 1
            if row.mean() < 0:
                continue
            acc = acc + row
            if acc.sum() > 3.0:
                break
        return acc, i


@pytest.mark.parametrize("scale,iters", [(20.0, 0), (7.0, 1), (1e-2, "many")])
def test_while_tensor_condition(scale, iters):
    model = GrowUntilNorm()
    x = randn(3, 4, seed=1)
    x = x / x.norm() * scale
    with torch.no_grad():
        _, steps = model(x.clone())
    if iters == "many":
        assert steps.item() > 5
    else:
        assert steps.item() == iters
    # Compiled once on this input, then on inputs that take 0, 1 and many iterations.
    others = [(x,), (randn(3, 4, seed=2) * 100,), (randn(3, 4, seed=3) / randn(3, 4, seed=3).norm() * 8,),
              (randn(3, 4, seed=4) * 1e-3,)]
    assert_matches_eager(model, others)


def test_while_counter_and_tensor_condition():
    model = seeded(WhileCounterAndTensorCond)
    x = randn(B, H, seed=0)
    # limit below |x|.sum(): 0 iterations; huge limit: stops at max_steps.
    inputs = [(x, torch.tensor(20.0)), (x, torch.tensor(0.0)), (x, torch.tensor(1e6)), (randn(B, H, seed=1), torch.tensor(30.0))]
    assert_matches_eager(model, inputs)


def test_for_with_break():
    model = seeded(ForWithBreak)
    x = randn(B, H, seed=0)
    counts = []
    inputs = [(x, torch.tensor(t)) for t in [5.0, -1e9, 1e9, 20.0, 40.0]]
    with torch.no_grad():
        for xx, t in inputs:
            counts.append(model(xx.clone(), t)[1].item())
    assert 1 in counts and 8 in counts and len(set(counts)) >= 3, counts
    assert_matches_eager(model, inputs)


def test_while_true_break():
    x = randn(3, seed=0)
    inputs = [(x, torch.tensor(4.0)), (x, torch.tensor(0.0)), (x, torch.tensor(100.0)), (randn(3, seed=1), torch.tensor(1e3))]
    assert_matches_eager(WhileTrueBreak(), inputs)


def test_for_with_continue():
    model = seeded(ForWithContinue)
    inputs = [(randn(B, 6, D, seed=s),) for s in range(4)]
    inputs.append((-randn(B, 6, D, seed=0).abs(),))  # every step skipped
    inputs.append((randn(B, 6, D, seed=0).abs(),))  # no step skipped
    assert_matches_eager(model, inputs)


def test_while_with_continue_and_break():
    x = randn(10, 3, seed=0)
    inputs = [(x, i64(10)), (x, i64(0)), (x, i64(1)), (x.abs(), i64(10)), (-x.abs(), i64(10))]
    assert_matches_eager(WhileWithContinueAndBreak(), inputs)


# =========================================================================== 4. if / elif / else


class MaskElif(nn.Module):
    """`if torch.sum(mask) > k / elif / else`."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x, mask):
        if torch.sum(mask) > 2:
            out = self.a(x)
        elif torch.sum(mask) > 0:
            out = self.b(x) * 2
        else:
            out = x * 0.5
        return out


class ItemCondition(nn.Module):
    """`if gate.item() > 0.5` on a Python float taken from a tensor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x, gate):
        if gate.item() > 0.5:
            return torch.relu(self.lin(x)), gate * 2
        else:
            return self.lin(x) - 1.0, gate


class IsLeafInLoop(nn.Module):
    """`if is_leaf[i]` inside a loop over nodes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x, is_leaf):
        h = torch.zeros(H)
        for i in range(x.shape[0]):
            if is_leaf[i]:
                h = h + self.lin(x[i])
            else:
                h = torch.tanh(h)
        return h


class BoolOps(nn.Module):
    """`and` / `or` / `not` over tensor conditions (with short-circuit)."""

    def forward(self, x, y, flag):
        if (x.sum() > 0 and y.sum() > 0) or not flag:
            z = x + y
        else:
            z = x - y
        if not (x.mean() > y.mean()) and flag:
            z = z * 3
        return z


class EarlyReturn(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        h = self.lin(x)
        if h.sum() > 0:
            return torch.relu(h)
        h = h * 2
        return torch.sigmoid(h)


class EarlyReturnInLoop(nn.Module):
    """`return` from inside a loop body when a threshold is crossed."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x, thresh):
        h = x
        for _ in range(6):
            h = h + torch.tanh(self.lin(h))
            if h.norm() > thresh:
                return h * -1.0
        return h


class PythonFlag(nn.Module):
    """`if` on constructor values: must be resolved at capture time."""

    def __init__(self, residual: bool, act: str):
        super().__init__()
        self.residual = residual
        self.act = act
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        y = self.lin(x)
        if self.act == "relu":
            y = torch.relu(y)
        elif self.act == "tanh":
            y = torch.tanh(y)
        else:
            y = y * 0.5
        if self.residual:
            y = y + x
        if not self.residual and self.act != "relu":
            y = -y
        return y


class OneSidedAssign(nn.Module):
    """Variables written in only one branch (the other keeps the earlier value)."""

    def forward(self, x):
        scale = torch.ones(1)
        bias = x.mean()
        if x.abs().max() > 1.0:
            scale = x.abs().max().reshape(1)
        if x.sum() < 0:
            bias = bias * 10
        return x / scale + bias, scale


class Ternary(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(H, H)
        self.b = nn.Linear(H, H)

    def forward(self, x):
        y = self.a(x) if x.mean() > 0 else self.b(x)
        k = torch.ones(()) if y.sum() > 0 else torch.zeros(())
        return y, k


class NestedIf(nn.Module):
    def forward(self, x, y):
        if x.sum() > 0:
            if y.sum() > 0:
                out = x * y
            else:
                out = x - y
        else:
            out = torch.where(x > y, x, y)
            if out.max() > 1.0:
                out = out / out.max()
        return out


class TensorIfCaptured(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        if x.sum() > 0:
            x = self.lin(x)
        return x


def test_if_elif_else_mask():
    model = seeded(MaskElif)
    x = randn(B, H, seed=0)
    masks = [torch.tensor([True, True, True, False]), torch.tensor([False, True, False, False]),
             torch.zeros(4, dtype=torch.bool), torch.ones(4, dtype=torch.bool), torch.tensor([True, False, True, False])]
    assert_matches_eager(model, [(x, m) for m in masks])


def test_if_item_condition():
    model = seeded(ItemCondition)
    inputs = [(randn(B, H, seed=s), torch.tensor([g])) for s, g in enumerate([0.7, 0.2, 0.5, 0.9, -3.0])]
    assert_matches_eager(model, inputs)


def test_if_is_leaf_index_in_loop():
    model = seeded(IsLeafInLoop)
    x = randn(5, H, seed=0)
    leaves = [[True, False, True, True, False], [False] * 5, [True] * 5, [False, False, False, False, True]]
    assert_matches_eager(model, [(x, torch.tensor(v)) for v in leaves])


@pytest.mark.parametrize("signs", [(1, 1, True), (1, -1, True), (-1, 1, False), (-1, -1, True), (1, 1, False), (1, -1, False)])
def test_if_and_or_not(signs):
    sx, sy, flag = signs
    x = randn(3, seed=0).abs() * sx
    y = randn(3, seed=1).abs() * sy
    inputs = [(x, y, torch.tensor(flag))]
    # The same compiled object must handle every other combination as well.
    for ox, oy, of in [(1, 1, True), (-1, 1, True), (1, -1, False), (-1, -1, False)]:
        inputs.append((randn(3, seed=2).abs() * ox, randn(3, seed=3).abs() * oy, torch.tensor(of)))
    assert_matches_eager(BoolOps(), inputs)


def test_early_return_in_branch():
    model = seeded(EarlyReturn)
    inputs = [(randn(B, H, seed=s) * 3,) for s in range(6)]
    with torch.no_grad():
        taken = {bool(model.lin(x).sum() > 0) for (x,) in inputs}
    assert taken == {True, False}
    assert_matches_eager(model, inputs)


def test_early_return_in_loop():
    model = seeded(EarlyReturnInLoop)
    x = randn(B, H, seed=0)
    inputs = [(x, torch.tensor(t)) for t in [4.0, 0.0, 1e9, 6.0]]
    assert_matches_eager(model, inputs)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("act", ["relu", "tanh", "none"])
def test_if_on_python_flag_resolved_at_capture(residual, act):
    model = seeded(PythonFlag, residual, act)
    inputs = _hidden_inputs()
    assert_matches_eager(model, inputs)
    text = capture_text(model, inputs[0])
    assert count_ops(text, "if") == 0, text


def test_if_on_tensor_is_an_if_op():
    """Control for the test above: a tensor condition is kept as an `if` op."""
    model = seeded(TensorIfCaptured)
    text = capture_text(model, (randn(B, H, seed=0),))
    assert count_ops(text, "if") >= 1, text
    assert_matches_eager(model, [(randn(B, H, seed=0),), (-randn(B, H, seed=0).abs(),), (randn(B, H, seed=0).abs(),)])


def test_variable_written_in_one_branch():
    inputs = [(randn(B, H, seed=0) * 0.1,), (randn(B, H, seed=1) * 5,), (randn(B, H, seed=2).abs() * 0.2,),
              (-randn(B, H, seed=3).abs() * 3,)]
    assert_matches_eager(OneSidedAssign(), inputs)


def test_ternary_on_tensor_condition():
    model = seeded(Ternary)
    inputs = [(randn(B, H, seed=0),), (randn(B, H, seed=1).abs(),), (-randn(B, H, seed=2).abs(),), (randn(B, H, seed=3) * 4,)]
    assert_matches_eager(model, inputs)


def test_nested_if():
    a, b = randn(4, seed=0).abs(), randn(4, seed=1).abs()
    inputs = [(a, b), (a, -b), (-a, b), (-a * 0.1, -b * 0.1), (-a * 0.1, b * 5)]
    assert_matches_eager(NestedIf(), inputs)


# =========================================================================== 5. seq2seq decode


class GreedyDecoder(nn.Module):
    """`while` until every sequence emitted EOS or max length; tokens written with
    `out[:, t] = tok` into a preallocated tensor."""

    def __init__(self, vocab=6, hidden=H, max_len=8, sos=1, eos=0):
        super().__init__()
        self.vocab, self.max_len, self.sos, self.eos = vocab, max_len, sos, eos
        self.emb = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, h):
        batch = h.shape[0]
        out = torch.full((batch, self.max_len), -1, dtype=torch.long)
        tok = torch.full((batch,), self.sos, dtype=torch.long)
        t = 0
        while t < self.max_len:
            h = self.cell(self.emb(tok), h)
            tok = self.proj(h).argmax(-1)
            out[:, t] = tok
            t += 1
            if (tok == self.eos).all():
                break
        return out, h


class GreedyDecoderItem(nn.Module):
    """Batch-1 decode whose loop condition reads `tok.item()`."""

    def __init__(self, vocab=6, hidden=H, max_len=8, sos=1, eos=0):
        super().__init__()
        self.max_len, self.sos, self.eos = max_len, sos, eos
        self.emb = nn.Embedding(vocab, hidden)
        self.cell = nn.LSTMCell(hidden, hidden)
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, h, c):
        out = torch.zeros(1, self.max_len, dtype=torch.long)
        tok = torch.tensor([self.sos])
        t = 0
        while t < self.max_len and tok.item() != self.eos:
            h, c = self.cell(self.emb(tok), (h, c))
            tok = self.proj(h).argmax(-1)
            out[:, t] = tok
            t = t + 1
        return out, torch.tensor(t)


def _decode_inputs(model, make, n):
    """Inputs whose eager decodes have different lengths (checked, so the test means
    something): at least one of length 1, one of max length, and one in between."""
    found = {}
    with torch.no_grad():
        for s in range(400):
            inputs = make(s)
            found.setdefault(_decoded_length(model, inputs), inputs)
            middle = [k for k in found if k not in (1, model.max_len)]
            if 1 in found and model.max_len in found and len(middle) >= n - 2:
                break
    lengths = sorted(found)
    assert 1 in lengths and model.max_len in lengths and len(lengths) >= 3, lengths
    picks = [found[1], found[model.max_len]] + [found[k] for k in lengths if k not in (1, model.max_len)][: n - 2]
    return picks


def _decoded_length(model, inputs):
    out = model(*[t.clone() for t in inputs])
    if isinstance(model, GreedyDecoder):
        return int((out[0] != -1).sum(1).max())  # trip count: tokens written in the longest row
    return int(out[1])


def test_seq2seq_greedy_decode_batch():
    model = seeded(GreedyDecoder, seed=3)
    with torch.no_grad():
        model.proj.bias[model.eos] += 1.0  # make EOS likely enough to end some decodes early
    inputs = _decode_inputs(model, lambda s: (randn(B, H, seed=s, scale=3.0),), 4)
    assert_matches_eager(model, inputs)


def test_seq2seq_greedy_decode_item():
    model = seeded(GreedyDecoderItem, seed=5)
    with torch.no_grad():
        model.proj.bias[model.eos] += 1.0
    inputs = _decode_inputs(model, lambda s: (randn(1, H, seed=s, scale=3.0), randn(1, H, seed=1000 + s, scale=3.0)), 4)
    assert_matches_eager(model, inputs)


# =========================================================================== 6. KV cache


class KVCacheAttention(nn.Module):
    """Causal self-attention decoded step by step, with `k[:, :, i, :] = ...` writes into a
    preallocated cache and `out[:, i] = ...` into a preallocated output."""

    def __init__(self, d=H, heads=2, bound="shape"):
        super().__init__()
        self.heads, self.bound = heads, bound
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)

    def forward(self, x, n):
        batch, T, d = x.shape
        nh, dh = self.heads, d // self.heads
        k = torch.zeros(batch, nh, T, dh)
        v = torch.zeros(batch, nh, T, dh)
        out = torch.zeros(batch, T, d)
        pos = torch.arange(T)
        steps = x.shape[1] if self.bound == "shape" else n
        for i in range(steps):
            xi = x[:, i]
            q = self.q(xi).view(batch, nh, 1, dh)
            k[:, :, i, :] = self.k(xi).view(batch, nh, dh)
            v[:, :, i, :] = self.v(xi).view(batch, nh, dh)
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dh)
            scores = scores.masked_fill(pos > i, float("-inf"))
            att = torch.softmax(scores, dim=-1)
            o = torch.matmul(att, v).reshape(batch, d)
            out[:, i] = self.o(o)
        return out, k, v


class KVCacheGrowingSlice(nn.Module):
    """Attention over the growing prefix `k[:, :, : i + 1]` of the cache."""

    def __init__(self, d=H, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x):
        batch, T, d = x.shape
        nh, dh = self.heads, d // self.heads
        k = x.new_zeros(batch, nh, T, dh)
        v = x.new_zeros(batch, nh, T, dh)
        out = x.new_zeros(batch, T, d)
        for i in range(T):
            q, ki, vi = self.qkv(x[:, i]).view(batch, 3, nh, dh).unbind(1)
            k[:, :, i, :] = ki
            v[:, :, i, :] = vi
            att = torch.softmax(q.unsqueeze(2) @ k[:, :, : i + 1].transpose(-1, -2) / math.sqrt(dh), dim=-1)
            out[:, i] = (att @ v[:, :, : i + 1]).reshape(batch, d)
        return out


class KVCacheAtOffset(nn.Module):
    """Writes into a cache passed in, at positions `start + i` (start is a tensor)."""

    def __init__(self, d=H):
        super().__init__()
        self.k = nn.Linear(d, d)

    def forward(self, x, cache, start):
        for i in range(x.shape[1]):
            cache[:, start + i, :] = self.k(x[:, i])
        return cache, cache.sum(1)


@pytest.mark.parametrize("bound", ["shape", "tensor"])
def test_kv_cache_inplace_write(bound):
    model = seeded(KVCacheAttention, bound=bound)
    T = 5
    ns = [5, 5, 5] if bound == "shape" else [3, 0, 1, 5]
    inputs = [(randn(B, T, H, seed=s), i64(n)) for s, n in enumerate(ns)]
    assert_matches_eager(model, inputs)


def test_kv_cache_growing_slice():
    model = seeded(KVCacheGrowingSlice)
    assert_matches_eager(model, [(randn(B, 5, H, seed=s),) for s in range(3)])


def test_kv_cache_write_at_tensor_offset():
    model = seeded(KVCacheAtOffset)
    inputs = [(randn(B, 3, H, seed=s), randn(B, 10, H, seed=50 + s), i64(st)) for s, st in enumerate([2, 0, 7, 4])]
    assert_matches_eager(model, inputs)


# =========================================================================== 8. module calls


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=1, padding=0, bias=False)
        self.avg = nn.AvgPool2d(2, stride=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(6, 5)
        with torch.no_grad():  # non-trivial eval statistics
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        x = self.pool(self.relu(self.bn(self.conv1(x))))
        x = self.avg(torch.relu(self.conv2(x)))
        x = self.gap(x).flatten(1)
        return self.fc(x)


class SequentialMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.Tanh(),
                                 nn.Sequential(nn.Linear(H, 3), nn.Sigmoid()))

    def forward(self, x):
        return self.net(x)


class EmbedLSTM(nn.Module):
    def __init__(self, vocab=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, D)
        self.cell = nn.LSTMCell(D, H)
        self.head = nn.Linear(H, vocab)

    def forward(self, tokens):
        h = torch.zeros(tokens.shape[0], H)
        c = torch.zeros(tokens.shape[0], H)
        for t in range(tokens.shape[1]):
            h, c = self.cell(self.emb(tokens[:, t]), (h, c))
        logits = self.head(h)
        return logits.softmax(-1), logits.argmax(-1), (h, c)


class EmbedGRU(nn.Module):
    def __init__(self, vocab=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, D)
        self.cell = nn.GRUCell(D, H)

    def forward(self, tokens, h):
        e = self.emb(tokens)  # (B, T, D)
        for t in range(e.shape[1]):
            h = self.cell(e[:, t], h)
        return h


def test_cnn_modules():
    model = seeded(SmallCNN)
    assert_matches_eager(model, [(randn(2, 3, 8, 8, seed=s),) for s in range(3)])


def test_sequential():
    assert_matches_eager(seeded(SequentialMLP), [(randn(B, D, seed=s),) for s in range(3)])


def test_embedding_lstmcell():
    model = seeded(EmbedLSTM)
    inputs = [(torch.randint(0, 10, (B, 5), generator=gen(s)),) for s in range(3)]
    assert_matches_eager(model, inputs)


def test_embedding_grucell():
    model = seeded(EmbedGRU)
    inputs = [(torch.randint(0, 10, (B, 4), generator=gen(s)), randn(B, H, seed=9 + s)) for s in range(3)]
    assert_matches_eager(model, inputs)


# ---------------------------------------------------------------- tensor functions (plain functions)


def f_matmul(a, b):
    return a @ b.transpose(0, 1), torch.matmul(a, b.t()), torch.matmul(a[0], b.t())


def f_softmax(x):
    return torch.softmax(x, -1), F.softmax(x, dim=0), x.log_softmax(1)


def f_argmax(x):
    return x.argmax(-1), torch.argmax(x, dim=0, keepdim=True), x.argmax()


def f_max(x):
    values, indices = x.max(dim=1)
    m = torch.max(x, 0, keepdim=True)
    return values, indices, m.values, m.indices, x.max(), torch.maximum(x, -x)


def f_reduce(x):
    return x.sum(), x.sum(0), torch.sum(x, dim=(0, 1), keepdim=True), x.mean(-1), torch.mean(x, 0, keepdim=True), x.sum(1, dtype=torch.float64)


def f_cat_stack(x, y):
    return torch.cat([x, y], 0), torch.cat((x, y * 2), dim=-1), torch.stack([x, y]), torch.stack((x, y), dim=-1)


def f_split_chunk(x):
    a, b = x.split(3, dim=1)
    c, d, e = x.chunk(3, dim=-1)
    f, g = torch.split(x, [2, 4], dim=1)
    return a * 2 + b, c - d + e, f.sum(1), g


def f_views(x):  # x: (2, 3, 4)
    return (x.view(6, 4), x.reshape(2, -1), x.transpose(0, 2), x.permute(2, 0, 1).contiguous(),
            x.t() if x.dim() == 2 else x.flatten(1), x.unsqueeze(1).squeeze(1), x.view(-1).reshape(4, 6).t())


def f_index(x, idx):  # x: (4, 5), idx: int64 (3,)
    return x[0], x[:, 1:3], x[..., -1], x[1:, ::2], x[idx], x[:, idx], x[None, 2], x[-1, -2]


def f_index_bool_mask(x):
    return x[x > 0], x[:, 0][x[:, 1] > 0]


def f_creation(x):
    z = torch.zeros(x.shape[0], 3)
    o = torch.ones(2, x.shape[1], dtype=torch.int64)
    f = torch.full((2, 2), 0.5)
    return z + x[:, :3], o, f, torch.zeros_like(x), torch.ones_like(x) * x, x.new_full((3,), 7.0), torch.arange(x.shape[1])


def f_copy(x):
    buf = torch.zeros_like(x)
    buf.copy_(x * 2)
    out = torch.empty(x.shape[0], x.shape[1] * 2)
    out.copy_(torch.cat([x, -x], 1))
    return buf, out


def f_copy_into_slice(x):
    part = torch.ones(x.shape[0], 6)
    part[:, :2].copy_(x[:, :2])
    view = part[:, 4:]
    view.copy_(x[:, -2:] - 1)  # writes through a view into `part`
    return part


def f_where(x, y):
    return torch.where(x > 0, x, y * 2), torch.where(x > y, x, 0.0), x.masked_fill(y < 0, -1.0), x.clamp(-0.5, 0.5)


def f_inplace_ops(x):
    y = x.clone()
    y.add_(1)
    y.mul_(2)
    y.relu_()
    return y


def f_index_augassign(x):
    y = x.clone()
    y[0] += 10
    y[:, 1] *= -1
    return y


def _helper(a, b):
    return torch.tanh(a) * b


def f_calls_helper(x, y):
    """A plain function calling another plain function."""
    return _helper(x, y) + _helper(y, x)


def f_while_plain(x):
    """A plain function with a data-dependent loop."""
    while x.abs().max() > 1:
        x = x / 2
    return x


TENSOR_FUNCTIONS = [
    ("matmul", f_matmul, lambda s: (randn(3, 4, seed=s), randn(5, 4, seed=s + 50))),
    ("softmax", f_softmax, lambda s: (randn(3, 4, seed=s),)),
    ("argmax", f_argmax, lambda s: (randn(3, 4, seed=s),)),
    ("max", f_max, lambda s: (randn(3, 4, seed=s),)),
    ("sum_mean", f_reduce, lambda s: (randn(3, 4, seed=s),)),
    ("cat_stack", f_cat_stack, lambda s: (randn(2, 3, seed=s), randn(2, 3, seed=s + 50))),
    ("split_chunk", f_split_chunk, lambda s: (randn(2, 6, seed=s),)),
    ("views", f_views, lambda s: (randn(2, 3, 4, seed=s),)),
    ("index_slice", f_index, lambda s: (randn(4, 5, seed=s), torch.randint(0, 4, (3,), generator=gen(s)))),
    ("zeros_ones_full", f_creation, lambda s: (randn(3, 4, seed=s),)),
    ("copy_", f_copy, lambda s: (randn(3, 6, seed=s),)),
    ("copy_into_slice", f_copy_into_slice, lambda s: (randn(3, 6, seed=s),)),
    ("where", f_where, lambda s: (randn(3, 3, seed=s), randn(3, 3, seed=s + 50))),
    ("inplace_ops", f_inplace_ops, lambda s: (randn(3, 4, seed=s),)),
    ("index_augassign", f_index_augassign, lambda s: (randn(3, 4, seed=s),)),
    ("calls_helper", f_calls_helper, lambda s: (randn(3, seed=s), randn(3, seed=s + 50))),
    ("while_plain", f_while_plain, lambda s: (randn(3, seed=s) * (10.0 ** (s - 1)),)),
]


@pytest.mark.parametrize("name,fn,make", TENSOR_FUNCTIONS, ids=[c[0] for c in TENSOR_FUNCTIONS])
def test_plain_function(name, fn, make):
    assert_matches_eager(fn, [make(s) for s in range(3)])


def test_bool_mask_indexing_is_right_or_unsupported():
    """`x[x > 0]` has a data-dependent shape: a shape-specialized compiler may refuse it, but
    only with UnsupportedError (at compile or call time), never with a wrong answer."""
    inputs = [(randn(4, 5, seed=s),) for s in range(3)]
    try:
        assert_matches_eager(f_index_bool_mask, inputs)
    except cocktailer.UnsupportedError:
        pass


# =========================================================================== 9. re-specialization


def test_respecialize_batch_size():
    model = seeded(RNNShapeSteps)
    inputs = [(randn(2, 4, D, seed=0), randn(2, H, seed=1)),
              (randn(5, 4, D, seed=2), randn(5, H, seed=3)),
              (randn(1, 4, D, seed=4), randn(1, H, seed=5)),
              (randn(3, 7, D, seed=6), randn(3, H, seed=7)),
              (randn(2, 4, D, seed=8), randn(2, H, seed=9))]  # back to the first shapes
    assert_matches_eager(model, inputs)


def test_respecialize_cnn_batch_and_size():
    model = seeded(SmallCNN)
    inputs = [(randn(2, 3, 8, 8, seed=0),), (randn(4, 3, 8, 8, seed=1),), (randn(1, 3, 10, 12, seed=2),),
              (randn(2, 3, 8, 8, seed=3),)]
    assert_matches_eager(model, inputs)


def test_respecialize_dtype():
    def f(x):
        if x.sum() > 0:
            return x * 2 + x.sum()
        return x - 1

    inputs = [(randn(3, seed=0),), (randn(3, seed=1).double(),), (torch.tensor([3, -1, 2]),),
              (torch.tensor([-3, -1, 2]),), (-randn(3, seed=2).abs(),)]
    assert_matches_eager(f, inputs)


# =========================================================================== 10. autograd


class GradModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.lin(x))
        if x.sum() > 0:
            x = x * 2
        return x


def _user_warnings(records):
    return [w for w in records if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize("needs_grad", ["params", "input"])
def test_grad_enabled_raises_or_warns(needs_grad):
    model = seeded(GradModel)
    x = randn(B, H, seed=0)
    if needs_grad == "params":
        assert all(p.requires_grad for p in model.parameters())
    else:
        model.requires_grad_(False)
        x.requires_grad_(True)
    fast = cocktailer.compile(model, example_inputs=(x.detach(),), backend="reference")
    assert torch.is_grad_enabled()
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        try:
            out = fast(x)
        except cocktailer.UnsupportedError:
            return  # refusing is one accepted behaviour
    assert _user_warnings(records), "compiled call with grad enabled neither raised UnsupportedError nor warned"
    # It returned: the result must be differentiable and equal to eager, gradients included.
    expected = model(x)
    assert out.requires_grad
    assert_same(out, expected)
    leaves = list(model.parameters()) if needs_grad == "params" else [x]
    grads = torch.autograd.grad(out.square().sum(), leaves)
    expected_grads = torch.autograd.grad(expected.square().sum(), leaves)
    assert_same(list(grads), list(expected_grads), rtol=1e-4, atol=1e-5)


def test_no_grad_does_not_warn():
    model = seeded(GradModel)
    x = randn(B, H, seed=0)
    fast = cocktailer.compile(model, example_inputs=(x,), backend="reference")
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = fast(x)
            expected = model(x)
    assert not _user_warnings(records), [str(w.message) for w in records]
    assert_same(out, expected)
    assert not out.requires_grad
