"""The paper's RAE on real Stanford Sentiment Treebank trees (the bundled sample): compiled
once, called on trees of different shapes padded to one size, equal to eager."""
import torch
import torch.nn as nn

import cocktailer
from cocktailer.data import load_sst

HIDDEN = 16


class RAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, left, right, is_leaf, inp, root):
        if is_leaf[root]:
            return inp[root]
        l = self.forward(left, right, is_leaf, inp, left[root])
        r = self.forward(left, right, is_leaf, inp, right[root])
        return torch.tanh(self.encoder(torch.cat([l, r], -1)))


def padded(tree, size, seed):
    def pad(t, fill):
        return torch.cat([t, torch.full((size - t.numel(),), fill, dtype=t.dtype)])
    inp = torch.randn(size, HIDDEN, generator=torch.Generator().manual_seed(seed))
    return pad(tree.left, -1), pad(tree.right, -1), pad(tree.is_leaf, True), inp, torch.tensor(tree.root)


def test_rae_on_sst_trees_matches_eager():
    trees = load_sst()
    chosen = trees[:6] + sorted(trees, key=lambda t: t.depth)[-2:]   # include the deepest (20+)
    assert max(t.depth for t in chosen) >= 20 and min(t.depth for t in chosen) <= 10
    size = max(t.num_nodes for t in chosen)
    torch.manual_seed(0)
    model = RAE().eval()
    inputs = [padded(t, size, seed) for seed, t in enumerate(chosen)]
    with torch.no_grad():
        fast = cocktailer.compile(model, inputs[0])
        for args in inputs:
            torch.testing.assert_close(fast(*args), model(*args), rtol=1e-5, atol=1e-6)
    assert len(fast.cache) == 1   # one compiled program served every tree
