"""Seq2seq greedy LSTM decoder (Cocktailer, Table 1: hidden 256, vocabulary 3797, max length 50).

A `while` loop emits one token per step (argmax of the logits, fed back as the next input,
written into a preallocated output) until every sequence has emitted EOS or the maximum
length is reached: the trip count is decided by the data, at run time.

With random weights the EOS decision would be arbitrary, so the input generator steers it,
the way a logits processor forces or forbids EOS: the decoder adds `eos_bias[t]` to the EOS
logit at step t. The generator draws a target length per sequence (log-normal, mean about 10
tokens as in the paper's data, clipped to [1, max_len]) and sets the bias to -1e4 before that
step and +1e4 from it on, so sequence b emits EOS first at step target_lengths[b] - 1.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from cocktailer.models.workload import Workload, build, generator, resolve_config

EOS_FORCE = 1e4   # far beyond any logit of the (bounded) LSTM output through the projection


class GreedyDecoder(nn.Module):
    def __init__(self, vocab: int, hidden: int, max_len: int, sos: int = 1, eos: int = 2, pad: int = 0):
        super().__init__()
        self.max_len, self.sos, self.eos, self.pad = max_len, sos, eos, pad
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.LSTMCell(hidden, hidden)
        self.proj = nn.Linear(hidden, vocab)
        self.register_buffer("eos_onehot", nn.functional.one_hot(torch.tensor(eos), vocab).float())

    def forward(self, h, c, eos_bias):
        """h, c: (batch, hidden) encoder state; eos_bias: (max_len, batch) added to the EOS logit.
        Returns the tokens (batch, max_len), `pad` after the last step run."""
        batch = h.shape[0]
        out = torch.full((batch, self.max_len), self.pad, dtype=torch.long)
        tok = torch.full((batch,), self.sos, dtype=torch.long)
        done = torch.zeros(batch, dtype=torch.bool)
        t = 0
        while t < self.max_len:
            h, c = self.cell(self.embed(tok), (h, c))
            logits = self.proj(h) + eos_bias[t].unsqueeze(1) * self.eos_onehot
            tok = logits.argmax(-1)
            out[:, t] = tok
            done = done | (tok == self.eos)
            t += 1
            if done.all():
                break
        return out


SEQ2SEQ_CONFIG = {
    "paper": {"hidden": 256, "vocab": 3797, "max_len": 50, "mean_length": 10.0, "length_sigma": 0.5},
    "small": {"hidden": 8, "vocab": 16, "max_len": 8, "mean_length": 4.0, "length_sigma": 0.5},
    # target_length: the same length for every sequence (the paper's overhead analysis uses 10);
    # target_lengths: one per sequence.
    "extra": {"target_length": None, "target_lengths": None},
}


def target_lengths(batch: int, mean: float, sigma: float, max_len: int, seed: int) -> list[int]:
    """Per-sequence lengths (EOS included), log-normal with the given mean, clipped to [1, max_len]."""
    mu = math.log(mean) - sigma * sigma / 2   # E[exp(mu + sigma z)] = mean
    z = torch.randn(batch, generator=generator(seed), dtype=torch.float64)
    return torch.exp(mu + sigma * z).round().clamp(1, max_len).long().tolist()


def eos_bias_for(lengths: list[int], max_len: int) -> torch.Tensor:
    """(max_len, batch): -EOS_FORCE before step length - 1, +EOS_FORCE from it on."""
    steps = torch.arange(max_len).unsqueeze(1)
    fire = steps >= torch.tensor(lengths).unsqueeze(0) - 1
    return torch.where(fire, EOS_FORCE, -EOS_FORCE).float()


def seq2seq(batch: int, size: str, seed: int, **overrides) -> Workload:
    cfg = resolve_config("seq2seq", size, SEQ2SEQ_CONFIG, overrides)
    max_len = cfg["max_len"]
    if cfg.get("target_lengths") is not None:
        lengths = [int(n) for n in cfg["target_lengths"]]
        if len(lengths) != batch:
            raise ValueError(f"seq2seq: {len(lengths)} target_lengths for batch {batch}")
    elif cfg.get("target_length") is not None:
        lengths = [int(cfg["target_length"])] * batch
    else:
        lengths = target_lengths(batch, cfg["mean_length"], cfg["length_sigma"], max_len, seed + 1)
    if not all(1 <= n <= max_len for n in lengths):
        raise ValueError(f"seq2seq: target lengths must lie in [1, {max_len}], got {lengths}")
    cfg["target_lengths"] = lengths
    cfg["decode_steps"] = max(lengths)   # trip count of the while loop
    model = build(lambda: GreedyDecoder(cfg["vocab"], cfg["hidden"], max_len), seed)
    g = generator(seed)
    h = torch.randn(batch, cfg["hidden"], generator=g)
    c = torch.randn(batch, cfg["hidden"], generator=g)
    return Workload("seq2seq", model, (h, c, eos_bias_for(lengths, max_len)), batch, cfg, batches=True)
