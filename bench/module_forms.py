"""Module forms against their hand-written forms, both compiled by cocktailer (cpu backend).

    python -m bench.module_forms [--seconds 4] [--out bench/results/module-forms]

nn.LSTM / nn.GRU (2 layers, 64 steps, hidden 256, batch 1) against the same weights in
nn.LSTMCell / nn.GRUCell time loops; nn.MultiheadAttention and F.scaled_dot_product_attention
against the same attention written with matmul and softmax. Each pair is checked against
eager first, then timed in rounds in one process (one call of each per round), on all
workers in every call; the eager module is timed after them, apart. Writes results.json
(machine, versions, commit, raw timings) and table.md with the ratio module form /
hand-written form.
"""
from __future__ import annotations

import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import cocktailer
from bench import machine
from bench.results import write_small_run
from bench.timing import measure, measure_interleaved, on_all_workers, one_shot_budget, one_shot_parser

STEPS, HIDDEN, LAYERS = 64, 256, 2


class CellLoop(nn.Module):
    """What a user writes without nn.LSTM: the cells of each layer in a time loop."""

    def __init__(self, module: nn.RNNBase, cell_type):
        super().__init__()
        self.lstm = isinstance(module, nn.LSTM)
        self.cells = nn.ModuleList()
        for layer in range(module.num_layers):
            cell = cell_type(module.input_size if layer == 0 else module.hidden_size, module.hidden_size)
            for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(cell, name).data.copy_(getattr(module, f"{name}_l{layer}"))
            self.cells.append(cell)

    def forward(self, x):
        steps, batch = x.shape[0], x.shape[1]
        h = [x.new_zeros(batch, c.hidden_size) for c in self.cells]
        c = [x.new_zeros(batch, c.hidden_size) for c in self.cells]
        out = x.new_zeros(steps, batch, self.cells[-1].hidden_size)
        for t in range(steps):
            inp = x[t]
            new_h, new_c = [], []
            for cell, h_i, c_i in zip(self.cells, h, c):
                if self.lstm:
                    h_i, c_i = cell(inp, (h_i, c_i))
                else:
                    h_i = cell(inp, h_i)
                new_h.append(h_i)
                new_c.append(c_i)
                inp = h_i
            h, c = new_h, new_c
            out[t] = inp
        return out


class MatmulAttention(nn.Module):
    """nn.MultiheadAttention's computation (no masks, no weights) written out."""

    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        self.mha, self.heads = mha, mha.num_heads

    def forward(self, x):
        n, batch, embed = x.shape
        q, k, v = F.linear(x, self.mha.in_proj_weight, self.mha.in_proj_bias).chunk(3, -1)
        split = lambda t: t.reshape(n, batch * self.heads, embed // self.heads).transpose(0, 1)  # noqa: E731
        scores = split(q) @ split(k).transpose(1, 2) / math.sqrt(embed // self.heads)
        out = (torch.softmax(scores, -1) @ split(v)).transpose(0, 1).reshape(n, batch, embed)
        return self.mha.out_proj(out)


class Sequence(nn.Module):
    """The output sequence of an nn.LSTM / nn.GRU."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)[0]


class ModuleAttention(nn.Module):
    def __init__(self, mha):
        super().__init__()
        self.mha = mha

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def _matmul_attention(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), -1) @ v


def pairs():
    torch.manual_seed(0)
    x = torch.randn(STEPS, 1, HIDDEN)
    lstm, gru = nn.LSTM(HIDDEN, HIDDEN, LAYERS).eval(), nn.GRU(HIDDEN, HIDDEN, LAYERS).eval()
    mha = nn.MultiheadAttention(HIDDEN, 8).eval()
    q = torch.randn(1, 8, STEPS, HIDDEN // 8)
    return {
        "nn.LSTM": (Sequence(lstm), CellLoop(lstm, nn.LSTMCell).eval(), (x,)),
        "nn.GRU": (Sequence(gru), CellLoop(gru, nn.GRUCell).eval(), (x,)),
        "nn.MultiheadAttention": (ModuleAttention(mha), MatmulAttention(mha), (x,)),
        "scaled_dot_product_attention": (_sdpa, _matmul_attention, (q, q, q)),
    }


def main(argv=None):
    args = one_shot_parser(__doc__, 4.0, "bench/results/module-forms").parse_args(argv)
    torch.set_grad_enabled(False)
    budget = one_shot_budget(args.seconds)
    rows = {}
    for name, (module_form, hand_form, inputs) in pairs().items():
        expected = hand_form(*inputs)
        compiled = [cocktailer.compile(f, inputs, backend="cpu") for f in (module_form, hand_form)]
        for fast in compiled:
            torch.testing.assert_close(fast(*inputs), expected, rtol=1e-3, atol=1e-4)
            on_all_workers(fast)
        times = measure_interleaved([lambda f=f: f(*inputs) for f in compiled], budget)
        # eager apart: its OpenMP threads spin after each call and would slow whichever ran next
        times.append(measure(lambda: module_form(*inputs), budget))
        medians = [statistics.median(t) for t in times]
        rows[name] = {"module_s": times[0], "hand_written_s": times[1], "eager_module_s": times[2],
                      "ratio": medians[0] / medians[1], "medians_s": medians}
        print(f"{name}: module {medians[0] * 1e3:.3g} ms, hand-written {medians[1] * 1e3:.3g} ms, "
              f"eager module {medians[2] * 1e3:.3g} ms", file=sys.stderr, flush=True)
    data = {"machine": machine.describe(), "shape": {"steps": STEPS, "hidden": HIDDEN, "layers": LAYERS},
            "pairs": rows}
    write_small_run(args.out, data, table(data))


def table(data: dict) -> str:
    lines = ["# Module forms against hand-written forms, both compiled (cpu backend), batch 1", "",
             machine.summary(data["machine"]),
             f"- {data['shape']['layers']} layers, {data['shape']['steps']} steps, hidden {data['shape']['hidden']}; "
             "medians in ms, timed in rounds in one process; ratio = module / hand-written", "",
             "| pair | module form ms | hand-written ms | ratio | eager module ms |", "|---|---|---|---|---|"]
    for name, r in data["pairs"].items():
        module, hand, eager = (s * 1e3 for s in r["medians_s"])
        lines.append(f"| {name} | {module:.3g} | {hand:.3g} | {r['ratio']:.3f} | {eager:.3g} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
