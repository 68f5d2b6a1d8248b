"""Real-style programs, one per common program shape, written as their authors would: a
greedy decoder, beam search, GPT-style generation with a key/value cache, a Mixture-of-Experts
layer with top-k routing, an adaptive-step ODE integrator, an early-exit classifier, a
gated ResNet and a child-sum TreeLSTM over node objects. tests/test_corpus.py compares each with eager; `python -m bench.corpus` times
them. `CORPUS` maps a name to (model class, example inputs by seed)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN = 12, 16


class GreedyDecoder(nn.Module):
    """A GRU decoder that feeds back its argmax token until EOS or a length limit; the
    vocabulary lookup (token ids -> words) stays outside, in Python."""

    def __init__(self, eos=1, max_len=10):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.cell = nn.GRUCell(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, VOCAB)
        self.eos, self.max_len = eos, max_len

    def forward(self, h):
        token = torch.zeros(1, dtype=torch.long)
        tokens = torch.full((self.max_len,), -1, dtype=torch.long)
        length = torch.zeros((), dtype=torch.long)
        while length < self.max_len:
            h = self.cell(self.embed(token), h)
            token = self.out(h).argmax(-1)
            tokens[length] = token[0]
            length += 1
            if token[0] == self.eos:
                break
        return tokens, length


class BeamSearch(nn.Module):
    """Beam search over a GRU decoder: each step keeps the `beams` best continuations of all
    beams (topk over beams x vocabulary), reorders the states by their parent beam, and
    stops when every beam has emitted EOS."""

    def __init__(self, beams=3, eos=1, max_len=6):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.cell = nn.GRUCell(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, VOCAB)
        self.beams, self.eos, self.max_len = beams, eos, max_len

    def forward(self, h0):
        h = h0.expand(self.beams, HIDDEN).contiguous()
        tokens = torch.zeros(self.beams, dtype=torch.long)
        scores = torch.tensor([0.0] + [float("-inf")] * (self.beams - 1))
        history = torch.zeros(self.max_len, self.beams, dtype=torch.long)
        done = torch.zeros(self.beams, dtype=torch.bool)
        for step in range(self.max_len):
            h = self.cell(self.embed(tokens), h)
            logp = F.log_softmax(self.out(h), -1)
            logp = torch.where(done[:, None], torch.where(torch.arange(VOCAB) == self.eos, 0.0, float("-inf")), logp)
            best, flat = torch.topk((scores[:, None] + logp).reshape(-1), self.beams)
            parent, tokens = flat // VOCAB, flat % VOCAB
            h, history, done = h[parent], history[:, parent], done[parent] | (tokens == self.eos)
            history[step] = tokens
            scores = best
            if done.all():
                break
        return history, scores


class KVCacheGenerator(nn.Module):
    """GPT-style generation: one attention layer over a preallocated key/value cache,
    masked to the positions filled so far, a new token per step."""

    def __init__(self, steps=6):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)
        self.steps = steps

    def forward(self, prompt):
        n = prompt.shape[0]
        total = n + self.steps
        keys, values = torch.zeros(total, HIDDEN), torch.zeros(total, HIDDEN)
        tokens = torch.cat([prompt, torch.zeros(self.steps, dtype=torch.long)])
        for t in range(total - 1):
            q, k, v = self.qkv(self.embed(tokens[t])).chunk(3, -1)
            keys[t], values[t] = k, v
            visible = torch.arange(total) <= t
            weights = F.softmax(torch.where(visible, keys @ q / HIDDEN ** 0.5, float("-inf")), -1)
            nxt = self.head(weights @ values).argmax()
            if t + 1 >= n:
                tokens[t + 1] = nxt
        return tokens


class TopKMoE(nn.Module):
    """A Mixture-of-Experts layer: a router picks the top-2 experts per token, their outputs
    are mixed by the renormalized router weights."""

    def __init__(self, experts=4, k=2):
        super().__init__()
        self.router = nn.Linear(HIDDEN, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(HIDDEN, 32), nn.GELU(), nn.Linear(32, HIDDEN))
                                     for _ in range(experts))
        self.k = k

    def forward(self, x):
        weights, chosen = torch.topk(F.softmax(self.router(x), -1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            gate = (weights * (chosen == e)).sum(-1, keepdim=True)
            if gate.sum() > 0:   # skip experts no token chose
                out = out + gate * expert(x)
        return out


class AdaptiveODE(nn.Module):
    """An adaptive-step Euler/Heun integrator of dy/dt = f(y): a step is accepted when the two
    estimates agree, else halved; the step grows after an accepted one."""

    def __init__(self):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 4))

    def forward(self, y, t_end, tol: float = 1e-2):
        t = torch.zeros(())
        dt = torch.full((), 0.1)
        steps = torch.zeros((), dtype=torch.long)
        while t < t_end and steps < 200:
            dt = torch.minimum(dt, t_end - t)
            k1 = self.f(y)
            euler = y + dt * k1
            heun = y + dt * 0.5 * (k1 + self.f(euler))
            if (heun - euler).abs().max() < tol:
                y, t = heun, t + dt
                dt = dt * 1.5
            else:
                dt = dt * 0.5
            steps += 1
        return y, t, steps


class EarlyExit(nn.Module):
    """An early-exit classifier: after each stage, return if the exit head is confident."""

    def __init__(self, stages=3, threshold=0.6):
        super().__init__()
        self.stages = nn.ModuleList(nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.ReLU()) for _ in range(stages))
        self.exits = nn.ModuleList(nn.Linear(HIDDEN, 4) for _ in range(stages))
        self.threshold = threshold

    def forward(self, x):
        for stage, head in zip(self.stages, self.exits):
            x = stage(x)
            probs = F.softmax(head(x), -1)
            if probs.max() > self.threshold:
                return probs, x.mean()
        return probs, x.sum()


class GatedResNet(nn.Module):
    """SkipNet-style: a gate per residual block decides to run it or to pass the input on."""

    def __init__(self, blocks=4):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
                                    for _ in range(blocks))
        self.gates = nn.ModuleList(nn.Linear(8, 1) for _ in range(blocks))

    def forward(self, x):
        for block, gate in zip(self.blocks, self.gates):
            if torch.sigmoid(gate(x.mean((2, 3)))).item() > 0.5:
                x = x + block(x)
        return x.mean((2, 3))


class Node:
    """A parse-tree node as tree code writes it: its word vector and a list of children."""

    def __init__(self, x: torch.Tensor, children=()):
        self.x = x
        self.children = list(children)


class ChildSumTreeLSTM(nn.Module):
    """Tai et al.'s child-sum TreeLSTM, recursing over `Node` objects and leaving each node's
    state on it (`node.state`), as public implementations do."""

    def __init__(self, d=HIDDEN, h=HIDDEN):
        super().__init__()
        self.iou = nn.Linear(d, 3 * h)
        self.u_iou = nn.Linear(h, 3 * h, bias=False)
        self.f = nn.Linear(d, h)
        self.u_f = nn.Linear(h, h, bias=False)
        self.h = h

    def forward(self, node):
        h_sum, fc = torch.zeros(self.h), torch.zeros(self.h)
        for child in node.children:
            child_h, child_c = self.forward(child)
            h_sum = h_sum + child_h
            fc = fc + torch.sigmoid(self.f(node.x) + self.u_f(child_h)) * child_c
        i, o, u = torch.chunk(self.iou(node.x) + self.u_iou(h_sum), 3)
        c = torch.sigmoid(i) * torch.tanh(u) + fc
        h = torch.sigmoid(o) * torch.tanh(c)
        node.state = torch.stack([h, c])
        return h, c


def random_tree(seed: int, nodes: int = 9, d: int = HIDDEN) -> Node:
    """A tree of `nodes` nodes whose shape depends on the seed."""
    g = torch.Generator().manual_seed(seed)

    def grow(n: int) -> Node:
        children, left = [], n - 1
        while left:
            k = int(torch.randint(1, left + 1, (), generator=g))
            children.append(grow(k))
            left -= k
        return Node(torch.randn(d, generator=g), children)
    return grow(nodes)


def _randn(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


CORPUS = {
    "greedy_decoder": (GreedyDecoder, lambda s: (_randn(s, 1, HIDDEN, scale=3),)),
    "beam_search": (BeamSearch, lambda s: (_randn(s, 1, HIDDEN, scale=2),)),
    "kv_cache_generation": (KVCacheGenerator, lambda s: (torch.randint(0, VOCAB, (2,), generator=torch.Generator().manual_seed(s)),)),
    "moe_top2": (TopKMoE, lambda s: (_randn(s, 5, HIDDEN),)),
    "adaptive_ode": (AdaptiveODE, lambda s: (_randn(s, 2, 4), torch.tensor(0.5 + s))),
    "early_exit": (EarlyExit, lambda s: (_randn(s, 1, HIDDEN, scale=4),)),
    "gated_resnet": (GatedResNet, lambda s: (_randn(s, 1, 8, 6, 6),)),
    "treelstm_objects": (ChildSumTreeLSTM, lambda s: (random_tree(s),)),
}


def make(name: str, seed: int = 0) -> nn.Module:
    """The program `name` with weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    return CORPUS[name][0]().eval()
