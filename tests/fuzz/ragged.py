"""A seeded generator of programs over one sentence whose length differs between input sets.

`generate_ragged(seed)` gives a module whose forward reads `s` (tokens, 6): position-wise
Linears, activations, layer norms (F.layer_norm, or by hand with `var`), softmaxes over the
features, sums of token-wise values, attention over the tokens (one head or two), a token
read by a constant index, a decision on it that sends some instances through more layers, a
loop over the tokens, a token written in place, a vector broadcast to every token, and sums
over the tokens (which keep instances of one length together). Its input sets have 2 to 12 tokens (one seed in five: the same length for all), so
that `cocktailer.batch` runs them in one group with their rows padded, and packed where ops are
position-wise (`cocktailer.batching.blocks.row_wise`), with the padding masked where a softmax or
a product reads it. `check_batch` compares every instance with eager on it alone.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from fuzz.gen import Program, Stmt

D = 6          # features per token
LINEARS = 4    # self.lin0 .. lin3 (D -> D)


@dataclass
class RaggedProgram(Program):
    lengths: list[int] = field(default_factory=list)   # tokens of each input set
    seeded_buffer = False                               # its module has linears only

    @property
    def source(self) -> str:
        lines = ["import torch", "import torch.nn.functional as F", "",
                 "class M(torch.nn.Module):", "    def __init__(self):", "        super().__init__()"]
        lines += [f"        self.lin{k} = torch.nn.Linear({D}, {D})" for k in range(LINEARS)]
        lines += ["", "    def forward(self, s):"]
        return "\n".join(lines + [line for st in self.body for line in st.render(2)]) + "\n"

    def build(self):
        namespace: dict = {"__name__": f"fuzz_ragged_{self.seed}"}
        path = _write(self)
        exec(compile(self.source, str(path), "exec"), namespace)
        torch.manual_seed(self.seed)
        return namespace["M"]().to(self.dtype).eval()

    def inputs(self, k: int) -> tuple:
        g = torch.Generator().manual_seed(self.seed * 1000 + k)
        return (torch.randn(self.lengths[k % len(self.lengths)], D, generator=g, dtype=self.dtype),)


def _write(program: RaggedProgram):
    from fuzz.gen import _source_dir
    path = _source_dir() / f"fuzz_ragged_{program.seed}_{abs(hash(program.source)) % 10**8}.py"
    if not path.exists():
        path.write_text(program.source)
    return path


class RaggedGenerator:
    def __init__(self, seed: int):
        self.seed, self.rng = seed, random.Random(seed)
        self.tokens = ["s"]    # variables of shape (tokens, D)
        self.vectors = []      # variables of shape (D,)
        self.count = 0

    def program(self, sets: int = 6) -> RaggedProgram:
        r = self.rng
        body = [Stmt(f"h0 = self.lin0(s)")]
        self.tokens.append("h0")
        body += [st for _ in range(r.randint(3, 9)) for st in self.statement()]
        ret = [r.choice(self.tokens[1:])] + ([r.choice(self.vectors)] if self.vectors else [])
        body.append(Stmt(f"return {', '.join(ret)}"))
        lengths = [r.randint(2, 12)] * sets if r.random() < 0.2 else [r.randint(2, 12) for _ in range(sets)]
        return RaggedProgram(self.seed, torch.float32, [("s", "s")], body, module=True, lengths=lengths)

    def new(self, kind: list) -> str:
        self.count += 1
        name = f"{'h' if kind is self.tokens else 'v'}{self.count}"
        kind.append(name)
        return name

    def statement(self) -> list[Stmt]:
        r = self.rng
        if self.vectors and r.random() < 0.3:
            return self.branch(r.choice(self.vectors))
        if r.random() < 0.1:
            return self.loop(r.choice(self.tokens))
        h, other, lin = r.choice(self.tokens), r.choice(self.tokens), f"self.lin{r.randrange(LINEARS)}"
        tokens = [   # expressions of shape (tokens, D)
            f"{lin}({h})",
            f"{r.choice(['F.gelu', 'torch.tanh', 'torch.relu', 'torch.sigmoid'])}({h})",
            f"{h} {r.choice(['+', '*', '-'])} {other}",
            f"F.layer_norm({h}, ({D},))",
            f"({h} - {h}.mean(-1, keepdim=True)) * torch.rsqrt({h}.var(-1, keepdim=True, unbiased=False) + 1)",
            f"torch.softmax({h}, -1)",
            f"torch.softmax({h} @ {other}.transpose(0, 1) / 3, -1) @ {r.choice(self.tokens)}",
            self.heads(h),
        ]
        vectors = [f"{h}[{r.choice([0, 1, -1])}]", f"{h}.{r.choice(['sum', 'mean', 'amax'])}(0)"]
        if self.vectors:
            v = r.choice(self.vectors)
            vectors.append(f"torch.tanh({lin}({v}))")
            tokens.append(f"{h} + {v}")
            if r.random() < 0.15:
                name = self.new(self.tokens)
                return [Stmt(f"{name} = {h}.clone()"), Stmt(f"{name}[{r.choice([0, 1])}] = {v}")]
        if r.random() < 0.75:
            expr = r.choice(tokens)
            return [Stmt(f"{self.new(self.tokens)} = {expr}")]
        expr = r.choice(vectors)
        return [Stmt(f"{self.new(self.vectors)} = {expr}")]

    def heads(self, h: str) -> str:
        """Two heads of D // 2 features: split by a view after the tokens, attention per head."""
        a = f"{h}.view({h}.shape[0], 2, {D // 2}).transpose(0, 1)"
        return (f"(torch.softmax({a} @ {a}.transpose(1, 2), -1) @ {a})"
                f".transpose(0, 1).contiguous().view({h}.shape[0], {D})")

    def branch(self, v: str) -> list[Stmt]:
        """A decision on a token: the instances that take it run more layers on their tokens."""
        target = self.rng.choice(self.tokens[1:])
        lin = f"self.lin{self.rng.randrange(LINEARS)}"
        inner = [Stmt(f"{target} = F.layer_norm({target} + torch.relu({lin}({target})), ({D},))")]
        orelse = [Stmt(f"{target} = {target} * 0.5")] if self.rng.random() < 0.5 else []
        return [Stmt(header=f"if {v}[0] > 0:", body=inner, orelse=orelse)]   # (a layer-normed row sums to 0: no sum)

    def loop(self, h: str) -> list[Stmt]:
        """A running sum over the tokens: a loop whose trip count is each instance's length."""
        acc = self.new(self.vectors)
        return [Stmt(f"{acc} = {h}[0] * 0"),
                Stmt(header=f"for t in range({h}.shape[0]):", body=[Stmt(f"{acc} = torch.tanh({acc} + {h}[t])")])]


def generate_ragged(seed: int) -> RaggedProgram:
    return RaggedGenerator(seed).program()
