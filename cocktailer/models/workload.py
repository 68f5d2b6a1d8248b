"""`Workload` (a model plus its inputs) and the helpers every model file uses to build one."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

SIZES = ("paper", "small")


@dataclass
class Workload:
    """One evaluation model, ready to run: `model(*inputs)`.

    `inputs` are the positional inputs for `batch` (the same tensors for every system that is
    compared). `config` holds the sizes used and the decision pattern the inputs encode.
    `batches` is False for models that cannot batch instances (the tree models): at batch > 1
    they run one tree per call, `inputs` is the first tree and `config["instances"]` holds one
    input tuple per tree, all with the same shapes so one compiled program serves them all."""

    name: str
    model: torch.nn.Module
    inputs: tuple
    batch: int
    config: dict
    batches: bool


def generator(seed: int) -> torch.Generator:
    """A CPU generator with a fixed seed: every input is reproducible and the global RNG untouched."""
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Module construction (its default initialisation) under `torch.manual_seed(seed)`,
    restoring the caller's global RNG state afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build(make_model: Callable[[], torch.nn.Module], seed: int) -> torch.nn.Module:
    """`make_model()` with weights from `seed`, in eval mode, without autograd on its parameters."""
    with seeded(seed):
        model = make_model()
    model.eval()
    model.requires_grad_(False)
    return model


def settle_batchnorm(model: torch.nn.Module, seed: int) -> None:
    """Give every BatchNorm non-trivial eval statistics (random-weight ResNets would otherwise
    normalise with mean 0 / var 1, i.e. not at all), keeping activations O(1) through deep nets."""
    g = generator(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.5)
            m.bias.data.copy_(torch.rand(n, generator=g) * 0.2 - 0.1)


def resolve_config(name: str, size: str, defaults: dict[str, dict], overrides: dict) -> dict:
    """The configuration for `size` with `overrides` applied; unknown keys are an error."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    config = dict(defaults[size])
    unknown = sorted(set(overrides) - set(config) - set(defaults.get("extra", {})))
    if unknown:
        known = sorted(set(config) | set(defaults.get("extra", {})))
        raise ValueError(f"{name}: unknown override(s) {unknown}; known: {known}")
    config.update(overrides)
    return config
