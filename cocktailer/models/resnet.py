"""Residual networks that skip blocks at run time: BlockDrop and SkipNet (Cocktailer, Table 1).

Both run each residual block under an `if` on a decision tensor. In a batch, a block runs when
any sample wants it, and `torch.where` keeps the shortcut for the samples that skip it (as
BlockDrop's own batched inference does); a block no sample wants costs only its shortcut.

- BlockDrop: ResNet-32 for 32x32 CIFAR images (15 basic blocks, widths 16/32/64). The policy
  (one 0/1 per block and sample, from BlockDrop's policy network in the original) is an input.
- SkipNet: ResNet-101 for 224x224 ImageNet images (33 bottleneck blocks). Before each block a
  gate looks at the current features: global average pool, 1x1 conv to 10 channels, an LSTM
  cell (hidden 10) carried from gate to gate, a linear layer to one logit, sigmoid > 0.5.

The fraction of executed blocks is a parameter of the input generator, as the paper sweeps it
(Figure 17): the BlockDrop policy has exactly round(f * 15) ones per sample; SkipNet's input
`gate_bias` adds +-10 to each gate's logit, which forces the decision: the logit itself stays
below 11 / sqrt(10) ~ 3.5 in magnitude (LSTM output in (-1, 1) through Linear(10, 1), whose
default init draws weights and bias from +-1/sqrt(10)). The gate network still runs in full.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from cocktailer.models.workload import Workload, build, generator, resolve_config, settle_batchnorm

GATE_FORCE = 10.0


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions; `shortcut` is the identity or a strided 1x1 projection."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride), nn.ReLU(), conv_bn(cout, cout, 3))
        self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand by 4."""

    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = 4 * width
        self.body = nn.Sequential(conv_bn(cin, width, 1), nn.ReLU(), conv_bn(width, width, 3, stride), nn.ReLU(),
                                  conv_bn(width, cout, 1))
        self.shortcut = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()


def stages(block, cin: int, widths: list[int], depths: list[int], expansion: int) -> tuple[nn.ModuleList, int]:
    """The residual blocks of all stages, flattened; every stage but the first halves the resolution."""
    blocks = nn.ModuleList()
    for s, (width, depth) in enumerate(zip(widths, depths)):
        for b in range(depth):
            blocks.append(block(cin, width, 2 if s > 0 and b == 0 else 1))
            cin = width * expansion
    return blocks, cin


class BlockDrop(nn.Module):
    def __init__(self, widths: list[int], depths: list[int], classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, widths[0], 3), nn.ReLU())
        self.blocks, cout = stages(BasicBlock, widths[0], widths, depths, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cout, classes)

    def forward(self, x, policy):
        """x: (batch, 3, H, W) images; policy: (batch, blocks) float, 1 runs the block."""
        x = self.stem(x)
        for i, block in enumerate(self.blocks):
            skip = block.shortcut(x)
            run = policy[:, i] > 0.5
            if run.any():
                x = torch.where(run.view(-1, 1, 1, 1), torch.relu(block.body(x) + skip), skip)
            else:
                x = skip
        return self.fc(self.pool(x).flatten(1))


class SkipNet(nn.Module):
    def __init__(self, widths: list[int], depths: list[int], stem_width: int, classes: int = 1000,
                 gate_hidden: int = 10):
        super().__init__()
        self.gate_hidden = gate_hidden
        self.stem = nn.Sequential(conv_bn(3, stem_width, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.blocks, cout = stages(Bottleneck, stem_width, widths, depths, 4)
        # one gate projection per block, from the channels that block receives
        self.gate_convs = nn.ModuleList(nn.Conv2d(self._in_channels(b), gate_hidden, 1) for b in self.blocks)
        self.gate_rnn = nn.LSTMCell(gate_hidden, gate_hidden)
        self.gate_proj = nn.Linear(gate_hidden, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cout, classes)

    @staticmethod
    def _in_channels(block: Bottleneck) -> int:
        return block.body[0][0].in_channels

    def forward(self, x, gate_bias):
        """x: (batch, 3, H, W) images; gate_bias: (batch, blocks) added to each gate's logit."""
        x = self.stem(x)
        batch = x.shape[0]
        h = x.new_zeros(batch, self.gate_hidden)
        c = x.new_zeros(batch, self.gate_hidden)
        for i, (block, gate_conv) in enumerate(zip(self.blocks, self.gate_convs)):
            features = gate_conv(self.pool(x)).flatten(1)
            h, c = self.gate_rnn(features, (h, c))
            prob = torch.sigmoid(self.gate_proj(h).squeeze(1) + gate_bias[:, i])
            run = prob > 0.5
            skip = block.shortcut(x)
            if run.any():
                x = torch.where(run.view(-1, 1, 1, 1), torch.relu(block.body(x) + skip), skip)
            else:
                x = skip
        return self.fc(self.pool(x).flatten(1))


def decision_pattern(batch: int, blocks: int, fraction: float, seed: int, shared: bool) -> torch.Tensor:
    """(batch, blocks) bool: each row runs exactly round(fraction * blocks) blocks chosen at random
    (the same row for the whole batch when `shared`)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"exec_fraction must lie in [0, 1], got {fraction}")
    g = generator(seed)
    k = round(fraction * blocks)
    rows = 1 if shared else batch
    order = torch.stack([torch.randperm(blocks, generator=g) for _ in range(rows)])
    pattern = torch.zeros(rows, blocks, dtype=torch.bool)
    pattern.scatter_(1, order[:, :k], True)
    return pattern.expand(batch, blocks).clone()


def _record(cfg: dict, pattern: torch.Tensor) -> None:
    cfg["policy"] = pattern.int().tolist()
    cfg["executed_blocks"] = pattern.sum(1).tolist()                 # per sample
    cfg["executed_fraction"] = pattern.float().mean().item()         # per sample, averaged
    cfg["block_run_fraction"] = pattern.any(0).float().mean().item()  # blocks the batch runs


BLOCKDROP_CONFIG = {
    "paper": {"widths": [16, 32, 64], "depths": [5, 5, 5], "image": 32, "classes": 10,
              "exec_fraction": 7 / 15, "shared": False},
    "small": {"widths": [4, 8, 16], "depths": [1, 1, 1], "image": 8, "classes": 10,
              "exec_fraction": 2 / 3, "shared": False},
}
SKIPNET_CONFIG = {
    "paper": {"widths": [64, 128, 256, 512], "depths": [3, 4, 23, 3], "stem_width": 64, "image": 224,
              "classes": 1000, "gate_hidden": 10, "exec_fraction": 23 / 33, "shared": False},
    "small": {"widths": [2, 4, 4, 8], "depths": [1, 1, 1, 1], "stem_width": 4, "image": 32,
              "classes": 10, "gate_hidden": 10, "exec_fraction": 0.5, "shared": False},
}


def blockdrop(batch: int, size: str, seed: int, **overrides) -> Workload:
    cfg = resolve_config("blockdrop", size, BLOCKDROP_CONFIG, overrides)
    model = build(lambda: BlockDrop(cfg["widths"], cfg["depths"], cfg["classes"]), seed)
    settle_batchnorm(model, seed)
    cfg["blocks"] = len(model.blocks)
    pattern = decision_pattern(batch, cfg["blocks"], cfg["exec_fraction"], seed + 1, cfg["shared"])
    _record(cfg, pattern)
    x = torch.randn(batch, 3, cfg["image"], cfg["image"], generator=generator(seed))
    return Workload("blockdrop", model, (x, pattern.float()), batch, cfg, batches=True)


def skipnet(batch: int, size: str, seed: int, **overrides) -> Workload:
    cfg = resolve_config("skipnet", size, SKIPNET_CONFIG, overrides)
    model = build(lambda: SkipNet(cfg["widths"], cfg["depths"], cfg["stem_width"], cfg["classes"],
                                  cfg["gate_hidden"]), seed)
    settle_batchnorm(model, seed)
    cfg["blocks"] = len(model.blocks)
    pattern = decision_pattern(batch, cfg["blocks"], cfg["exec_fraction"], seed + 1, cfg["shared"])
    _record(cfg, pattern)
    gate_bias = torch.where(pattern, GATE_FORCE, -GATE_FORCE).float()
    x = torch.randn(batch, 3, cfg["image"], cfg["image"], generator=generator(seed))
    return Workload("skipnet", model, (x, gate_bias), batch, cfg, batches=True)
