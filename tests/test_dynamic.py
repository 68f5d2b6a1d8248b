"""Dynamic sizes: one compiled program for every tree size and every sequence length a loop
runs over, chosen automatically after a second size, with dynamic=True, or with mark_dynamic;
sizes 0 and 1 and sizes the program needs as numbers get programs of their own. Every result
is compared with eager PyTorch."""
from __future__ import annotations

import random

import pytest
import torch

import cocktailer
from cocktailer.data import random_tree
from cocktailer.models.tree import RAE, TreeLSTM, tree_inputs
from utils import assert_matches_eager, assert_same, backends_under_test

HIDDEN = 8


def trees(sizes, seed=0):
    """(left, right, is_leaf, inp, root) of random trees of these leaf counts, unpadded."""
    rng, table = random.Random(seed), torch.randn(20, HIDDEN, generator=torch.Generator().manual_seed(seed))
    out = []
    for n in sizes:
        tree = random_tree(n, rng.randrange(1 << 30))
        out.append(tree_inputs(tree, [rng.randrange(20) for _ in range(n)], table, tree.num_nodes))
    return out


def model(cls=RAE):
    torch.manual_seed(0)
    return cls(HIDDEN).eval()


def run_all(fast, m, inputs):
    with torch.no_grad():
        for args in inputs:
            assert_same(fast(*args), m(*args), 1e-4, 1e-5)


def symbolic_programs(fast) -> list:
    return [program for program, _ in fast.cache.values() if program.sizes]


@pytest.mark.parametrize("backend", backends_under_test())
def test_a_second_tree_size_compiles_one_program_for_all_sizes(backend):
    m, inputs = model(), trees([2, 3, 5, 8, 13, 21, 4])
    fast = cocktailer.compile(m, backend=backend)
    run_all(fast, m, inputs)
    # the first size alone, then one program with the node count symbolic for all the others
    assert len(fast.cache) == 2
    (program,) = symbolic_programs(fast)
    assert {dim for _, _, dim in program.sizes} == {0}
    assert "i64[s0]" in str(program)


@pytest.mark.parametrize("cls", [RAE, TreeLSTM])
def test_dynamic_true_compiles_once_for_every_size_of_at_least_two(cls):
    m, inputs = model(cls), trees([3, 1, 6, 2, 9, 30])   # leaf counts: 1 leaf is a 1-node tree
    fast = cocktailer.compile(m, inputs[0], dynamic=True)
    run_all(fast, m, inputs)
    # every tree of >= 2 nodes shares one program; the hidden size was needed as a number
    # (a row of `inp` feeds a matmul) and the 1-node tree has a program of its own
    assert len(fast.cache) == 2
    (program,) = symbolic_programs(fast)
    assert "f32[s3,8]" in str(program)


def test_mark_dynamic_names_the_dims():
    m, inputs = model(), trees([4, 7, 11])
    for args in inputs:
        for table in args[:4]:
            cocktailer.mark_dynamic(table, 0)
    fast = cocktailer.compile(m, inputs[0])
    run_all(fast, m, inputs)
    assert len(fast.cache) == 1 and symbolic_programs(fast)


def test_dynamic_false_compiles_every_shape_apart():
    m, inputs = model(), trees([3, 5, 8])
    fast = cocktailer.compile(m, dynamic=False)
    run_all(fast, m, inputs)
    assert len(fast.cache) == 3 and not symbolic_programs(fast)


def test_an_index_past_the_end_of_a_symbolic_size_is_an_error_not_a_read():
    m = model()
    fast = cocktailer.compile(m, dynamic=True)
    left, right, is_leaf, inp, root = trees([4])[0]
    with torch.no_grad():
        fast(left, right, is_leaf, inp, root)
        with pytest.raises((cocktailer.CompiledCallError, IndexError)):
            fast(left, right, is_leaf, inp, torch.tensor(len(left)))
        with pytest.raises(IndexError):
            m(left, right, is_leaf, inp, torch.tensor(len(left)))


def test_sizes_the_program_needs_as_numbers_are_specialized():
    """A mean over the rows divides by the row count: that size is a number in the program,
    so each size has a program of its own, and every result is right."""
    def mean_of_rows(x, k):
        return x.sum(0) / x.shape[0] + x[k]
    inputs = [(torch.randn(n, 3), torch.tensor(n // 2)) for n in (2, 5, 9)]
    fast = assert_matches_eager(mean_of_rows, inputs, backend="cpu" if "cpu" in backends_under_test() else None)
    assert not symbolic_programs(fast)


def test_sizes_zero_and_one_have_programs_of_their_own():
    def pick(x, k, h):
        return h * 2 if x.numel() == 0 else h + x[k]   # numel: the size as a number
    def row(x, k):
        return x[k] * 2
    inputs = [(torch.randn(n, 3), torch.tensor(0)) for n in (4, 1, 6, 1, 9)]
    fast = cocktailer.compile(row, dynamic=True)
    with torch.no_grad():
        for args in inputs:
            assert_same(fast(*args), row(*args), 1e-4, 1e-5)
    shapes = sorted(str(key[1][0][1]) for key in fast.cache)
    assert shapes == ["(1, 3)", "(None, 3)"]
    empty = [(torch.randn(0, 3), torch.tensor(0), torch.ones(3)), (torch.randn(5, 3), torch.tensor(2), torch.ones(3))]
    assert_matches_eager(pick, empty)


def test_printer_and_verifier_show_symbolic_sizes():
    m, (args,) = model(), trees([5])
    program = cocktailer.capture(m, args, dynamic=frozenset({(0, 0), (3, 0)}))
    cocktailer.verify(program)
    text = str(program)
    assert "i64[s0]" in text and "f32[s1,8]" in text and "i64[9]" in text


def test_a_variable_of_a_symbolic_size_on_one_path_and_a_fixed_one_on_another_is_specialized():
    """Where eager's shapes agree only for the captured size, the size is a number."""
    def pick(x, c):
        y = x if c > 0 else torch.zeros(4, 3)
        return y * 2
    def passthrough(x, i):   # a recursive function returning the tensor of symbolic size itself
        if i <= 0:
            return x
        return passthrough(x, i - 1) + 1
    for fn, inputs in [(pick, [(torch.randn(4, 3), torch.tensor(c)) for c in (1.0, -1.0)]),
                       (passthrough, [(torch.randn(4, 3), torch.tensor(k)) for k in (0, 2)])]:
        fast = cocktailer.compile(fn, inputs[0], dynamic=True)
        with torch.no_grad():
            for args in inputs:
                assert_same(fast(*args), fn(*args), 1e-4, 1e-5)
        assert not symbolic_programs(fast)


class Elman(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.recur = torch.nn.Linear(4, 4)

    def forward(self, x):
        seq_len, _ = x.shape
        h = torch.zeros(4)
        for t in range(seq_len):
            h = torch.tanh(self.recur(h) + x[t])
        return h


@pytest.mark.parametrize("backend", backends_under_test())
def test_a_loop_over_a_sequence_runs_for_its_length_at_call_time(backend):
    """`for t in range(seq_len)` with `seq_len, _ = x.shape`: the length is a symbolic size
    and the loop's trip count; one program serves every length of at least 2."""
    torch.manual_seed(0)
    m = Elman().eval()
    fast = cocktailer.compile(m, backend=backend)
    run_all(fast, m, [(torch.randn(n, 4, generator=torch.Generator().manual_seed(n)),) for n in (5, 3, 9, 2, 17)])
    assert len(fast.cache) == 2   # the first length, then one for all
    (program,) = symbolic_programs(fast)
    assert " = dim %" in str(program)


@pytest.mark.parametrize("name", ["lstm", "nasrnn"])
def test_an_rnn_whose_input_projection_is_hoisted_compiles_per_length(name):
    """The cpu backend computes x[t] @ W_ih for all t as one GEMM before the loop; with the
    length symbolic it could not (3x slower), so each length compiles its own program there.
    The reference backend has no such pass: one program for all lengths."""
    from cocktailer import models
    w = models.make(name, 1, size="small")
    inputs = [(torch.randn(n, *w.inputs[0].shape[1:], generator=torch.Generator().manual_seed(n)),) for n in (5, 3, 9)]
    for backend in backends_under_test():
        fast = cocktailer.compile(w.model, backend=backend, dynamic=True)
        run_all(fast, w.model, inputs)
        assert bool(symbolic_programs(fast)) == (backend == "reference")


def test_a_length_used_in_arithmetic_is_specialized_and_a_range_of_it_is_not():
    def running(x):
        n = x.size(0)
        acc = torch.zeros(x.shape[1])
        for t in range(n):
            acc = acc * 0.5 + x[t]
        return acc
    def last_but_one(x):
        return x[x.shape[0] - 2] * 2   # the size as a number: specialized
    def over_len(x):   # range(len(x)): the same length
        acc = torch.zeros(x.shape[1])
        for t in range(len(x)):
            acc = acc * 0.5 + x[t]
        return acc
    for fn, symbolic in [(running, True), (over_len, True), (last_but_one, False)]:
        fast = cocktailer.compile(fn, dynamic=True)
        with torch.no_grad():
            for n in (3, 6, 4):
                x = torch.randn(n, 4)
                assert_same(fast(x), fn(x), 1e-4, 1e-5)
        assert bool(symbolic_programs(fast)) == symbolic


def test_a_program_that_fails_with_symbolic_sizes_compiles_for_numbers():
    """`x.shape` of a symbolic size is a tuple, not a torch.Size: `.numel()` of it fails in
    capture, and the program is compiled with that call's sizes instead."""
    def scaled(x):
        return x / x.shape.numel()
    fast = cocktailer.compile(scaled, dynamic=True)
    with torch.no_grad():
        for n in (3, 5):
            x = torch.randn(n, 2)
            assert_same(fast(x), scaled(x), 1e-4, 1e-5)
    assert not symbolic_programs(fast)
