"""Idioms of public PyTorch code with control flow, compiled as written and compared with
eager (results and arguments after the call)."""
import pytest
import torch
import torch.nn as nn

import cocktailer
from utils import assert_matches_eager, randn


class BranchInTimeLoop(nn.Module):
    """`if c: out = f(x) else: out = g(x)` inside a time loop: `out` is first assigned in both
    arms of an `if` nested in the loop body."""

    def __init__(self):
        super().__init__()
        self.f, self.g = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, xs):
        h = torch.zeros(4)
        for t in range(xs.shape[0]):
            if xs[t].sum() > 0:
                out = self.f(xs[t] + h)
            else:
                out = self.g(xs[t] - h)
            h = torch.tanh(out)
        return h


def nested_branch_assigns_in_both_arms(x, c):
    if c > 0:
        if x.sum() > 0:
            y = x * 2
        else:
            y = x * 3
        z = y + 1
    else:
        z = x
    return z


def def_inside_a_branch(x, c: float):
    if c > 0:
        def act(v):
            return v * 2
    else:
        def act(v):
            return v * 3
    return act(x)


class EarlyExit(nn.Module):
    """BranchyNet/BlockDrop-style early exit: after the exit test, the features are
    downsampled (a new shape), which is dead on the path that returned."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(8, 8), nn.Linear(4, 4), nn.Linear(2, 2)])
        self.heads = nn.ModuleList([nn.Linear(8, 3), nn.Linear(4, 3), nn.Linear(2, 3)])

    def forward(self, x, threshold):
        for i in range(3):
            x = torch.relu(self.blocks[i](x))
            out = self.heads[i](x)
            if out.softmax(-1).max() > threshold:
                return out
            x = x[:, : x.shape[1] // 2] + x[:, x.shape[1] // 2:]
        return out


class NamedLayers(nn.Module):
    """A loop index formatted into a name: `getattr(self, f"layer{i}")`, ModuleDict keys."""

    def __init__(self):
        super().__init__()
        for i in range(3):
            setattr(self, f"layer{i}", nn.Linear(4, 4))
        self.blocks = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(3)})
        self.groups = nn.ModuleDict({"group{}".format(i): nn.Linear(4, 4) for i in range(3)})

    def forward(self, x):
        for i in range(3):
            x = getattr(self, f"layer{i}")(x)
            x = self.blocks[str(i)](x)
            x = torch.tanh(self.groups["group{}".format(i)](x))
        return x


def legacy_spellings(x):
    v = torch.autograd.Variable(x)     # the same tensor, detached
    v.data.mul_(0.5)                   # writes x, as in eager
    return v.data * 2, x


def test_branch_assignments_in_loops_and_nested_ifs():
    torch.manual_seed(0)
    assert_matches_eager(BranchInTimeLoop(), [(randn(5, 4, seed=s),) for s in range(3)])
    assert_matches_eager(nested_branch_assigns_in_both_arms,
                         [(randn(3, seed=0), torch.tensor(c)) for c in (1.0, -1.0)] +
                         [(-randn(3, seed=0).abs(), torch.tensor(1.0))])
    for c in (1.0, -1.0):
        assert_matches_eager(def_inside_a_branch, [(randn(3, seed=0), c)])


def test_early_exit_with_a_shape_change_after_the_exit():
    torch.manual_seed(0)
    x = randn(1, 8, seed=1)
    assert_matches_eager(EarlyExit(), [(x, torch.tensor(t)) for t in (0.0, 0.4, 0.6, 1.1)])


def test_loop_index_formatted_into_names_and_legacy_spellings():
    torch.manual_seed(0)
    assert_matches_eager(NamedLayers(), [(randn(2, 4, seed=0),)])
    assert_matches_eager(legacy_spellings, [(randn(3, seed=0),)])


class _Node:
    def __init__(self):
        self.state = None


class _Stateful(nn.Module):
    """Keeps its last hidden state on itself and on the node it is given, as eager code does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.hidden = None

    def forward(self, x, node):
        h = torch.tanh(self.lin(x))
        if h.sum() > 0:
            h = h * 2
        self.hidden = h
        self.history = [h, h + 1]
        node.state = h
        return h - 1


def test_attributes_assigned_in_forward_hold_real_tensors():
    torch.manual_seed(0)
    model = _Stateful().eval()
    fast = cocktailer.compile(model, backend="cpu")
    assert model.hidden is None and not hasattr(model, "history")   # nothing yet: compiling changes nothing
    for seed in range(3):
        x, node, eager_node = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed)), _Node(), _Node()
        with torch.no_grad():
            out = fast(x, node)
            expected = _Stateful.forward(model, x, eager_node)
        torch.testing.assert_close(out, expected)
        for value, reference in ((model.hidden, expected + 1), (model.history[1], expected + 2),
                                 (node.state, eager_node.state)):
            assert type(value) is torch.Tensor
            torch.testing.assert_close(value, reference)


def test_python_state_assigned_in_forward_is_refused():
    class Counter(nn.Module):
        def forward(self, x):
            self.calls = getattr(self, "calls", 0) + 1
            return x + 1
    model = Counter()
    with pytest.raises(cocktailer.UnsupportedError, match="sets the attribute `calls` of the module to a Python value"):
        cocktailer.compile(model, (torch.ones(2),), backend="reference")
    assert not hasattr(model, "calls")   # capture's own runs left no trace


class _NamedLayers(nn.Module):
    """Layers found by names built from the loop index, and a helper defined inside a branch."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(3)})
        for i in range(3):
            setattr(self, f"layer{i}", nn.Linear(4, 4))

    def forward(self, x):
        for i in range(3):
            if x.sum() > 0:
                def act(t):
                    return torch.relu(t)
                out = act(self.blocks[str(i)](x))
            else:
                out = getattr(self, "layer{}".format(i))(x)
            x = out
        return x


def test_module_dict_keyed_by_str_of_the_loop_index():
    torch.manual_seed(0)
    assert_matches_eager(_NamedLayers(), [(randn(2, 4, seed=s),) for s in range(4)])


class _GrowingGeneration(nn.Module):
    """GPT-style generate: the sequence grows by one token per step of a Python-int loop."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.head = nn.Linear(8, 10)

    def forward(self, idx, max_new_tokens: int = 4):
        for _ in range(max_new_tokens):
            logits = self.head(self.embed(idx).mean(0))
            idx = torch.cat([idx, logits.argmax().reshape(1)])
        return idx


def test_a_sequence_that_grows_in_a_python_int_loop():
    torch.manual_seed(0)
    assert_matches_eager(_GrowingGeneration(), [(torch.tensor([1, 2]),), (torch.tensor([7, 3]),)])


def test_boolean_mask_assignment_has_no_data_dependent_shape():
    """`t[mask] = v` (pattern 6): the shape stays; only the masked elements change, inside a
    tensor loop too, with a scalar or a broadcast value."""
    def clip_and_mark(x, done, n):
        x[x < 0] = 0.0
        for _ in range(n):
            x = x * 1.5 - 0.25
            x[done] = torch.tensor(-1.0)
            done = done | (x > 1.0)
        return x, done
    sets = [(randn(4, 3, seed=s), randn(4, 3, seed=s + 9) > 0.8, torch.tensor(s + 1)) for s in range(3)]
    assert_matches_eager(clip_and_mark, sets)
