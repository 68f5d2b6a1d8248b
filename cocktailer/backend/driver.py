"""build(): a program and a configuration in, a callable native program out, with the record
of every stage it ran (`cocktailer.explain` prints it).

    simple policy: the cpu pipeline (backend.cpu.CPU_STAGES) or the host one (HOST_STAGES)
    cuda: backend.cuda.CUDA_STAGES (the cpu pipeline in the CUDA dialect)
    measured policy: the search's candidates, each built by one of them and timed
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from cocktailer.backend.config import Config
from cocktailer.backend.cpu import build_cpu
from cocktailer.backend.cuda import NO_GPU, build_cuda, gpu_unavailable
from cocktailer.backend.host import build_host
from cocktailer.backend.measured import SizeTrial, TunedProgram, specialize, tune
from cocktailer.backend.native import unsupported_ops
from cocktailer.backend.record import Record
from cocktailer.errors import CocktailerError
from cocktailer.ir import Program


class BackendUnavailable(CocktailerError):
    """This backend cannot run this program (the reason says why); another backend can."""


def build(program: Program, config: Config, samples: list[list[torch.Tensor]] | None = None) -> Callable:
    """The executable for `program` under `config` (its `.record` says how it was built).
    `samples`: input tensors the measured policy times candidates on."""
    if program.device.type != "cpu":
        if config.backend == "cuda":
            why = gpu_unavailable(program.device, config)
            if why:
                raise BackendUnavailable(why)
            return build_cuda(program, config, Record(config))
        raise BackendUnavailable(f"the {config.backend} backend runs CPU tensors; these are on {program.device}")
    if config.backend == "cuda" and not config.virtual_gpu:   # the cpu backend, as it builds for itself
        config = replace(config, backend="cpu")
        record = Record(config)
        record.notices.append(NO_GPU)
    else:
        record = Record(config)
    if config.backend == "cuda":
        return build_cuda(program, config, record)
    if config.policy == "measured" and config.backend == "cpu":
        return tune(program, config, samples or [], build_native, record)
    if config.backend == "host":
        return build_host(program, config, record)
    missing = unsupported_ops(program)
    if not missing:
        return build_cpu(program, config, record)
    # Constraint 1, construct by construct: what has native kernels still runs natively
    record.notices.append(f"no native kernel for {'; '.join(missing)}: these ops run in Python, and so does "
                          "the control flow around them; the rest runs in native blocks (see cocktailer.explain)")
    return build_host(program, Config(backend="host", workers=config.workers, max_depth=config.max_depth,
                                      max_iterations=config.max_iterations, native_from=0), record)


def specialize_measured(program: Program, symbolic: TunedProgram, sample: list[torch.Tensor],
                        sizes: str) -> tuple[TunedProgram, SizeTrial]:
    """The measured policy at one sample's sizes: `program`, captured at them, built as the
    candidate kept for the symbolic program, and whether it measured faster there."""
    return specialize(program, symbolic, sample, sizes, build_native)


def build_native(program: Program, config: Config, record: Record) -> Callable:
    """One measured-policy candidate's pipeline, as it is: a cpu configuration of a program
    that has an op without a native kernel is refused, not moved to the host."""
    if config.backend == "host":
        return build_host(program, config, record)
    missing = unsupported_ops(program)
    if missing:
        raise BackendUnavailable(f"no native kernel for: {'; '.join(missing)}")
    return build_cpu(program, config, record)


def backend(name: str) -> Callable[[Program], Callable]:
    """`name`'s default build, as `cocktailer.BACKENDS` lists it: program -> executable."""
    return lambda program: build(program, Config(backend=name))
