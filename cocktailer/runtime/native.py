"""A compiled native program: load, bind torch tensors zero-copy, call, report errors."""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Sequence

import torch

from cocktailer.codegen import kernels
from cocktailer.codegen.kernels.gemm import prepack_b
from cocktailer.codegen.renderer import CPU, Rendered, assemble, render
from cocktailer.errors import CompiledCallError
from cocktailer.ir import Program, TensorType
from cocktailer.runtime.compiler import load_library
from cocktailer.schedule import Device, SimplePolicy
from cocktailer.schedule.memory import plan_memory
from cocktailer.schedule.utask import UProgram

_ARGTYPES = [ctypes.c_void_p] * 9 + [ctypes.c_int]
SLOTS_PER_FRAME = 8   # the generated code's CT_SLOTS: resume label, caller frame, fan-out state


class CompiledProgram:
    """Calls the generated `cocktailer_run` once per inference. Inputs, constants and outputs
    are torch tensors bound by pointer; the scratch arena, the recursion stack and per-worker
    loop counters are allocated once per thread and reused, so calls are thread-safe."""

    def __init__(self, program: Program, rendered: Rendered, library: tuple[ctypes.CDLL, str], workers: int,
                 max_depth: int, uprogram: UProgram | None = None):
        self.program = program
        self.uprogram = uprogram   # the schedule it was generated from (explain prints it)
        self.rendered = rendered
        self.workers = workers
        self.max_depth = max_depth
        handle, self.library = library
        self._fn = getattr(handle, rendered.entry)
        self._fn.argtypes = _ARGTYPES
        self._fn.restype = ctypes.c_int64
        self._constants = [self._constant(n) for n in rendered.plan.const_names]
        self._packed_from = {n: program.constants[src]._version for n, (src, _) in rendered.prepacked.items()}
        self._const_table = (ctypes.c_void_p * max(len(self._constants), 1))(*[t.data_ptr() for t in self._constants])
        self._input_types = [p.type for p in program.main.params]
        self._output_types = [v.type for v in program.main.body.yields]
        self._local = threading.local()

    def _scratch(self):
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            plan, frames = self.rendered.plan, self.max_depth + 1
            stacks = self.workers if self.rendered.fans_out else 1   # a group of workers per stack
            scratch = self._local.scratch = (
                torch.empty(max(plan.arena_bytes, 64), dtype=torch.uint8),
                torch.empty(max(plan.frame_bytes, 64) * self.max_depth * stacks, dtype=torch.uint8)
                if plan.frame_bytes else torch.empty(64, dtype=torch.uint8),
                torch.empty(self.workers * frames * plan.locals_per_frame, dtype=torch.int64),
                torch.empty(self.workers * frames * SLOTS_PER_FRAME, dtype=torch.int64),
                torch.zeros(1, dtype=torch.int64))
        return scratch

    def _constant(self, name: str) -> torch.Tensor:
        if name in self.rendered.prepacked:
            source, nr = self.rendered.prepacked[name]
            return prepack_b(self.program.constants[source], nr)
        return self.program.constants[name].detach().contiguous()

    def _refresh_prepacked(self):
        """Pack again, in place, the weights changed since they were packed (their pointers
        are in the constant table)."""
        for k, name in enumerate(self.rendered.plan.const_names):
            if name in self._packed_from:
                source = self.program.constants[self.rendered.prepacked[name][0]]
                if source._version != self._packed_from[name]:
                    self._constants[k].copy_(self._constant(name))
                    self._packed_from[name] = source._version

    @property
    def identity(self) -> str:
        """Changes whenever the code or the worker count does (the profiler's cache key)."""
        return f"{self.library}:{self.rendered.entry}:{self.workers}"

    def check_inputs(self, inputs: Sequence[torch.Tensor]):
        if len(inputs) != len(self._input_types):
            raise CompiledCallError(f"expected {len(self._input_types)} tensor inputs, got {len(inputs)}")
        for k, (x, ty) in enumerate(zip(inputs, self._input_types)):
            if x.device.type != "cpu":
                raise CompiledCallError(f"input {k} is on {x.device}; this program was compiled for the CPU")
            if TensorType.of(x) != ty:
                raise CompiledCallError(f"input {k} is {TensorType.of(x)}; this program was compiled for {ty}")

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.check_inputs(inputs)
        if self._packed_from:
            self._refresh_prepacked()
        inputs = [x.contiguous() for x in inputs]
        outputs = [torch.empty(t.shape, dtype=t.dtype) for t in self._output_types]
        arena, stack, locals_, rets, err = self._scratch()
        ins = (ctypes.c_void_p * max(len(inputs), 1))(*[x.data_ptr() for x in inputs])
        outs = (ctypes.c_void_p * max(len(outputs), 1))(*[y.data_ptr() for y in outputs])
        code = self._fn(ins, outs, self._const_table, arena.data_ptr(), stack.data_ptr(), self.max_depth,
                        locals_.data_ptr(), rets.data_ptr(), err.data_ptr(), self.workers)
        if code:
            message = self.rendered.errors[code - 1] if 0 < code <= len(self.rendered.errors) else f"error {code}"
            if "recursion deeper" in message:
                message += f" ({self.max_depth}); compile with a larger max_depth"
            raise CompiledCallError(message)
        return outputs   # inputs written in place come back as the last outputs; the caller copies them


def default_workers() -> int:
    return len(os.sched_getaffinity(0))


def compile_together(programs: list[tuple[Program, bool]], device: Device, prefix: str,
                     max_depth: int) -> list[CompiledProgram]:
    """Programs (each with whether to co-schedule its waves) scheduled by the simple policy and
    compiled as the entries `{prefix}_{k}` of one shared library: one compiler run for all of
    them (the host backend's basic blocks, the two variants of every wave)."""
    parts = []
    for k, (program, wavefront) in enumerate(programs):
        plan = plan_memory(program, wave_workers=device.workers if wavefront else 0)
        uprogram = SimplePolicy(device, can_run_natively=kernels.supported, wavefront=wavefront).schedule(program, plan)
        parts.append((program, uprogram, render(uprogram, plan, CPU, entry=f"{prefix}_{k}")))
    if not parts:
        return []
    handle, path = load_library(assemble([rendered for *_, rendered in parts]))
    return [CompiledProgram(program, rendered, (handle, str(path)), device.workers, max_depth, uprogram)
            for program, uprogram, rendered in parts]
