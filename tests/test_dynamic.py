"""Dynamic sizes: one compiled program for every tree size and every sequence length a loop
runs over, chosen automatically after a second size, with dynamic=True, or with mark_dynamic;
sizes 0 and 1 and sizes the program needs as numbers get programs of their own. Every result
is compared with eager PyTorch."""
from __future__ import annotations

import random
import re

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


def length_is_symbolic(fast) -> bool:
    """Whether a program takes the first argument's dim 0 as a symbolic size."""
    return any(position == 0 and dim == 0 for p in symbolic_programs(fast) for _, position, dim in p.sizes)


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
    assert "f32[s0,8]" in str(program)   # the node count: one Sym for every table (duck sizing)


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
    assert shapes == ["(1, None)", "(None, None)"]   # the width too: nothing needs it as a number
    empty = [(torch.randn(0, 3), torch.tensor(0), torch.ones(3)), (torch.randn(5, 3), torch.tensor(2), torch.ones(3))]
    assert_matches_eager(pick, empty)


def test_printer_and_verifier_show_symbolic_sizes():
    m, (args,) = model(), trees([5])
    program = cocktailer.capture(m, args, dynamic=frozenset({(0, 0), (3, 0)}))
    cocktailer.verify(program)
    text = str(program)
    assert "i64[s0]" in text and "f32[s0,8]" in text and "i64[9]" in text   # equal sizes: one Sym


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
def test_an_rnn_whose_input_projection_is_hoisted_runs_every_length_on_one_program(name):
    """The cpu backend splits a stacked RNN's time loop per layer and computes each layer's
    x[t] @ W_ih for all t as one GEMM before its loop: with the length symbolic, the stacked
    outputs and the product have a symbolic number of rows (sized at call time in the
    arena, the GEMM's M a run-time size). One program serves every length, the arena grows
    for a longer sequence than any before, and shorter ones after it stay right."""
    from cocktailer import models
    w = models.make(name, 1, size="small")
    lengths = (5, 3, 9, 40, 2, 7)
    inputs = [(torch.randn(n, *w.inputs[0].shape[1:], generator=torch.Generator().manual_seed(n)),) for n in lengths]
    for backend in backends_under_test():
        fast = cocktailer.compile(w.model, backend=backend, dynamic=True)
        run_all(fast, w.model, inputs)
        (program,) = symbolic_programs(fast)
        assert len(fast.cache) == 1
    if "cpu" in backends_under_test():
        text = cocktailer.explain(fast)
        assert re.search(r"= matmul %\d+, %\d+ : f32\[s0,", text), "the hoisted GEMM over all steps"
        if name == "lstm":   # the time loop split per layer, each passing its outputs on stacked
            assert re.search(r"stack\(last 1 yields\) \{.*\n(.*\n)*?  \} : \(.*f32\[s0,1,8\]\)", text)


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
        assert length_is_symbolic(fast) == symbolic


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


# --------------------------------------------------------------------------- whole sequences


class Encoder(torch.nn.Module):
    """Ops over a whole sequence at once: a linear layer (rows of a symbolic count), softmax
    and mean over the sequence, elementwise ops, a result of the sequence's length."""

    def __init__(self):
        super().__init__()
        self.lin, self.score = torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        weights = torch.softmax(self.score(h), 0)
        return (weights * h).sum(0), h.mean(0), torch.relu(h) * 2 + 1, h[-1], h[:, 0]


def lengths(*ns, width=4):
    return [(torch.randn(n, width, generator=torch.Generator().manual_seed(n)),) for n in ns]


@pytest.mark.parametrize("backend", backends_under_test())
def test_ops_over_a_whole_sequence_take_its_length_symbolic(backend):
    """Intermediates and results of a symbolic size: sized at call time (the arena grows for
    a longer sequence than any before it; shorter ones after it stay right)."""
    torch.manual_seed(0)
    m = Encoder().eval()
    fast = cocktailer.compile(m, backend=backend, dynamic=True)
    run_all(fast, m, lengths(5, 9, 3, 64, 2, 7))
    (program,) = symbolic_programs(fast)
    assert len(fast.cache) == 1
    assert "f32[s0,8]" in str(program)


def prealloc_rnn(x, w):
    """The loop writes each step into a tensor of the sequence's length made before it."""
    h = torch.zeros(w.shape[0])
    out = torch.zeros(x.shape[0], w.shape[0])
    for t in range(x.shape[0]):
        h = torch.tanh(w @ h + x[t])
        out[t] = h
    return out, out.sum(0)


@pytest.mark.parametrize("backend", backends_under_test())
def test_a_tensor_made_with_a_symbolic_size_is_sized_at_call_time(backend):
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(1)) * 0.5
    fast = cocktailer.compile(prealloc_rnn, backend=backend)
    run_all(fast, prealloc_rnn, [(cocktailer.mark_dynamic(x, 0), w) for (x,) in lengths(6, 3, 11, 2)])
    (program,) = symbolic_programs(fast)
    assert len(fast.cache) == 1
    assert "full" in str(program) and "f32[s0,4]" in str(program)


@pytest.mark.parametrize("module", ["lstm2", "gru_batch_first", "lstm_bidirectional"])
def test_torch_rnn_modules_run_every_sequence_length_on_one_program(module):
    torch.manual_seed(0)
    m = {"lstm2": lambda: torch.nn.LSTM(4, 8, num_layers=2),
         "gru_batch_first": lambda: torch.nn.GRU(4, 8, batch_first=True),
         "lstm_bidirectional": lambda: torch.nn.LSTM(4, 8, bidirectional=True)}[module]().eval()
    shape = (lambda n: (2, n, 4)) if m.batch_first else (lambda n: (n, 2, 4))
    inputs = [(torch.randn(*shape(n), generator=torch.Generator().manual_seed(n)),) for n in (5, 3, 12, 2)]
    for backend in backends_under_test():
        fast = cocktailer.compile(m, backend=backend)
        run_all(fast, m, inputs)
        assert len(fast.cache) == 2   # the first length, then one program for every other
        assert len(symbolic_programs(fast)) == 1


def test_two_sequences_of_one_length_share_its_symbol_and_other_lengths_get_another_program():
    """`x + y` needs their lengths equal: capture gives equal sizes one Sym (torch.compile's
    duck sizing), and the program is keyed by which sizes were equal, so a call where they
    differ (y broadcasts) compiles a program of its own."""
    def add(x, y):
        return torch.tanh(x + y).sum(0)
    for backend in backends_under_test():
        fast = cocktailer.compile(add, backend=backend)
        calls = [(torch.randn(n, 4), torch.randn(n, 4)) for n in (5, 9, 3)] + [(torch.randn(6, 4), torch.randn(1, 4))]
        run_all(fast, add, [tuple(cocktailer.mark_dynamic(t, 0) for t in c) for c in calls] + [calls[0]])
        types = sorted(" ".join(str(p.type) for p in program.main.params) for program, _ in fast.cache.values())
        assert types == ["f32[s0,4] f32[1,4]", "f32[s0,4] f32[s0,4]"]


def test_slices_of_part_of_a_symbolic_dim_are_specialized_and_indices_wrap_at_call_time():
    """`x[1:]` has a size that depends on the length and `x[:3]` assumes the length is at
    least 3, and an index list's constant indices would count from the end of the captured
    length: those programs are compiled per length (a length of 2 gives 2 rows, as eager).
    `x[-1]` counts from the end of each call's length."""
    def head_tail(x):
        return x[1:].sum(0), x[:3] * 2
    def listed(x):
        return x[[0, -1]]
    def ends(x):
        return x[-1] + x[0]
    for fn, symbolic in [(head_tail, False), (listed, False), (ends, True)]:
        for backend in backends_under_test():
            fast = cocktailer.compile(fn, backend=backend, dynamic=True)
            run_all(fast, fn, lengths(5, 2, 8, 3))
            assert length_is_symbolic(fast) == symbolic, (fn.__name__, backend)


def test_a_constant_index_past_the_end_of_this_calls_length_is_an_error_not_a_read():
    def fifth(x):
        return x[4] * 2
    for backend in backends_under_test():
        fast = cocktailer.compile(fifth, backend=backend, dynamic=True)
        run_all(fast, fifth, lengths(6, 9))
        assert symbolic_programs(fast)
        with torch.no_grad(), pytest.raises((cocktailer.CompiledCallError, IndexError)):
            fast(torch.randn(3, 4))


# --------------------------------------------------------------------------- lists grown in a loop

W_STEP = torch.randn(4, 4, generator=torch.Generator().manual_seed(2)) * 0.5


def stacked_outputs(x):
    """The idiom of hand-written RNNs: a list appended one output per step, stacked after."""
    h, outs = torch.zeros(4), []
    for t in range(x.shape[0]):
        h = torch.tanh(W_STEP @ h + x[t])
        outs.append(h)
    return torch.stack(outs), outs[-1]


def concatenated_rows(x):
    h, outs = torch.zeros(1, 4), []
    for t in range(len(x)):
        h = torch.tanh(h @ W_STEP + x[t].unsqueeze(0))
        outs.append(h)
    return torch.cat(outs).sum(0)


def reads_what_it_appended(x):
    """The body reads the list it grows: its rows are not Python values in a compiled loop,
    so each length compiles its own (unrolled) program, and every answer stays right."""
    outs = []
    for t in range(x.shape[0]):
        prev = outs[-1] if outs else torch.zeros(4)
        outs.append(torch.tanh(prev + x[t]))
    return torch.stack(outs)


def appends_under_a_branch(x):
    """Each branch appends: one row per step in eager too, but an append under a branch on a
    tensor is refused (it may not happen in every step): compiled per length."""
    outs = []
    for t in range(x.shape[0]):
        if x[t].sum() > 0:
            outs.append(x[t] * 2)
        else:
            outs.append(x[t] * 3)
    return torch.stack(outs)


def returns_the_list(x):
    outs = []
    for t in range(x.shape[0]):
        outs.append(x[t] * 2)
    return outs


@pytest.mark.parametrize("fn, symbolic", [(stacked_outputs, True), (concatenated_rows, True),
                                          (reads_what_it_appended, False), (appends_under_a_branch, False),
                                          (returns_the_list, False)])
def test_a_list_appended_once_per_step_of_a_symbolic_loop_is_its_stacked_output(fn, symbolic):
    for backend in backends_under_test():
        fast = cocktailer.compile(fn, backend=backend)
        run_all(fast, fn, [(cocktailer.mark_dynamic(x, 0),) for (x,) in lengths(5, 9, 3, 12)])
        assert length_is_symbolic(fast) == symbolic, (fn.__name__, backend)
        if symbolic:
            (program,) = symbolic_programs(fast)
            assert "stack(last 1 yields)" in str(program) and "f32[s0,4]" in str(program)


def test_values_of_one_symbolic_size_share_arena_slots_where_their_lifetimes_allow():
    from cocktailer.schedule.memory import plan_memory
    torch.manual_seed(0)
    (x,) = lengths(6)[0]
    program = cocktailer.capture(Encoder().eval(), (x,), dynamic=frozenset({(0, 0)}))
    symbolic = [v for op in program.walk() for v in op.results if v.type.syms]
    plan = plan_memory(program)
    slots = {plan.of(v).offset for v in symbolic if plan.of(v).space == "dynamic"}
    assert len(symbolic) >= 8 and len(slots) == len(plan.dynamic) <= len(symbolic) // 2


@pytest.mark.skipif("cpu" not in backends_under_test(), reason="needs a C compiler")
def test_a_size_a_native_kernel_needs_as_a_number_is_specialized_alone():
    """With dynamic=True the hidden size (the weight's dims, each row's size) is symbolic too;
    the cpu kernel that writes a row into `out` needs the row's size as a number: that size
    is specialized and the program is compiled again with the sequence's length symbolic."""
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(1)) * 0.5
    fast = cocktailer.compile(prealloc_rnn, backend="cpu", dynamic=True)
    run_all(fast, prealloc_rnn, [(x, w) for (x,) in lengths(6, 3, 11, 2)])
    (program,) = symbolic_programs(fast)
    assert len(fast.cache) == 1
    assert [str(p.type) for p in program.main.params] == ["f32[s0,4]", "f32[4,4]"]


def in_place(x, y, b):
    z = x * 1
    z.add_(y)
    z *= 2
    z.relu_()
    x.mul_(0.5)   # an argument written in place: written back at the call's size
    x += b
    return z.sum(0)


def test_in_place_ops_on_tensors_of_a_symbolic_size_write_at_the_calls_size():
    calls = [(torch.randn(n, 4), torch.randn(n, 4), torch.randn(4)) for n in (5, 9, 3)]
    for backend in backends_under_test():
        fast = cocktailer.compile(in_place, backend=backend)
        for args in calls:
            eager_args, compiled_args = [t.clone() for t in args], [t.clone() for t in args]
            cocktailer.mark_dynamic(compiled_args[0], 0), cocktailer.mark_dynamic(compiled_args[1], 0)
            with torch.no_grad():
                assert_same(fast(*compiled_args), in_place(*eager_args), 1e-4, 1e-5)
            assert_same(compiled_args, eager_args, 1e-4, 1e-5)
        assert len(fast.cache) == 1 and length_is_symbolic(fast)


W_ATTEND = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))


def attend(q, memory):
    """Attention over a memory of a symbolic length: matmuls with that length as M, as N
    (`q @ keys.T`) and as K (`weights @ memory`), softmax along it, an [s, s] intermediate."""
    weights = torch.softmax(memory @ (W_ATTEND @ q), 0)
    keys = memory @ W_ATTEND
    logits = q.unsqueeze(0) @ keys.T
    pairs = torch.tanh(keys @ keys.T)
    return weights @ memory, logits.softmax(-1), pairs.sum(0)


@pytest.mark.parametrize("backend", backends_under_test())
def test_attention_over_a_memory_of_a_symbolic_length(backend):
    fast = cocktailer.compile(attend, backend=backend)
    calls = [(torch.randn(8, generator=torch.Generator().manual_seed(n)), cocktailer.mark_dynamic(m, 0))
             for n, (m,) in zip(range(5), lengths(5, 9, 3, 40, 17, width=8))]
    run_all(fast, attend, calls)
    assert len(fast.cache) == 1 and symbolic_programs(fast)


def test_an_update_strided_by_a_symbolic_size_is_specialized_and_right():
    """Fuzz seed 7201576: `x[:, -1] += v` on x of a symbolic width writes a column whose
    stride is that width; the cpu update kernel needs it as a number."""
    def last_column(x, v):
        x[:, -1] += v
        return x.tanh()
    for backend in backends_under_test():
        fast = cocktailer.compile(last_column, backend=backend)
        for n in (3, 5, 8):
            args = (torch.randn(4, n), torch.randn(4))
            eager_args, compiled_args = [t.clone() for t in args], [cocktailer.mark_dynamic(t.clone(), 1) if t.dim() == 2
                                                                    else t.clone() for t in args]
            with torch.no_grad():
                assert_same(fast(*compiled_args), last_column(*eager_args), 1e-4, 1e-5)
            assert_same(compiled_args, eager_args, 1e-4, 1e-5)


def project(x, w):
    return torch.relu(x @ w).sum(0)


def script_profiler(monkeypatch, specialized_faster_at=None):
    """The measured policy's profiler, replaced: every candidate takes 1 s (the first of equals
    is kept), and a program specialized at a sample's sizes 0.5 s where its first input's
    length is `specialized_faster_at`, else 1 s. No test times anything."""
    from cocktailer.backend import measured

    class Scripted(measured.Profiler):
        def compare(self, runs):
            if len(runs) != 2 or len(self.samples) != 1:   # the search's candidates and confirmation
                return [1.0] * len(runs)
            (sample,) = self.samples
            return [1.0, 0.5] if sample[0].shape[0] == specialized_faster_at else [1.0, 1.0]
    monkeypatch.setattr(measured, "Profiler", Scripted)


@pytest.mark.skipif("cpu" not in backends_under_test(), reason="needs a C compiler")
def test_the_measured_policy_specializes_the_sample_sizes_where_that_measured_faster(monkeypatch):
    """Under the measured policy a symbolic program is timed, at each sample's sizes, against
    its kept candidate specialized at them; calls of a size whose specialized program was
    faster run it, every other size the symbolic program. The profiler is replaced by one
    that reports the specialized program faster only at length 9 (no test times anything)."""
    script_profiler(monkeypatch, specialized_faster_at=9)
    w = torch.randn(16, 8)
    xs = {n: torch.randn(n, 16) for n in (5, 9, 13, 21)}
    options = {"policy": "measured", "steps": ["control flow at L1"], "samples": [(xs[9], w), (xs[13], w)]}
    fast = cocktailer.compile(project, (xs[5], w), backend="cpu", options=options)
    fast.specialize(xs[9], w)   # the second length: a symbolic program, and the sample sizes' trials
    run_all(fast, project, [(x, w) for x in xs.values()])
    served = {n: fast.specialize(x, w) for n, x in xs.items()}
    assert [str(p) for p in served[9].main.params[0].type.shape] == ["9", "16"]   # specialized: faster
    assert [bool(served[n].sizes) for n in (13, 21)] == [True, True]               # not faster: symbolic
    assert not served[5].sizes   # the first call's static program, compiled before any size varied
    text = cocktailer.explain(fast, (xs[21], w), file=None)
    assert "| s0 = 9 | 1000 | 500 | the specialized program |" in text
    assert "| s0 = 13 | 1000 | 1000 | the symbolic program |" in text


def running_sum(x, w):
    h = torch.zeros(w.shape[1])
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w + h)
    return h


@pytest.mark.skipif("cpu" not in backends_under_test(), reason="needs a C compiler")
def test_measured_candidates_that_need_sizes_as_numbers_are_left_out_not_the_symbolic_program(monkeypatch):
    """A candidate that needs a size as a number (here: every host-level one, made to) fails
    for a symbolic program, and the search goes on with the others instead of specializing
    the whole program."""
    from cocktailer.backend import driver
    from cocktailer.ir import SymbolicSizeError

    def needs_numbers(program, config, record):
        raise SymbolicSizeError(program.sizes[0][0], "this candidate")
    monkeypatch.setattr(driver, "build_host", needs_numbers)
    script_profiler(monkeypatch)
    w = torch.randn(4, 4) * 0.5
    options = {"policy": "measured", "steps": ["host level", "control flow at L1"]}
    fast = cocktailer.compile(running_sum, backend="cpu", dynamic=True, options=options)
    run_all(fast, running_sum, [(x, w) for (x,) in lengths(6, 3)])
    assert len(fast.cache) == 1 and length_is_symbolic(fast)
    (_, tuned), = fast.cache.values()
    host, l1 = tuned.trials[:2]
    assert host.step == "host level" and host.error.startswith("needs sizes as numbers") and l1.kept


class LSTMTagger(torch.nn.Module):
    """The tagger of PyTorch's sequence-models tutorial, as written there: `len(sentence)` in
    views around an nn.LSTM over one sentence."""

    def __init__(self, embedding_dim=6, hidden_dim=6, vocab_size=20, tagset_size=3):
        super().__init__()
        self.word_embeddings = torch.nn.Embedding(vocab_size, embedding_dim)
        self.lstm = torch.nn.LSTM(embedding_dim, hidden_dim)
        self.hidden2tag = torch.nn.Linear(hidden_dim, tagset_size)

    def forward(self, sentence):
        embeds = self.word_embeddings(sentence)
        lstm_out, _ = self.lstm(embeds.view(len(sentence), 1, -1))
        tag_space = self.hidden2tag(lstm_out.view(len(sentence), -1))
        return torch.nn.functional.log_softmax(tag_space, dim=1)


@pytest.mark.parametrize("backend", backends_under_test())
def test_the_tutorial_tagger_runs_every_sentence_length_on_one_program(backend):
    """An embedding's rows, `len(x)` and views that keep the length one dim take it symbolic."""
    m = model(lambda _: LSTMTagger())
    fast = cocktailer.compile(m, backend=backend, dynamic=True)
    run_all(fast, m, [(torch.randint(0, 20, (n,), generator=torch.Generator().manual_seed(n)),) for n in (3, 7, 2, 12)])
    assert len(fast.cache) == 1 and length_is_symbolic(fast)


def views_of_a_sequence(x, h):
    y = x.unsqueeze(1)                          # [n, 1, 4]
    z = (y.expand(-1, 3, -1) * h).sum(1)        # [n, 4]
    w = z.view(z.shape[0], 2, 2).flatten(1)     # [n, 2, 2] -> [n, 4]
    return w.tanh(), x.reshape(len(x), 2, 2), y.squeeze(1) + 1   # the second: a view of the argument


def a_size_computed_by_a_reshape(x):
    return x.reshape(-1).softmax(0)             # n * 4 elements: a size of its own


def written_through_views(x):
    y = x.view(len(x), 2, 2)
    y.mul_(2)
    z = x.unsqueeze(0)
    z += 1
    return y.sum(1), z   # z: a view of the argument


@pytest.mark.parametrize("backend", backends_under_test())
def test_writes_through_views_of_a_symbolic_size_reach_the_argument(backend):
    fast = cocktailer.compile(written_through_views, backend=backend, dynamic=True)
    for (x,) in lengths(3, 6, 4):
        compiled_x, eager_x = x.clone(), x.clone()
        with torch.no_grad():
            got, want = fast(compiled_x), written_through_views(eager_x)
        assert_same(got, want, 1e-5, 1e-6)
        got[1].add_(5)   # the returned view still shares the argument's memory
        want[1].add_(5)
        assert_same(compiled_x, eager_x, 1e-5, 1e-6)
    assert len(fast.cache) == 1 and length_is_symbolic(fast)


@pytest.mark.parametrize("backend", backends_under_test())
def test_views_that_keep_a_symbolic_size_one_dim_keep_it_symbolic(backend):
    """unsqueeze, squeeze, expand, flatten, and view/reshape to `x.shape[0]`/`len(x)`: one
    program; a reshape that merges the size with another dim needs it as a number."""
    h = torch.randn(3, 1)
    fast = cocktailer.compile(views_of_a_sequence, backend=backend, dynamic=True)
    run_all(fast, views_of_a_sequence, [(x, h) for (x,) in lengths(5, 2, 9)])
    assert len(fast.cache) == 1 and length_is_symbolic(fast)
    merged = cocktailer.compile(a_size_computed_by_a_reshape, backend=backend, dynamic=True)
    run_all(merged, a_size_computed_by_a_reshape, lengths(5, 2, 9))
    assert len(merged.cache) == 3 and not symbolic_programs(merged)


def pooled_classifier(x, w):
    h = torch.nn.functional.layer_norm(x, (8,))
    a, b = h.chunk(2, 1)                           # along the features
    g = torch.stack([a.tanh(), b.sigmoid()])       # [2, n, 4]
    pooled, where = g.max(1)                       # over time
    scores = (x.to(torch.float64) @ w.double()).float().contiguous()
    return pooled, where, scores.argmax(1), x.norm(dim=1), scores.clone().min(0)[0]


@pytest.mark.parametrize("backend", backends_under_test())
def test_normalization_pooling_over_time_and_casts_take_the_length_symbolic(backend):
    w = torch.randn(8, 3, generator=torch.Generator().manual_seed(3))
    fast = cocktailer.compile(pooled_classifier, backend=backend, dynamic=True)
    run_all(fast, pooled_classifier, [(x, w) for (x,) in lengths(5, 2, 9, width=8)])
    assert len(fast.cache) == 1 and length_is_symbolic(fast)


def batch_first_attention(x):
    q = x.T.unsqueeze(0).transpose(1, 2)       # [1, n, 8]: an unsqueeze of a transposed layout
    scores = (q @ q.transpose(1, 2)).softmax(-1)   # a batched product of [1, n, 8] and [1, 8, n]
    return (scores @ q).squeeze(0)


@pytest.mark.parametrize("backend", backends_under_test())
def test_batched_products_of_a_symbolic_length_keep_it_symbolic(backend):
    fast = cocktailer.compile(batch_first_attention, backend=backend, dynamic=True)
    run_all(fast, batch_first_attention, lengths(5, 2, 9, width=8))
    assert len(fast.cache) == 1 and length_is_symbolic(fast)


def per_item_products(mats, vecs, w):
    """A batch of n matrices, each times its own vector and a shared matrix times each: products
    whose batch dim is the symbolic n on both sides, or on B's alone."""
    own = (mats @ vecs.unsqueeze(2)).squeeze(2)        # [n, 8, 8] @ [n, 8, 1]
    return own, w @ mats                                # [8, 8] @ [n, 8, 8]


@pytest.mark.parametrize("backend", backends_under_test())
def test_products_batched_over_a_symbolic_count_keep_it_symbolic(backend):
    fast = cocktailer.compile(per_item_products, backend=backend, dynamic=True)
    w = torch.randn(8, 8)
    for n in (5, 2, 9):
        args = (torch.randn(n, 8, 8), torch.randn(n, 8), w)
        for got, want in zip(fast(*args), per_item_products(*args)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert len(fast.cache) == 1


class Halving(torch.nn.Module):
    """Recursion whose frames hold values of the sequence's length ([n, 4], then [n] scores)."""

    def forward(self, x, depth):
        return self.rec(x, depth)

    def rec(self, x, depth):
        if depth <= 0:
            return x.sum(0)
        y = torch.tanh(x * 0.5)
        scores = (y @ y.sum(0)).softmax(0)
        return self.rec(y, depth - 1) + 0.5 * self.rec(x * scores.unsqueeze(1), depth - 1)


NATIVE_WORKERS = [{"workers": 1}, {"workers": 2}, {"workers": 2, "fan_out": True}]


@pytest.mark.parametrize("backend, options", [("reference", None)] +
                         [(b, o) for b in backends_under_test() if b != "reference" for o in NATIVE_WORKERS] +
                         ([("host", {"native_from": 0, "workers": 2})] if "cpu" in backends_under_test() else []))
def test_values_of_a_symbolic_size_in_recursive_frames_are_sized_at_call_time(backend, options):
    """Each frame's fixed part, then the values of symbolic sizes; the stack is the call's
    frame size apart (and grows for a longer sequence); with fan-out, one stack per group.
    Two workers share the frames: writing a frame's value and reading it are ordered by
    barriers as for any frame value (a length repeated reads a stack holding the last call's
    values, where a missing barrier shows)."""
    m = Halving().eval()
    fast = cocktailer.compile(m, backend=backend, dynamic=True, options=options)
    run_all(fast, m, [(x, torch.tensor(3)) for (x,) in lengths(5, 2, 40, 9, 9, 5)])
    assert len(fast.cache) == 1 and length_is_symbolic(fast)


@pytest.mark.skipif("cpu" not in backends_under_test(), reason="needs a C compiler")
@pytest.mark.parametrize("options", [{}, {"native_from": 0}])
def test_the_host_backends_blocks_take_the_sizes_their_inputs_have(options):
    """Each native block reads a symbolic size off the first of its inputs that has it."""
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(2)) * 0.5
    for m, calls in [(running_sum, [(x, w) for (x,) in lengths(6, 3, 6, 11)]),
                     (model(lambda _: LSTMTagger()), [(torch.randint(0, 20, (n,)),) for n in (4, 9, 4)])]:
        fast = cocktailer.compile(m, backend="host", dynamic=True, options=options)
        run_all(fast, m, calls)
        assert len(fast.cache) == 1 and length_is_symbolic(fast)
