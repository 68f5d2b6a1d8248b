"""Loop models with fixed trip counts: a stacked LSTM and NASRNN (Cocktailer, Table 1).

Inputs are time-major, `(seq_len, batch, features)`, as in the paper's input shapes
("64, BS, 256" and "1000, BS, 256").
"""
from __future__ import annotations

import torch
import torch.nn as nn

from cocktailer.models.workload import Workload, build, generator, resolve_config


class StackedLSTM(nn.Module):
    """`layers` LSTM cells stacked; every time step runs the input up through all layers.

    Two loops, as the paper describes it: over the sequence (a compiled loop) and, inside it,
    over the layers (a Python loop over an nn.ModuleList, unrolled at capture). The per-layer
    states are Python lists rebuilt every step; writing them in place (`h[i], c[i] = cell(...)`)
    makes cocktailer unroll the time loop instead (see the package notes)."""

    def __init__(self, input_size: int, hidden: int, layers: int):
        super().__init__()
        self.hidden = hidden
        self.cells = nn.ModuleList(nn.LSTMCell(input_size if i == 0 else hidden, hidden) for i in range(layers))

    def forward(self, x):
        seq_len, batch, _ = x.shape
        h = [x.new_zeros(batch, self.hidden) for _ in self.cells]
        c = [x.new_zeros(batch, self.hidden) for _ in self.cells]
        for t in range(seq_len):
            inp = x[t]
            new_h, new_c = [], []
            for cell, h_i, c_i in zip(self.cells, h, c):
                h_i, c_i = cell(inp, (h_i, c_i))
                new_h.append(h_i)
                new_c.append(c_i)
                inp = h_i
            h, c = new_h, new_c
        return h[-1]


class NASCell(nn.Module):
    """The recurrent cell found by neural architecture search (Zoph & Le, 2017), in the form
    TensorFlow's NASCell and the Rammer/Cocktailer evaluations use: 8 gates from input and
    hidden projections, a layer of sigmoid/relu/tanh, two combination layers."""

    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.w_input = nn.Linear(input_size, 8 * hidden, bias=False)
        self.w_hidden = nn.Linear(hidden, 8 * hidden, bias=False)

    def forward(self, x, state):
        h, c = state
        xi = self.w_input(x).chunk(8, dim=1)
        hi = self.w_hidden(h).chunk(8, dim=1)
        # first layer: one activation per gate pair
        l1_0 = torch.sigmoid(xi[0] + hi[0])
        l1_1 = torch.relu(xi[1] + hi[1])
        l1_2 = torch.sigmoid(xi[2] + hi[2])
        l1_3 = torch.relu(xi[3] * hi[3])
        l1_4 = torch.tanh(xi[4] + hi[4])
        l1_5 = torch.sigmoid(xi[5] + hi[5])
        l1_6 = torch.tanh(xi[6] + hi[6])
        l1_7 = torch.sigmoid(xi[7] + hi[7])
        # second layer: pairs combined; the cell state enters at the first pair
        l2_0 = torch.tanh(torch.tanh(l1_0 * l1_1) + c)
        l2_1 = torch.tanh(l1_2 + l1_3)
        l2_2 = torch.tanh(l1_4 * l1_5)
        l2_3 = torch.sigmoid(l1_6 + l1_7)
        # third layer: the new cell state and the new output
        new_c = l2_0 * l2_1
        new_h = torch.tanh(new_c * torch.tanh(l2_2 + l2_3))
        return new_h, new_c


class NASRNN(nn.Module):
    """One NASCell run over the sequence."""

    def __init__(self, input_size: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.cell = NASCell(input_size, hidden)

    def forward(self, x):
        seq_len, batch, _ = x.shape
        h = x.new_zeros(batch, self.hidden)
        c = x.new_zeros(batch, self.hidden)
        for t in range(seq_len):
            h, c = self.cell(x[t], (h, c))
        return h


LSTM_CONFIG = {
    "paper": {"layers": 10, "hidden": 256, "input_size": 256, "seq_len": 64},
    "small": {"layers": 2, "hidden": 8, "input_size": 8, "seq_len": 5},
}
NASRNN_CONFIG = {
    "paper": {"hidden": 256, "input_size": 256, "seq_len": 1000},
    "small": {"hidden": 8, "input_size": 8, "seq_len": 6},
}


def lstm(batch: int, size: str, seed: int, **overrides) -> Workload:
    cfg = resolve_config("lstm", size, LSTM_CONFIG, overrides)
    model = build(lambda: StackedLSTM(cfg["input_size"], cfg["hidden"], cfg["layers"]), seed)
    x = torch.randn(cfg["seq_len"], batch, cfg["input_size"], generator=generator(seed))
    return Workload("lstm", model, (x,), batch, cfg, batches=True)


def nasrnn(batch: int, size: str, seed: int, **overrides) -> Workload:
    cfg = resolve_config("nasrnn", size, NASRNN_CONFIG, overrides)
    model = build(lambda: NASRNN(cfg["input_size"], cfg["hidden"]), seed)
    x = torch.randn(cfg["seq_len"], batch, cfg["input_size"], generator=generator(seed))
    return Workload("nasrnn", model, (x,), batch, cfg, batches=True)
