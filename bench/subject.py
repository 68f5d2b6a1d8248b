"""One workload as the systems see it: the model, its inputs, and what is derived from them
once and shared (the flat input tensors, the captured program, the traced graph)."""
from __future__ import annotations

import inspect
from functools import cached_property
from typing import Any

import torch

import cocktailer
from cocktailer import pytree
from cocktailer.ir import CONTROL, Program
from bench.status import Unsupported, describe


class Subject:
    def __init__(self, workload: Any, threads: int | None = None):
        self.workload = workload
        self.threads = threads   # --threads: the peers' own thread pools get this many too
        self.name = workload.name
        self.batch = workload.batch
        self.model = workload.model.eval() if isinstance(workload.model, torch.nn.Module) else workload.model
        self.inputs = tuple(workload.inputs)
        self._pristine = [t.clone() for t in self.tensors]
        self._failures: dict[str, str] = {}

    @property
    def key(self) -> str:
        return f"{self.name}/b{self.batch}"

    def restore_inputs(self):
        """Put back the inputs' first values: a model that writes into its inputs must not hand
        the next system different inputs than the first one got."""
        with torch.no_grad():
            for t, saved in zip(self.tensors, self._pristine):
                t.copy_(saved)

    def eager(self) -> Any:
        """The eager result, copied: it may be a view of an input (a tree leaf's vector)."""
        with torch.no_grad():
            result = self.model(*self.inputs)
        return pytree.tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, result)

    @cached_property
    def tensors(self) -> list[torch.Tensor]:
        """The input tensors in the order of the captured program's parameters."""
        fn = self.model.forward if isinstance(self.model, torch.nn.Module) else self.model
        bound = inspect.signature(fn).bind(*self.inputs)
        bound.apply_defaults()
        leaves, _ = pytree.flatten((bound.args, bound.kwargs))
        return [x for x in leaves if isinstance(x, torch.Tensor)]

    @property
    def program(self) -> Program:
        """The program cocktailer captures (control flow included)."""
        return self._once("program", lambda: cocktailer.capture(self.model, self.inputs))

    @property
    def traced(self) -> cocktailer.CompiledFunction:
        """The traced graph on the eager (reference) backend."""
        return self._once("traced", lambda: cocktailer.compile_traced(self.model, self.inputs, backend="reference"))

    @property
    def traced_program(self) -> Program:
        return self._once("traced_program", lambda: self.traced.specialize(*self.inputs))

    @cached_property
    def has_control_flow(self) -> bool:
        return any(op.op in CONTROL for op in self.program.walk())

    def _once(self, what: str, build):
        """Build once; a failure is remembered and raised again as Unsupported (every system
        that needs the captured program says why it has no number)."""
        if what in self._failures:
            raise Unsupported(self._failures[what])
        if what not in self.__dict__:
            try:
                self.__dict__[what] = build()
            except Unsupported:
                raise
            except Exception as exc:   # capture refuses: the reason goes in the table
                self._failures[what] = f"cocktailer could not capture the model: {describe(exc)}"
                raise Unsupported(self._failures[what]) from exc
        return self.__dict__[what]
