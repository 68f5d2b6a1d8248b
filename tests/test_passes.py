"""Passes: constant folding (and that it never serves stale weights)."""
import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer.ir import Op
from utils import assert_matches_eager

try:
    from tests.utils import backends_under_test
except ImportError:
    from utils import backends_under_test


class RNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.rec = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8).eval()

    def forward(self, x, h):
        for t in range(x.shape[0]):
            h = torch.tanh(self.lin(x[t]) + self.rec(h))
        return self.bn(h)


def test_weight_transposes_and_bn_scales_are_folded_out_of_the_loop():
    torch.manual_seed(0)
    model = RNN().eval()
    prog = cocktailer.capture(model, (torch.randn(3, 2, 4), torch.zeros(2, 8)))
    kinds = [op.op for op in prog.walk()]
    assert Op.PERMUTE not in kinds and Op.RSQRT not in kinds
    assert any(name.startswith("permute(lin.weight") for name in prog.constants)


def test_weights_changed_in_place_after_compiling_are_used():
    torch.manual_seed(0)
    model = RNN().eval()
    x, h = torch.randn(3, 2, 4), torch.zeros(2, 8)
    for backend in backends_under_test():
        fast = cocktailer.compile(model, (x, h), backend=backend)
        with torch.no_grad():
            before = fast(x, h)
            model.rec.weight.mul_(-0.5)             # an in-place update, as load_state_dict does
            model.bn.running_var.add_(3.0)
            after, expected = fast(x, h), model(x, h)
            model.rec.weight.div_(-0.5)
            model.bn.running_var.sub_(3.0)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, expected, rtol=1e-4, atol=1e-5)


class Decoder(nn.Module):
    """The same projection in a loop that may stop early: hoisting it would compute rows for
    steps that never run."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 8)

    def forward(self, x, h):
        t = 0
        while t < x.shape[0] and h.sum() < 100:
            h = torch.tanh(self.lin(x[t]) + h)
            t += 1
        return h


def _loop_body(program):
    (loop,) = [op for op in program.walk() if op.op is Op.LOOP]
    return loop.loop_body


def test_input_projection_is_hoisted_out_of_a_loop_over_every_step():
    from cocktailer.passes.hoist import hoist_invariant_matmuls
    from cocktailer.reference import ReferenceExecutor
    torch.manual_seed(0)
    x, h = torch.randn(5, 2, 4), torch.zeros(2, 8)
    program = cocktailer.capture(RNN().eval(), (x, h))
    expected = ReferenceExecutor(program)([x, h])
    assert sum(op.op is Op.MATMUL for op in _loop_body(program).ops) == 2
    program = hoist_invariant_matmuls(program.clone())
    cocktailer.verify(program)
    assert sum(op.op is Op.MATMUL for op in _loop_body(program).ops) == 1   # only the recurrent one is left
    hoisted = [op for op in program.main.body.ops if op.op is Op.MATMUL]
    assert len(hoisted) == 1 and hoisted[0].results[0].type.shape == (5, 2, 8)
    torch.testing.assert_close(ReferenceExecutor(program)([x, h]), expected)


class BackwardRowRNN(nn.Module):
    """A step's vector read backwards (`x[-1 - t]`) and made a (1, K) row, as a hand-written
    GRU cell over one sentence does: the projection is hoisted all the same."""

    def __init__(self):
        super().__init__()
        self.inp, self.rec = nn.Linear(4, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.zeros(8)
        for t in range(x.shape[0]):
            h = torch.tanh(self.inp(x[-1 - t].view(1, 4)) + self.rec(h.view(1, 8))).view(8)
        return h


def test_a_projection_read_backwards_as_a_row_is_hoisted():
    from cocktailer.passes.hoist import hoist_invariant_matmuls
    from cocktailer.reference import ReferenceExecutor
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    program = cocktailer.capture(BackwardRowRNN().eval(), (x,))
    expected = ReferenceExecutor(program)([x])
    program = hoist_invariant_matmuls(program.clone())
    cocktailer.verify(program)
    assert sum(op.op is Op.MATMUL for op in _loop_body(program).ops) == 1   # only the recurrent one is left
    hoisted = [op for op in program.main.body.ops if op.op is Op.MATMUL]
    assert len(hoisted) == 1 and hoisted[0].results[0].type.shape == (6, 8)
    torch.testing.assert_close(ReferenceExecutor(program)([x]), expected)
    for backend in backends_under_test():
        model = BackwardRowRNN().eval()
        fast = cocktailer.compile(model, backend=backend)
        for n in (1, 6, 9):
            x = torch.randn(n, 4)
            with torch.no_grad():
                torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)


def test_projection_stays_in_a_loop_that_may_stop_early():
    from cocktailer.passes.hoist import hoist_invariant_matmuls
    torch.manual_seed(0)
    program = cocktailer.capture(Decoder().eval(), (torch.randn(5, 2, 4), torch.zeros(2, 8)))
    before = [op.op for op in program.walk()]
    assert [op.op for op in hoist_invariant_matmuls(program.clone()).walk()] == before


def test_clone_leaves_the_captured_program_alone():
    from cocktailer.passes.hoist import hoist_invariant_matmuls
    torch.manual_seed(0)
    program = cocktailer.capture(RNN().eval(), (torch.randn(5, 2, 4), torch.zeros(2, 8)))
    text = str(program)
    clone = hoist_invariant_matmuls(program.clone())
    assert str(program) == text and str(clone) != text
    assert clone.constants is program.constants


class Stacked(nn.Module):
    """Three recurrences in one time loop, each reading the one below at the same step."""

    def __init__(self, layers=3):
        super().__init__()
        self.cells = nn.ModuleList(nn.GRUCell(4 if i == 0 else 8, 8) for i in range(layers))

    def forward(self, x):
        h = [x.new_zeros(x.shape[1], 8) for _ in self.cells]
        for t in range(x.shape[0]):
            inp = x[t]
            new = []
            for cell, h_i in zip(self.cells, h):
                inp = cell(inp, h_i)
                new.append(inp)
            h = new
        return h[0], h[-1]


class CrossStep(nn.Module):
    """The second recurrence reads the first one's previous step: it cannot run after it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        h1 = h2 = x.new_zeros(x.shape[1], 8)
        for t in range(x.shape[0]):
            h1, h2 = torch.tanh(self.a(h1) + x[t]), torch.tanh(self.b(h2) + h1)
        return h2


def _cpu_passes(program):
    from cocktailer.backend.cpu import CPU_PIPELINE
    from cocktailer.passes import run_pipeline
    return run_pipeline(program.clone(), CPU_PIPELINE)


def _loops(program):
    return [op for op in program.walk() if op.op is Op.LOOP]


def test_stacked_recurrences_become_one_loop_each_with_their_projection_hoisted():
    from cocktailer.reference import ReferenceExecutor
    torch.manual_seed(0)
    x = torch.randn(6, 2, 4)
    program = cocktailer.capture(Stacked().eval(), (x,))
    assert len(_loops(program)) == 1
    rewritten = _cpu_passes(program)
    loops = _loops(rewritten)
    assert [op.loop_stacked for op in loops] == [1, 1, 0]   # each feeds the next its outputs, stacked
    assert all(sum(o.op is Op.MATMUL for o in op.loop_body.ops) == 1 for op in loops)   # recurrent only
    assert sum(op.op is Op.MATMUL for op in rewritten.main.body.ops) == 3   # input projections, hoisted
    for steps in (0, 1, 6):   # a loop of no step, of one, of several
        xs = torch.randn(steps, 2, 4)
        program = cocktailer.capture(Stacked().eval(), (xs,))
        torch.testing.assert_close(ReferenceExecutor(_cpu_passes(program))([xs]), ReferenceExecutor(program)([xs]))


def test_a_recurrence_reading_another_ones_previous_step_is_not_split():
    torch.manual_seed(0)
    program = cocktailer.capture(CrossStep().eval(), (torch.randn(5, 2, 8),))
    assert len(_loops(_cpu_passes(program))) == 1


def test_distributed_loops_on_the_cpu_backend_match_eager():
    torch.manual_seed(0)
    model = Stacked().eval()
    for backend in backends_under_test():
        for steps in (0, 1, 7):
            x = torch.randn(steps, 3, 4)
            fast = cocktailer.compile(model, (x,), backend=backend)
            with torch.no_grad():
                for got, want in zip(fast(x), model(x)):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class Counted(nn.Module):
    """A loop whose trip count is a tensor (any value, negative too) and whose body uses the step."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, n):
        h = x
        for t in range(n):
            h = torch.tanh(self.lin(h)) + t
        return h


def test_unrolled_loops_keep_every_trip_count():
    from cocktailer.passes.unroll import unroll_loops
    from cocktailer.reference import ReferenceExecutor
    torch.manual_seed(0)
    model, x = Counted().eval(), torch.randn(2, 8)
    program = cocktailer.capture(model, (x, torch.tensor(3)))
    unrolled = unroll_loops(program.clone(), 8)
    cocktailer.verify(unrolled)
    loops = _loops(unrolled)
    assert len(loops) == 2 and sum(op.op is Op.MATMUL for op in loops[0].loop_body.walk()) == 8
    for n in (-2, 0, 1, 7, 8, 9, 17):
        args = [x, torch.tensor(n)]
        torch.testing.assert_close(ReferenceExecutor(unrolled)(args), ReferenceExecutor(program)(args))


def test_unrolled_loops_on_the_cpu_backend_match_eager():
    torch.manual_seed(0)
    model, x = Counted().eval(), torch.randn(2, 8)
    for backend in backends_under_test():
        if backend != "cpu":
            continue
        fast = cocktailer.compile(model, (x, torch.tensor(3)), backend=backend, options={"unroll": 8})
        with torch.no_grad():
            for n in (0, 1, 7, 8, 9, 17):
                torch.testing.assert_close(fast(x, torch.tensor(n)), model(x, n), rtol=1e-4, atol=1e-5)


class Cache(nn.Module):
    """A decoding loop writing one row of a carried cache per step; `stale` also reads the
    cache as it was before the write, so that write must not happen in place."""

    def __init__(self, stale: bool):
        super().__init__()
        self.stale = stale
        self.lin = nn.Linear(8, 8)

    def forward(self, x, cache):
        h = x
        for t in range(cache.shape[0]):
            new = cache.clone()
            new[t] = torch.tanh(self.lin(h))
            h = new.sum(0) + (cache.sum(0) if self.stale else 0)
            cache = new
        return h, cache


def _update_buffers(model, args):
    from cocktailer.schedule.memory import plan_memory
    program = cocktailer.capture(model, args)
    plan = plan_memory(program)
    (update,) = [op for op in program.walk() if op.op is Op.UPDATE]
    return plan.of(update.operands[0]), plan.of(update.results[0])


def test_update_of_a_carried_cache_writes_in_place_unless_the_old_value_is_read_after():
    torch.manual_seed(0)
    args = (torch.randn(8), torch.zeros(4, 8))
    source, result = _update_buffers(Cache(stale=False).eval(), args)
    assert source == result
    source, result = _update_buffers(Cache(stale=True).eval(), args)
    assert source != result
    for stale in (False, True):
        model = Cache(stale).eval()
        for backend in backends_under_test():
            fast = cocktailer.compile(model, args, backend=backend)
            with torch.no_grad():
                for got, want in zip(fast(*args), model(*args)):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_results_are_computed_in_the_callers_output_buffers():
    """The entry's results made by its top-level ops are written where the caller wants them
    (no copy from the arena at the end); a loop's results stay in its carried buffers."""
    from cocktailer.schedule.memory import plan_memory

    def f(x, y):
        a = torch.tanh(x) + y
        for _ in range(3):
            y = y * 0.5 + a
        return a, x * 2, a, y
    args = (torch.randn(5, 3), torch.randn(5, 3))
    program = cocktailer.capture(f, args)
    plan = plan_memory(program)
    spaces = [(plan.of(v).space, plan.of(v).offset) for v in program.functions[program.entry].body.yields]
    assert spaces[:2] == [("output", 0), ("output", 1)] and spaces[2][0] != "output"
    for backend in backends_under_test():
        fast = cocktailer.compile(f, args, backend=backend)
        for got, want in zip(fast(*args), f(*args)):
            torch.testing.assert_close(got, want)


def nested_loops_each_with_two_recurrences(x, data, c):
    for _ in range(3):
        x = torch.tanh(x + 1.0)
        for _ in range(2):         # two recurrences inside a loop with two recurrences
            data = torch.relu(data - 0.5)
            c = torch.tanh(c * 2.0)
    return x, data, c


def test_nested_loops_are_distributed_inside_out():
    """Distributing the outer loop moves the inner one; the inner one is split where it ends
    up (it used to be split afterwards in its old place, renaming its reads in place)."""
    assert_matches_eager(nested_loops_each_with_two_recurrences,
                         [(torch.randn(4), torch.randn(7, 3), torch.randn(()))])


class Nested(nn.Module):
    """An inner recurrence that reads the outer step's input, projected at every inner step."""

    def __init__(self):
        super().__init__()
        self.inp, self.rec = nn.Linear(4, 8), nn.Linear(8, 8)

    def forward(self, x, steps):
        h = torch.zeros(8)
        for i in range(x.shape[0]):
            for _ in range(steps[i]):
                h = torch.tanh(self.inp(x[i]) + self.rec(h))
        return h


def _loops(program) -> list:
    return [op for op in program.walk() if op.op is Op.LOOP]


def test_an_inner_loops_invariant_projection_moves_out_of_it():
    x, steps = torch.randn(5, 4), torch.tensor([3, 0, 2, 4, 1])
    program = cocktailer.capture(Nested().eval(), (x, steps))   # (the capture pipeline moves it)
    outer, inner = _loops(program)
    assert sum(op.op is Op.MATMUL for op in inner.loop_body.ops) == 1   # only the recurrent product is left
    assert sum(op.op is Op.MATMUL for op in outer.loop_body.ops) == 1   # x[i] @ W, once per outer step
    model = Nested().eval()
    for backend in backends_under_test():
        fast = cocktailer.compile(model, backend=backend)
        for n in (1, 5):
            x, steps = torch.randn(n, 4), torch.randint(0, 4, (n,))
            with torch.no_grad():
                torch.testing.assert_close(fast(x, steps), model(x, steps), rtol=1e-4, atol=1e-5)


class MayNotRun(nn.Module):
    """Ops that could raise stay in a loop that may run no iteration: an index the loop does
    not range over, an integer division."""

    def forward(self, x, k, d, n):
        for _ in range(n):
            x = x + x[k] + (k // d)
        return x


def test_an_op_that_may_raise_stays_in_its_loop():
    x = torch.randn(3)
    bad_index, zero = torch.tensor(7), torch.tensor(0)
    program = cocktailer.capture(MayNotRun(), (x, torch.tensor(1), torch.tensor(2), torch.tensor(2)))
    (loop,) = _loops(program)
    kinds = [op.op for op in loop.loop_body.ops]
    assert Op.SELECT in kinds and Op.FLOORDIV in kinds
    for backend in backends_under_test():
        fast = cocktailer.compile(MayNotRun(), backend=backend)
        for args in [(x, bad_index, zero, torch.tensor(0)), (x, torch.tensor(1), torch.tensor(2), torch.tensor(2))]:
            torch.testing.assert_close(fast(*args), MayNotRun()(*args))


class FeedForward(nn.Module):
    """A Linear's bias and GELU, a LayerNorm's scale and shift, gates of a cell: chains of
    elementwise ops between products and reductions."""

    def __init__(self):
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(8, 16), nn.Linear(16, 8), nn.LayerNorm(8)

    def forward(self, x, c):
        h = self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))
        gate = torch.sigmoid(h) * torch.tanh(c * 2 - 1)
        return gate, torch.where(h > 0, h, c), (gate * 3).to(torch.int64) + 1


def test_elementwise_chains_run_as_one_loop_each():
    """The native stages fuse each chain of elementwise ops whose intermediates nothing else
    reads into one FUSED op (the IR the reference runs keeps them apart); the answers, over
    float and integer results, casts and selects, are eager's."""
    from cocktailer.backend.native import _fusable
    from cocktailer.passes.fuse import fuse_elementwise
    args = [(torch.randn(5, 8), torch.randn(5, 8)), (torch.randn(5, 8) * 3, torch.randn(5, 8))]
    fast = assert_matches_eager(FeedForward(), args, backend="cpu")
    (_, compiled), = fast.cache.values()
    fused = [op for part in compiled.record.parts for op in part.program.walk() if op.op is Op.FUSED]
    assert len(fused) >= 4 and max(len(op.attrs["steps"]) for op in fused) >= 4
    assert not any(op.op is Op.FUSED for op in cocktailer.capture(FeedForward(), args[0]).walk())
    # an intermediate that two ops read is computed once, not fused into both
    def shared(x):
        e = torch.exp(x)
        return e + 1, e * 2
    program = fuse_elementwise(cocktailer.capture(shared, (torch.randn(3),)).clone(), _fusable)
    assert sum(op.op is Op.EXP for op in program.walk()) == 1
    # a constant made between two ops of a chain (the -inf of a masked softmax, in the batched
    # executor's blocks) does not split it
    def masked_scores(s, keep):
        return torch.softmax(torch.where(keep, s / 8, float("-inf")), -1)
    program = cocktailer.capture(masked_scores, (torch.randn(3, 5), torch.rand(5) > 0.5)).clone()
    body = program.functions["main"].body
    minus_inf, = [op for op in body.ops if op.op is Op.SCALAR and op.attrs["value"] == float("-inf")]
    body.ops.remove(minus_inf)
    body.ops.insert([op.op for op in body.ops].index(Op.WHERE), minus_inf)   # after the DIV
    fused, = [op for op in fuse_elementwise(program, _fusable).walk() if op.op is Op.FUSED]
    assert [step[0] for step in fused.attrs["steps"]] == ["DIV", "WHERE"]


def test_a_long_elementwise_chain_is_fused_in_pieces_of_at_most_max_steps():
    """A chain of 150 flag ORs (capture's aliasing makes such chains) is fused into several
    FUSED ops of at most MAX_STEPS steps each, not one: its element is one nested C
    expression, and g++ parsing the CUDA dialect's 180 nested casts of one took over 20 GB
    (fuzz seed 7274259). The answer is eager's on every backend, the virtual GPU's among them."""
    from cocktailer.backend.native import _fusable
    from cocktailer.passes.fuse import MAX_STEPS, fuse_elementwise

    lines = ["def any_of(flags):", "    found = flags[0] > 0"] + [f"    found = found | (flags[{k}] > 0)"
                                                             for k in range(1, 150)] + ["    return found"]
    scope: dict = {}
    exec(compile("\n".join(lines), "<chain>", "exec"), scope)   # written out: a Python loop would stay a loop
    any_of = scope["any_of"]
    args = [(torch.randn(150, 4),), (-torch.ones(150, 4),)]
    program = fuse_elementwise(cocktailer.capture(any_of, args[0]).clone(), _fusable)
    fused = [op for op in program.walk() if op.op is Op.FUSED]
    assert len(fused) >= 3 and max(len(op.attrs["steps"]) for op in fused) <= MAX_STEPS
    assert_matches_eager(any_of, args)   # every backend, the virtual GPU's among them


def test_an_integer_division_keeps_its_zero_check_when_fused_around():
    """An integer division checks its (broadcast) divisor before its loop: it is never fused,
    the ops around it still may be, and a zero divisor fails as in eager."""
    def f(a, b):
        return (a + 1) // (b * 2) + 3
    a = torch.tensor([4, 9, 7])
    fast = assert_matches_eager(f, [(a, torch.tensor([2]))], backend="cpu")
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        f(a, torch.tensor([0]))
    with pytest.raises(cocktailer.CompiledCallError, match="division by zero"):
        fast(a, torch.tensor([0]))


# -- common subexpressions ------------------------------------------------------------------

class Spawn(nn.Module):
    """DRNN's spawn: `ancestral(h)` written twice, one GEMM after capture."""

    def __init__(self):
        super().__init__()
        self.ancestral, self.fraternal = nn.Linear(8, 8), nn.Linear(8, 8, bias=False)

    def forward(self, h):
        first = torch.tanh(self.ancestral(h))
        second = torch.tanh(self.ancestral(h) + self.fraternal(first))
        return first, second


def test_a_repeated_projection_is_computed_once():
    torch.manual_seed(0)
    h = torch.randn(3, 8)
    program = cocktailer.capture(Spawn().eval(), (h,))
    assert sum(op.op is Op.MATMUL for op in program.walk()) == 2
    assert sum(op.op is Op.CONST and op.attrs["name"].startswith("permute(ancestral") for op in program.walk()) == 1
    assert_matches_eager(Spawn(), [(h,), (torch.randn(5, 8),)])


def _twice_in_a_loop(x, w):
    y = x @ w
    for t in range(x.shape[0]):
        y = y + torch.tanh(x @ w)   # the product before the loop, again
    return y


def test_a_loop_body_reuses_a_value_computed_before_the_loop():
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    program = cocktailer.capture(_twice_in_a_loop, (x, w))
    assert sum(op.op is Op.MATMUL for op in program.walk()) == 1
    assert_matches_eager(_twice_in_a_loop, [(x, w), (torch.randn(2, 4), w)])


def _alike_in_both_arms(x):
    y = x * 2
    if x.sum() > 0:
        z = torch.tanh(x * 3)
    else:
        z = torch.sigmoid(x * 3)
    return y, z, torch.exp(x * 3)


def test_an_op_is_not_reused_from_an_arm_that_may_not_have_run():
    x = torch.randn(4)
    program = cocktailer.capture(_alike_in_both_arms, (x,))
    (branch,) = [op for op in program.walk() if op.op is Op.IF]
    assert [sum(op.op is Op.MUL for op in arm.ops) for arm in branch.regions] == [1, 1]
    assert sum(op.op is Op.MUL for op in program.main.body.ops) == 2   # x * 2, and x * 3 after the if
    assert_matches_eager(_alike_in_both_arms, [(x,), (-x.abs(),)])


def _outputs_alike(x):
    a = x + 1
    b = x + 1
    return a, b, (x * 2).view(2, 2), (x * 2).view(4)


@pytest.mark.parametrize("backend", backends_under_test())
def test_outputs_computed_alike_are_distinct_tensors(backend):
    """Eager returns four tensors of their own memory: a write into one reaches no other."""
    x = torch.randn(4)
    fast = cocktailer.compile(_outputs_alike, backend=backend)
    with torch.no_grad():
        outs = fast(x)
    assert len({o.untyped_storage().data_ptr() for o in outs}) == 4
    outs[0].add_(10)
    outs[2].add_(10)
    torch.testing.assert_close(outs[1], x + 1)
    torch.testing.assert_close(outs[3], x * 2)


def _carried_alike(x, n: int):
    h = x + 1
    g = x + 1   # a loop's initial value may come back as its result
    for _ in range(n):
        g = g * 2
    return h, g


def test_a_loop_initial_value_computed_alike_is_kept():
    x = torch.randn(4)
    for n in (0, 2):
        program = cocktailer.capture(_carried_alike, (x, n))
        assert sum(op.op is Op.ADD for op in program.walk()) == 2
    assert_matches_eager(_carried_alike, [(x, 0)])


def _heads_attention(x, wq, wk, wv):
    n, d = x.shape
    heads = 4
    q, k, v = ((x @ w).view(n, heads, d // heads).transpose(0, 1) for w in (wq, wk, wv))
    scores = torch.softmax(q @ k.transpose(1, 2) / 8.0, -1)
    return (scores @ v).transpose(0, 1).reshape(n, d)


_VIEW_PRODUCTS = {   # (function, argument shapes of two calls: the second at other sizes)
    "attention heads": (_heads_attention, [[(40, 128), (128, 128), (128, 128), (128, 128)],
                                           [(23, 128), (128, 128), (128, 128), (128, 128)]]),
    "B transposed": (lambda a, b: a @ b.t(), [[(33, 64), (40, 64)], [(9, 64), (70, 64)]]),
    "B reshaped": (lambda a, b: a @ b.reshape(32, -1), [[(20, 32), (48, 32)], [(11, 32), (64, 32)]]),
    "A permuted, batched B": (lambda a, b: a.permute(1, 0, 2) @ b, [[(30, 5, 24), (5, 24, 40)], [(17, 5, 24), (5, 24, 33)]]),
    "batch of transposed B": (lambda a, b: a @ b.transpose(1, 2), [[(3, 20, 16), (3, 36, 16)], [(3, 9, 16), (3, 50, 16)]]),
    "A transposed (not read in place)": (lambda a, b: a.t() @ b, [[(24, 30), (24, 40)], [(24, 12), (24, 20)]]),
    "narrow product": (lambda a, b: a @ b.t(), [[(30, 16), (8, 16)], [(12, 16), (8, 16)]]),
    "view read twice": (lambda a, b: (a @ b.t(), b.t() + 1), [[(20, 16), (24, 16)], [(7, 16), (24, 16)]]),
    "A reshaped, one B": (lambda a, b: torch.tanh(a).reshape(a.shape[0], -1) @ b,
                          [[(30, 4, 8), (32, 24)], [(5, 4, 8), (32, 24)]]),
    "A reshaped to 3 dims, one B": (lambda a, b: torch.tanh(a).reshape(a.shape[0], 2, 16) @ b,
                                    [[(30, 4, 8), (16, 24)], [(3, 4, 8), (16, 24)]]),
}


@pytest.mark.parametrize("name", list(_VIEW_PRODUCTS))
def test_products_read_reshapes_and_permutes_of_their_operands_in_place(name):
    """The native stages fold an operand's reshapes and permutes into the product where the
    GEMM can read them at their strides (rows of A, rows or columns of B, any batch strides);
    the answers are eager's, at the sizes compiled for and, dynamic, at others."""
    fn, shapes = _VIEW_PRODUCTS[name]
    torch.manual_seed(0)
    assert_matches_eager(fn, [[torch.randn(s) for s in call] for call in shapes], backend="cpu", atol=1e-4)


def test_products_read_views_in_place_through_mkl_tiles(monkeypatch):
    """The same products with the packed GEMM's tiles in MKL's sgemm_ (what machines without
    AVX-512 run, and the test above checks there): strided A, transposed and batched B."""
    from cocktailer.codegen.kernels import gemm, matmul
    if matmul.blas_tiles() or not gemm.blas_available():
        pytest.skip("this machine's GEMMs take that path already (or there is no sgemm_)")
    monkeypatch.setattr(matmul, "blas_tiles", lambda: True)
    torch.manual_seed(0)
    for fn, shapes in _VIEW_PRODUCTS.values():
        assert_matches_eager(fn, [[torch.randn(s) for s in call] for call in shapes], backend="cpu", atol=1e-4)


def _native_ops(fast) -> list:
    (_, compiled), = fast.cache.values()
    return [op for part in compiled.record.parts for op in part.program.walk()]


def test_attention_reads_its_heads_without_copying_them():
    """q, k and v split into heads (a reshape and a transpose each, k transposed once more):
    the two products read all of q and k in place and the copies go; the output's transpose
    and reshape, which no product reads, stay."""
    args = [torch.randn(40, 128)] + [torch.randn(128, 128) for _ in range(3)]
    fast = cocktailer.compile(_heads_attention, example_inputs=args, backend="cpu")
    fast(*args)
    ops = _native_ops(fast)
    folded = [op for op in ops if op.op is Op.MATMUL and op.attrs.get("views")]
    assert sorted(k for op in folded for k, _, _ in op.attrs["views"]) == [0, 1, 1]
    assert sum(op.op is Op.PERMUTE for op in ops) == 1 and sum(op.op is Op.RESHAPE for op in ops) == 1
    # the captured program, which the reference and explain read, keeps them
    captured = list(cocktailer.capture(_heads_attention, args).walk())
    assert sum(op.op is Op.PERMUTE for op in captured) >= 5


def test_heads_joined_again_are_read_in_place_by_the_projection_after_them():
    """Attention's output, its heads joined again by a reshape, times the output projection's
    weight: a reshape alone leaves the buffer as it lies, so the product reads it in place."""
    def joined(y, w):
        return torch.tanh(y).reshape(y.shape[0], -1) @ w

    args = [torch.randn(40, 4, 32), torch.randn(128, 64)]
    fast = cocktailer.compile(joined, example_inputs=args, backend="cpu")
    fast(*args)
    ops = _native_ops(fast)
    assert not any(op.op is Op.RESHAPE for op in ops)
    (product,) = [op for op in ops if op.op is Op.MATMUL]
    assert [k for k, _, _ in product.attrs["views"]] == [0]


def test_a_view_stays_where_a_write_in_place_could_come_between():
    """A product reads the folded buffer where it runs, not where the view was taken: with an
    UPDATE between the two (native code may write one into its source's buffer), the view is
    kept, whichever buffer the update writes."""
    from cocktailer.codegen.kernels import matmul
    from cocktailer.passes.views import fold_views_into_products

    def updated_between(a, b, c):
        bt = b.t()
        c[0] = 5.0
        return a @ bt, c

    args = (torch.randn(20, 16), torch.randn(24, 16), torch.randn(3, 4))
    program = cocktailer.capture(updated_between, args).clone()
    body = program.functions["main"].body
    update, = [op for op in body.ops if op.op is Op.UPDATE]   # (capture put it first: independent)
    body.ops.remove(update)
    body.ops.insert([op.op for op in body.ops].index(Op.MATMUL), update)
    _, removed = fold_views_into_products(program, matmul.reads_in_place)
    assert removed == 0 and not any(op.attrs.get("views") for op in program.walk() if op.op is Op.MATMUL)
    assert_matches_eager(updated_between, [args], backend="cpu")
