"""The evaluation models of the papers, as plain PyTorch with their control flow left in, plus
deterministic input generators.

    w = cocktailer.models.make("seq2seq", batch=4, size="small", seed=1)
    fast = cocktailer.compile(w.model, w.inputs)
    fast(*w.inputs)   # == w.model(*w.inputs)

size="paper" is the configuration of the papers (Cocktailer Table 1; Cortex for TreeLSTM and
TreeFC); size="small" shrinks every dimension so a model runs in milliseconds in tests.
Weights are random from `seed` (nothing pretrained can be downloaded); inputs come from `seed`
too. `overrides` change single settings, e.g. hidden=512, exec_fraction=0.5, tree_index=3.

| name      | control flow                                   | module          |
|-----------|------------------------------------------------|-----------------|
| lstm      | loop over time, layers unrolled inside         | rnn.py          |
| nasrnn    | loop over time                                 | rnn.py          |
| attention | loop over decode steps, in-place KV-cache writes | attention.py  |
| seq2seq   | while loop until EOS (data-dependent)          | seq2seq.py      |
| blockdrop | `if` per residual block (policy input)         | resnet.py       |
| skipnet   | `if` per residual block (gate network)         | resnet.py       |
| rae       | recursion over a parse tree                    | tree.py         |
| treelstm  | recursion over a parse tree                    | tree.py         |
| treefc    | recursion over a perfect binary tree           | tree.py         |
"""
from __future__ import annotations

from typing import Callable

from cocktailer.models import attention, resnet, rnn, seq2seq, tree
from cocktailer.models.workload import SIZES, Workload

__all__ = ["Workload", "names", "make", "SIZES"]

_BUILDERS: dict[str, Callable[..., Workload]] = {
    "lstm": rnn.lstm,
    "nasrnn": rnn.nasrnn,
    "attention": attention.attention,
    "seq2seq": seq2seq.seq2seq,
    "blockdrop": resnet.blockdrop,
    "skipnet": resnet.skipnet,
    "rae": tree.rae,
    "treelstm": tree.treelstm,
    "treefc": tree.treefc,
}


def names() -> list[str]:
    """The evaluation models, in the order of the papers' tables."""
    return list(_BUILDERS)


def make(name: str, batch: int = 1, *, size: str = "paper", seed: int = 0, **overrides) -> Workload:
    """The model `name` with random weights from `seed`, in eval mode, and its inputs for `batch`."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(_BUILDERS)}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    return _BUILDERS[name](batch, size, seed, **overrides)
