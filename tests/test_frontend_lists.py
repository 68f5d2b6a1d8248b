"""Python lists of tensors updated in place inside compiled loops and branches."""
import torch
import torch.nn as nn

import cocktailer


class StackedLSTM(nn.Module):
    """The natural way to write a stacked LSTM: per-layer states in lists, `h[i] = ...`."""

    def __init__(self, layers=2, hidden=4):
        super().__init__()
        self.cells = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))

    def forward(self, x):
        h = [x.new_zeros(x.shape[1], 4) for _ in self.cells]
        c = [x.new_zeros(x.shape[1], 4) for _ in self.cells]
        for t in range(x.shape[0]):
            inp = x[t]
            for i, cell in enumerate(self.cells):
                h[i], c[i] = cell(inp, (h[i], c[i]))
                inp = h[i]
        return h[-1]


def test_list_updated_in_place_is_carried_by_a_loop_not_unrolled():
    torch.manual_seed(0)
    model = StackedLSTM().eval()
    texts = []
    for steps in (3, 9):
        x = torch.randn(steps, 2, 4)
        texts.append(str(cocktailer.capture(model, (x,))))
        with torch.no_grad():
            torch.testing.assert_close(cocktailer.compile(model, (x,))(x), model(x))
    assert all(t.count("= loop") == 1 for t in texts)
    assert len(texts[0].splitlines()) == len(texts[1].splitlines())


def test_list_written_in_one_branch_only():
    def f(x):
        acc = [x, x * 2]
        if x.sum() > 0:
            acc[0] = x + 100
        return acc[0] + acc[1]
    fast = cocktailer.compile(f, (torch.ones(3),))
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(fast(x), f(x))


def test_tensor_written_in_a_loop_inside_a_helper_is_seen_by_the_caller():
    """`buf[i] = ...` in a loop must write the caller's tensor, not rebind a local copy."""
    def fill(buf, x):
        for i in range(x.shape[0]):
            buf[i] = x[i] * 2

    def f(x):
        buf = torch.zeros_like(x)
        alias = buf
        fill(buf, x)
        return alias + 1

    x = torch.randn(5, 3)
    for backend in ("reference", "cpu"):
        fast = cocktailer.compile(f, (x,), backend=backend)
        torch.testing.assert_close(fast(x), f(x))
