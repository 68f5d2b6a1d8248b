"""`cocktailer.batch`: a model written for one instance, run on many at once (throughput mode).

    batched = cocktailer.batch(model, example_inputs=one_instance_args)
    outs = batched([args_1, args_2, ..., args_64])     # one result per instance, in order

Each instance is captured as `compile` captures a call (every size symbolic, trees of node
objects linearized), so one program serves every mix of instances. Instances that share a
program and their shapes run together through the batched executor (`cocktailer.batching`):
same-kind ops of all of them as one batched op, branches split by lane, loops with per-instance
trip counts shrinking their active set, tree recursion level by level. Each instance's result
is what the model returns for it alone.
"""
from __future__ import annotations

import warnings
from typing import Callable, Sequence

import torch

from cocktailer import pytree
from cocktailer.api import _MAX_SEEN_SHAPES, CompiledFunction, GradFallbackWarning, _as_tuple
from cocktailer.batching import BatchedExecutor, Techniques
from cocktailer.errors import CocktailerError, CompiledCallError, InternalError, UnsupportedError
from cocktailer.ir import Program
from cocktailer.passes.fold_constants import refresh_derived
from cocktailer.reference import ReferenceExecutor


class BatchInputError(CocktailerError):
    """Instances of a batch that do not fit the model: `positions` are their indices in the list."""

    def __init__(self, positions: list[int], reasons: list[str]):
        self.positions = positions
        lines = "\n".join(f"  instance {p}: {r}" for p, r in zip(positions, reasons))
        super().__init__(f"{len(positions)} instance(s) of the batch cannot run (no result is returned for any):\n{lines}")


def batch(model_or_function: Callable, example_inputs: tuple, *, max_iterations: int | None = None,
          techniques: Techniques = Techniques()) -> "BatchedFunction":
    """A callable that takes a list of argument tuples, each one instance of what `example_inputs`
    is one of, and returns the list of the model's results for them. `max_iterations` bounds
    every loop as `compile`'s option does; `techniques` turns batching techniques off (for
    measuring what each one gives)."""
    return BatchedFunction(model_or_function, _as_tuple(example_inputs), max_iterations, techniques)


class BatchedFunction:
    def __init__(self, fn: Callable, example_inputs: tuple, max_iterations: int | None = None,
                 techniques: Techniques = Techniques()):
        self.fn = fn
        self.techniques = techniques
        self.single = CompiledFunction(fn, backend="reference", dynamic=True)
        self.max_iterations = max_iterations
        self._executors: dict[int, BatchedExecutor] = {}
        # a layout of plain tensors -> the (program, run, group) its instances ran, and that
        # program's guard: later batches skip the cache key and lookups while the guard holds
        self._layouts: dict[tuple, tuple] = {}
        self.example = self.single._bind(example_inputs, {})
        self._structure = _structure(pytree.flatten(self.example))
        # an example of tensors only, all positional: an instance of as many plain tensors of the
        # same ranks and dtypes has its structure, and is bound and flattened as it is
        self._tensors_only = (self._structure[1] if not self.example[1] and
                              all(isinstance(x, torch.Tensor) for x in self.example[0]) else None)
        self.single._prepare(*self.example)   # captures now: an unsupported model fails here, not per call
        self.schedule = None   # what the last call's largest group did (`explain`)

    def __reduce__(self):
        """Pickled as the model and its example (what a worker process needs, e.g. Ray's): the
        copy captures again where it is unpickled, and its native blocks are compiled on its
        first call, or loaded from the disk cache where an earlier process compiled them."""
        return _rebuild, (self.fn, self.example, self.max_iterations, self.techniques)

    def __call__(self, instances: Sequence) -> list:
        instances = [self._bound(i, args) for i, args in enumerate(instances)]
        if self.single._needs_grad(*[(args, kwargs) for args, kwargs, _, _ in instances]):
            warnings.warn("cocktailer compiles inference only: gradients are on, so the instances run eagerly one "
                          "after another", GradFallbackWarning, stacklevel=2)
            return [self.fn(*args, **kwargs) for args, kwargs, _, _ in instances]
        groups: dict[tuple, list[int]] = {}
        prepared = self._prepared(instances)
        for i, (_, _, _, _, _, group) in enumerate(prepared):
            groups.setdefault(group, []).append(i)
        results: list = [None] * len(instances)
        bad, reasons = [], []
        for members in sorted(groups.values(), key=len, reverse=True):
            program = prepared[members[0]][0]
            yields = self._run_group(program, [prepared[i][4] for i in members], members)
            for i, out in zip(members, yields):
                program, run, leaves, trees, tensors, _ = prepared[i]
                try:   # (a result that is a view of another, `h[2]` of h, is made here: it may be out of range)
                    results[i] = self.single._finish(program, run, out, leaves, trees, tensors, fresh=True)
                except (IndexError, RuntimeError) as e:
                    bad.append(i)
                    reasons.append(f"{type(e).__name__}: {e}")
        if bad:
            raise BatchInputError(bad, reasons)
        return results

    def _bound(self, position: int, args) -> tuple:
        """(args, kwargs, their flattening, layout) of one instance, checked against the example's
        structure. `layout`: where the instance is plain tensors of the example's ranks and dtypes,
        their layouts (instances of one layout share a program), else None."""
        args = _as_tuple(args)
        if self._tensors_only is not None and len(args) == len(self._tensors_only):
            layout = _plain_layout(args, self._tensors_only)
            if layout is not None:
                return args, {}, (list(args), self._structure[0]), layout
        bound = self.single._bind(args, {})
        flat = pytree.flatten(bound)
        mismatch = _mismatch(self._structure, _structure(flat))
        if mismatch:
            raise BatchInputError([position], [mismatch])
        return (*bound, flat, None)

    def _prepared(self, instances: list) -> list:
        """Each instance's (program, run, leaves, trees, tensors, group): `group` is equal for
        instances that run together (a program, one set of shapes). An instance of sizes not
        seen before is captured, running the model on it: where that fails (an index out of
        its range, say), every such instance is named. Instances of plain tensors with the same
        layouts share one program and group, found once (and kept while the program's guard
        holds: its parameters were not replaced)."""
        prepared, bad, reasons = [], [], []
        with self.single.guards_checked_once():
            for i, (args, kwargs, flat, layout) in enumerate(instances):
                found = self._known(layout)
                if found is not None:
                    prepared.append((*found[:2], flat[0], [], flat[0], found[2]))
                    continue
                try:
                    leaves, trees, (program, run) = self.single._prepare(args, kwargs, flat)
                except InternalError:
                    raise
                except Exception as e:   # CocktailerError, or the model's own exception while it was captured
                    bad.append(i)
                    reasons.append(f"{type(e).__name__}: {e}")
                    continue
                tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
                group = (id(program), self._executor(program).group_key(tensors))
                prepared.append((program, run, leaves, trees, tensors, group))
                if layout is not None:
                    self._remember(layout, program, run, group)
        if bad:
            raise BatchInputError(bad, reasons)
        return prepared

    def _known(self, layout: tuple | None) -> tuple | None:
        """(program, run, group) of the instances of `layout` an earlier one was prepared for,
        while that program's guard holds."""
        known = self._layouts.get(layout) if layout is not None else None
        if known is None or not self.single._holds(known[3]):
            return None
        return known[:3]

    def _remember(self, layout: tuple, program: Program, run: Callable, group: tuple):
        guard = self.single.guard_of(program)
        if guard is None:
            return
        if len(self._layouts) >= _MAX_SEEN_SHAPES:   # as many layouts as `compile` remembers shapes
            self._layouts.clear()
        self._layouts[layout] = (program, run, group, guard)

    def _executor(self, program: Program) -> BatchedExecutor:
        executor = self._executors.get(id(program))
        if executor is None or executor.program is not program:
            if program.boundary.constants_written:
                raise UnsupportedError("the model writes its parameters or buffers: instances run together would see "
                                       "each other's writes; run them one by one with cocktailer.compile")
            executor = self._executors[id(program)] = BatchedExecutor(program, self.techniques)
        executor.max_iterations = self.max_iterations
        return executor

    def _run_group(self, program: Program, tensors: list[list[torch.Tensor]], members: list[int]) -> list:
        """The program's yields for each instance of one group (a program, one set of shapes)."""
        executor = self._executor(program)
        refresh_derived(program)   # constants folded from weights written in place since (load_state_dict)
        try:
            # no_grad, not inference_mode: results are the user's, who may write into them in place
            # (writes into inputs reach the stacked copies; _finish copies them back)
            with torch.no_grad():
                outs = executor(tensors)
        except (IndexError, RuntimeError, CompiledCallError):
            self._raise_for_instances(program, tensors, members)
            raise
        if self.schedule is None or executor.schedule.lanes >= self.schedule.lanes:
            self.schedule = executor.schedule
        return outs

    def _raise_for_instances(self, program: Program, tensors: list, members: list[int]):
        """A batch failed: run its instances one by one to name the ones at fault."""
        reference = ReferenceExecutor(program)
        reference.max_iterations = self.max_iterations
        bad, reasons = [], []
        for i, instance in zip(members, tensors):
            try:
                with torch.no_grad():
                    reference([t.clone() for t in instance])
            except (IndexError, RuntimeError, CompiledCallError) as e:
                bad.append(i)
                reasons.append(f"{type(e).__name__}: {e}")
        if bad:
            raise BatchInputError(bad, reasons)


def _plain_layout(args: tuple, expected: tuple) -> tuple | None:
    """The layouts of plain tensors of the `expected` (rank, dtype) each: what selects their
    program beyond the dtypes (as `compile`'s cache key does: shapes, devices, strides where not
    contiguous); None where one is not such a tensor."""
    layout = []
    for x, (rank, dtype) in zip(args, expected):
        if type(x) is not torch.Tensor or x.dtype != dtype or x.dim() != rank:
            return None
        layout.append((x.shape, x.device) if x.is_contiguous() else (x.shape, x.device, x.stride()))
    return tuple(layout)


def _structure(flat: tuple) -> tuple:
    """What every instance must share with the example: the arguments' structure, and each
    tensor's rank and dtype (sizes may differ). `flat`: the arguments flattened."""
    leaves, spec = flat
    return spec, tuple((x.dim(), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__ for x in leaves)


def _mismatch(example: tuple, instance: tuple) -> str | None:
    if example[0] != instance[0]:
        return "its arguments are structured differently from the example's"
    for k, (want, got) in enumerate(zip(example[1], instance[1])):
        if want != got:
            def show(x):
                return f"a rank-{x[0]} {x[1]} tensor" if isinstance(x, tuple) else f"a {x}"
            return f"argument leaf {k} is {show(got)}, the example's is {show(want)}"
    return None


def _rebuild(fn: Callable, example: tuple, max_iterations: int | None, techniques: Techniques) -> BatchedFunction:
    return BatchedFunction(fn, example[0], max_iterations, techniques)   # (binding the arguments again gives the same kwargs)
