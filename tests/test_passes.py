"""Passes: constant folding (and that it never serves stale weights)."""
import torch
import torch.nn as nn

import cocktailer
from cocktailer.ir import Op

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
