"""Compiling and calling under `torch.inference_mode()`: folded and packed weights are computed
outside it (they must stay refreshable in place), and weights that are inference tensors
themselves (a model built under inference mode) have no version counter to read."""
import pytest
import torch
import torch.nn as nn

import cocktailer
from cocktailer import models
from utils import assert_same


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_compile_and_call_under_inference_mode(backend):
    w = models.make("blockdrop", batch=1, size="small", seed=0)   # batch norms fold into constants
    with torch.inference_mode():
        fast = cocktailer.compile(w.model.eval(), w.inputs, backend=backend)
        assert_same(fast(*w.inputs), w.model(*w.inputs), rtol=1e-4, atol=1e-5)
    with torch.no_grad():   # the same compiled function outside inference mode
        assert_same(fast(*w.inputs), w.model(*w.inputs), rtol=1e-4, atol=1e-5)


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        if x.sum() > 0:
            return self.lin(x)
        return -self.lin(x)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_weights_written_after_a_compile_under_inference_mode_are_seen(backend):
    model = Affine().eval()
    x = torch.randn(2, 4) + 1
    with torch.inference_mode():
        fast = cocktailer.compile(model, (x,), backend=backend)
        fast(x)
    with torch.no_grad():
        model.lin.weight.mul_(2)   # the folded transpose of the weight is refreshed
        assert_same(fast(x), model(x), rtol=1e-5, atol=1e-6)


def test_a_model_built_under_inference_mode_compiles():
    with torch.inference_mode():
        model = Affine().eval()   # its parameters are inference tensors
        x = torch.randn(2, 4) + 1
        fast = cocktailer.compile(model, (x,), backend="cpu")
        assert_same(fast(x), model(x), rtol=1e-5, atol=1e-6)
