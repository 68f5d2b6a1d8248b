"""python -m cocktailer.demo: compile a bundled model with recursion, a data-dependent loop and
a branch; check it against eager PyTorch on real parse trees; print the program and timings.

The model reads a sentence's parse tree from the Stanford Sentiment Treebank sample: it
encodes the tree recursively (the Cocktailer paper's RAE), refines the sentence vector in a
`while` loop until it stops changing (a data-dependent trip count), and picks one of two
heads with an `if` on a tensor value.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn as nn

import cocktailer
from cocktailer.data import load_sst

HIDDEN = 64


class TreeSentiment(nn.Module):
    def __init__(self, hidden: int = HIDDEN, max_steps: int = 20):
        super().__init__()
        self.encoder = nn.Linear(2 * hidden, hidden)
        self.refine = nn.Linear(hidden, hidden)
        self.positive = nn.Linear(hidden, 5)
        self.negative = nn.Linear(hidden, 5)
        self.max_steps = max_steps

    def encode(self, left, right, is_leaf, words, node):
        if is_leaf[node]:
            return words[node]
        l = self.encode(left, right, is_leaf, words, left[node])
        r = self.encode(left, right, is_leaf, words, right[node])
        return torch.tanh(self.encoder(torch.cat([l, r], -1)))

    def forward(self, left, right, is_leaf, words, root):
        h = self.encode(left, right, is_leaf, words, root)
        steps = 0
        while steps < self.max_steps:
            new = torch.tanh(self.refine(h)) * 0.5 + h * 0.5
            if (new - h).abs().max() < 1e-3:
                break
            h = new
            steps += 1
        if h.sum() > 0:
            return torch.softmax(self.positive(h), -1), steps
        return torch.softmax(self.negative(h), -1), steps


def tree_inputs(trees, seed: int = 0):
    """Each tree's node arrays as they are: every tree has its own node count (the compiled
    program takes it as a symbolic size)."""
    gen = torch.Generator().manual_seed(seed)
    vocabulary = {}
    embeddings = torch.randn(4096, HIDDEN, generator=gen) * 0.5
    out = []
    for tree in trees:
        ids = [vocabulary.setdefault(w, len(vocabulary) % 4096) for w in tree.tokens]
        words = torch.zeros(tree.num_nodes, HIDDEN)
        words[: len(ids)] = embeddings[ids]
        out.append((tree.left, tree.right, tree.is_leaf, words, torch.tensor(tree.root)))
    return out


def _programs(n: int) -> str:
    return "one compiled program" if n == 1 else f"{n} compiled programs (1-node trees have one of their own)"


def median_ms(fn, inputs, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for args in inputs:
            fn(*args)
        times.append((time.perf_counter() - start) * 1e3 / len(inputs))
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", help=f"one of: auto, {', '.join(cocktailer.BACKENDS)}")
    parser.add_argument("--trees", type=int, default=16, help="number of SST sample trees to run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--show-ir", action="store_true", help="print the whole captured program")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = TreeSentiment().eval()
    trees = load_sst(limit=args.trees)
    inputs = tree_inputs(trees)
    with torch.no_grad():
        start = time.perf_counter()
        fast = cocktailer.compile(model, inputs[0], backend=args.backend, dynamic=True)
        compile_s = time.perf_counter() - start
        program = fast.specialize(*inputs[0])
        kinds = [op.op.name for op in program.walk()]
        print(f"captured {len(program.functions)} functions: {kinds.count('LOOP')} loops, {kinds.count('IF')} branches, "
              f"{kinds.count('CALL')} calls, {len(kinds)} ops in all (compile: {compile_s:.2f} s, backend "
              f"{fast.chosen!r})")
        if args.show_ir:
            print(program)
        for tree, x in zip(trees, inputs):
            (probs, steps), (want, want_steps) = fast(*x), model(*x)
            torch.testing.assert_close(probs, want, rtol=1e-5, atol=1e-6)
            assert int(steps) == want_steps
        nodes = [t.num_nodes for t in trees]
        print(f"all {len(trees)} trees match eager PyTorch (depths {min(t.depth for t in trees)}-"
              f"{max(t.depth for t in trees)}, {min(nodes)}-{max(nodes)} nodes, unpadded: "
              f"{_programs(len(fast.cache))} for all of them)")
        words = " ".join(trees[0].tokens)
        probs, steps = fast(*inputs[0])
        print(f"first sentence: {words[:70]!r}...\n  class probabilities {[round(p, 3) for p in probs.tolist()]}, "
              f"refined in {int(steps)} steps")
        eager_ms = median_ms(model, inputs, args.repeats)
        fast_ms = median_ms(fast, inputs, args.repeats)
    print(f"latency per tree: eager {eager_ms:.2f} ms, cocktailer[{fast.chosen}] {fast_ms:.2f} ms "
          f"-> speedup {eager_ms / fast_ms:.2f}x")
    if fast.chosen == "reference":
        print("  (the reference backend runs the IR op by op with torch and keeps control flow in Python: it defines\n"
              "   the semantics and is not meant to be fast; native backends are the ones that beat eager)")


if __name__ == "__main__":
    main()
