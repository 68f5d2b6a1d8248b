"""Auto-regressive attention with a KV cache (Cocktailer, Table 1: 12 heads x 64, length 64).

The prompt's keys and values are projected in one batch (prefill); then a loop continues the
sequence one position at a time: the newest vector is projected to q/k/v, its k and v are
written in place into caches preallocated for the whole length (`k[:, :, i, :] = ...`), it
attends to every cached position up to its own, and the result is the next vector. The caches
have the paper's input shape (batch, heads, length, head_dim) = (BS, 12, 64, 64).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from cocktailer.models.workload import Workload, build, generator, resolve_config


class CachedSelfAttention(nn.Module):
    def __init__(self, heads: int, head_dim: int, max_len: int):
        super().__init__()
        self.heads, self.head_dim, self.max_len = heads, head_dim, max_len
        d = heads * head_dim
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, prompt):
        """prompt: (batch, prompt_len, d). Returns the whole sequence (batch, max_len, d):
        the prompt followed by max_len - prompt_len generated vectors."""
        batch, prompt_len, d = prompt.shape
        heads, head_dim, max_len = self.heads, self.head_dim, self.max_len
        k = prompt.new_zeros(batch, heads, max_len, head_dim)
        v = prompt.new_zeros(batch, heads, max_len, head_dim)
        seq = prompt.new_zeros(batch, max_len, d)
        seq[:, :prompt_len] = prompt
        # prefill: every prompt position except the last, whose k/v the first step writes
        before = prompt[:, : prompt_len - 1]
        k[:, :, : prompt_len - 1] = self.key(before).view(batch, prompt_len - 1, heads, head_dim).transpose(1, 2)
        v[:, :, : prompt_len - 1] = self.value(before).view(batch, prompt_len - 1, heads, head_dim).transpose(1, 2)
        positions = torch.arange(max_len)
        x = prompt[:, prompt_len - 1]
        for i in range(prompt_len - 1, max_len - 1):
            q = self.query(x).view(batch, heads, 1, head_dim)
            k[:, :, i, :] = self.key(x).view(batch, heads, head_dim)
            v[:, :, i, :] = self.value(x).view(batch, heads, head_dim)
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_dim)
            scores = scores.masked_fill(positions > i, float("-inf"))
            attended = torch.matmul(torch.softmax(scores, dim=-1), v).reshape(batch, d)
            x = self.norm(x + self.out(attended))
            seq[:, i + 1] = x
        return seq


ATTENTION_CONFIG = {
    "paper": {"heads": 12, "head_dim": 64, "prompt_len": 32, "max_len": 64},
    "small": {"heads": 2, "head_dim": 4, "prompt_len": 3, "max_len": 7},
}


def attention(batch: int, size: str, seed: int, **overrides) -> Workload:
    cfg = resolve_config("attention", size, ATTENTION_CONFIG, overrides)
    if not 1 <= cfg["prompt_len"] < cfg["max_len"]:
        raise ValueError(f"attention: need 1 <= prompt_len < max_len, got {cfg['prompt_len']}, {cfg['max_len']}")
    cfg["hidden"] = cfg["heads"] * cfg["head_dim"]
    cfg["decode_steps"] = cfg["max_len"] - cfg["prompt_len"]
    model = build(lambda: CachedSelfAttention(cfg["heads"], cfg["head_dim"], cfg["max_len"]), seed)
    prompt = torch.randn(batch, cfg["prompt_len"], cfg["hidden"], generator=generator(seed))
    return Workload("attention", model, (prompt,), batch, cfg, batches=True)
