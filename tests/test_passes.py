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
