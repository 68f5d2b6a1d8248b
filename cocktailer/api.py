"""The user-facing entry points: capture() and compile()."""
from __future__ import annotations

import contextlib
import enum
import gc
import inspect
import types
import warnings
from dataclasses import replace
from typing import Any, Callable

import torch

from cocktailer import pytree
from cocktailer.errors import CocktailerError, CompiledCallError, InternalError, UnsupportedError
from cocktailer.frontend import capture as _frontend_capture
from cocktailer.frontend.attributes import assign as assign_attributes
from cocktailer.frontend.nodes import NeedsAssignedTable, is_node_object, linearize
from cocktailer.dynamic import DynamicDims, erase
from cocktailer.ir import Program, SymbolicSizeError
from cocktailer.passes import CAPTURE_PIPELINE, run_pipeline
from cocktailer.passes.fold_constants import refresh_derived
from cocktailer.backend import BackendUnavailable, Config, TunedProgram, backend as native_backend, build, \
    specialize_measured
from cocktailer.reference import ReferenceExecutor
from cocktailer.reference.trace import traced_graph
from cocktailer.runtime.compiler import find_compiler

# name -> factory(Program) -> callable(list of input tensors) -> list of output tensors
BACKENDS: dict[str, Callable[[Program], Callable]] = {
    "cpu": native_backend("cpu"),    # the whole program, control flow included, as one native call
    "host": native_backend("host"),  # control flow in Python, each basic block one native call (CocktailerBase)
    "cuda": native_backend("cuda"),  # the same program as one persistent CUDA kernel (a virtual GPU for now)
    "reference": ReferenceExecutor,
}
AUTO_ORDER = ["cpu", "cuda", "reference"]   # "auto" takes the first that can run the program (cuda: CUDA tensors)
NATIVE = {"cpu", "host", "cuda"}


def _gpu_program(backend: str, program: Program) -> bool:
    """The cuda backend on CUDA tensors: where there is no GPU or toolkit for them, the reference
    backend runs them instead, with one warning (on CPU tensors it runs the cpu backend itself)."""
    return backend == "cuda" and program.device.type == "cuda"


def capture(model_or_function: Callable, example_inputs: tuple = (), example_kwargs: dict | None = None,
            dynamic: frozenset = frozenset()) -> Program:
    """The IR Program of `model_or_function(*example_inputs)`: data flow and control flow.
    `str(program)` is its text form. `dynamic`: dims of the tensor arguments, (leaf index of
    the flattened arguments, dim), to capture as symbolic sizes where the program allows."""
    with _collector_paused():
        program = _frontend_capture(model_or_function, _as_tuple(example_inputs), example_kwargs, dynamic)
        try:
            return run_pipeline(program, CAPTURE_PIPELINE)
        except Exception as e:   # a pass failed, or left an invalid program: a bug of ours
            raise InternalError(e, program.main.loc) from e


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector off while compiling. Capture and the backend make many small
    objects, and every few thousand of them the collector walks all the process holds (torch
    alone is ~250k objects): with it on, a repeat compile of skipnet spent ~40% of its time in
    collections. Memory is still freed by reference counts; cycles wait for the next collection."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compile_traced(model_or_function: Callable, example_inputs: tuple, *, backend: str = "auto",
                   example_kwargs: dict | None = None) -> "CompiledFunction":
    """Compile the traced graph of `model_or_function` for these inputs: control flow resolved
    by running it once (loops unrolled, taken branches only, recursion flattened). The result
    is only right for inputs that take the same decisions, and only accepts these shapes:
    it is the lower bound that benchmarks compare control flow against."""
    compiled = compile(model_or_function, backend=backend)
    args, kwargs = compiled._bind(_as_tuple(example_inputs), example_kwargs or {})
    program = capture(model_or_function, args, kwargs)
    tensors = _tensors(args, kwargs)
    program = run_pipeline(traced_graph(program, tensors), CAPTURE_PIPELINE)
    compiled.dims = DynamicDims(False)
    compiled.cache[compiled._key(args, kwargs)] = (program, compiled._build(program, [tensors]))
    compiled.frozen = True
    return compiled


def compile(model_or_function: Callable, example_inputs: tuple | None = None, *, backend: str = "auto",
            example_kwargs: dict | None = None, options: dict | None = None,
            dynamic: bool | None = None) -> "CompiledFunction":
    """A callable with the signature of `model_or_function` that runs its compiled program.

    It specializes on the dtypes and device of the tensor arguments and on the values of the
    other arguments, and compiles again (cached) when they change. Sizes: a dim whose size
    differs from the first call's becomes a symbolic size (one program for all its sizes,
    where the program allows it: see cocktailer.dynamic); `dynamic=True` takes every dim so
    from the first call on, `dynamic=False` compiles every shape apart, and
    `cocktailer.mark_dynamic(tensor, dim)` names single dims. With
    `example_inputs`, the first specialization is compiled now, so errors show here.
    Inference only: when autograd would record the call (grad mode on and an input or
    parameter requires grad), it runs the original model eagerly instead, with one warning.
    `options` go to native backends: `workers` (threads; default all cores), `max_depth`
    (frames of the recursion stack; default 256: deeper recursion raises CompiledCallError),
    `max_iterations` (a loop that runs more iterations raises CompiledCallError; default: no
    limit, and Ctrl-C stops a runaway loop with KeyboardInterrupt),
    `fan_out` (cpu: independent recursive calls run at once on groups of workers), `unroll`
    (cpu: innermost loops with a trip count run this many steps per iteration), `wavefront`
    (cpu: Rammer's co-scheduling: independent operators side by side on groups of workers
    where each wave measures faster so (`measure_waves=False`: where a work-balance rule says
    so), with fine-grained barriers, or global ones only with `fine_barriers=False`; not with
    `fan_out`), `rewrite`
    (cpu, default True: loop distribution and hoisting; False only to measure them), `fuse`
    (default True: chains of elementwise ops as one loop each; False only to measure it) and
    `policy`: "simple" (default: control flow at L1, the worker count by a size rule) or
    "measured" (cpu: candidates built and timed on this machine, the fastest kept; see
    cocktailer.explain), which times them on the example inputs and on `samples` (more
    argument tuples shaped like them, or of other values of their symbolic sizes), and takes
    `workers` as the most it may use; a symbolic program is also built specialized at each
    sample's sizes and that one runs calls of exactly those sizes where it measured faster; `steps`
    limits its search to some of `cocktailer.backend.config.STEPS`. The "host" backend takes
    `native_from=d`: control-flow constructs nested at least d deep in their function (0: all)
    run inside its native blocks, where every op they control has a native kernel. The "cuda"
    backend ("auto" picks it for CUDA tensors) compiles with nvcc for the tensors' GPU, a block
    of `threads` threads (default 32) per SM unless `workers` says how many; without a toolkit
    the reference backend runs them, with one warning; `control_stack` says where each block
    keeps its control state (the simulated stack's labels and frames, loop counters) and, in a
    team of one block (one block, or each call of a fan-out), the recursion's frames themselves:
    "shared" (default: in the block's shared memory where it fits, else global) or "global".
    On CPU tensors it takes
    `virtual_gpu=True` (run the generated CUDA on a virtual GPU, its CPU execution mode:
    `workers` blocks of `threads` threads, default 2 x 32); without it, the program runs on
    the cpu backend with one warning.
    """
    if backend != "auto" and backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; available: {', '.join(['auto', *BACKENDS])}")
    compiled = CompiledFunction(model_or_function, backend, options or {}, dynamic)
    if example_inputs is not None:
        compiled.specialize(*_as_tuple(example_inputs), **(example_kwargs or {}))
    return compiled


def _as_tuple(example_inputs) -> tuple:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


class GradFallbackWarning(UserWarning):
    """compile()d code is inference-only; a call that needs gradients ran eagerly."""


class AliasedInputsWarning(UserWarning):
    """A call whose tensor arguments share memory, to a program that writes in place, ran eagerly."""


class CompiledFunction:
    def __init__(self, fn: Callable, backend: str, options: dict | None = None, dynamic: bool | None = None):
        self.fn = fn
        self.dims = DynamicDims(dynamic)   # which dims each call takes as symbolic sizes
        self._seen_shapes: dict[tuple, tuple] = {}   # a call's key with every size -> (its program's key, entry, guard)
        self.backend = backend
        self.options = options or {}
        self.config = Config.from_options(self.options, backend)   # checked here, once
        self.signature = inspect.signature(fn.forward if isinstance(fn, torch.nn.Module) else fn)
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        # calls that give every parameter by position bind as they are (binding is per call, and per instance in a batch)
        self._all_positional = (len(self.signature.parameters)
                                if all(p.kind in positional for p in self.signature.parameters.values()) else -1)
        self.parameters = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
        self.cache: dict[tuple, tuple[Program, Callable]] = {}
        self._guards: dict[tuple, _ConstantGuard] = {}
        self._warned: set[type] = set()   # the fallback warnings given once already
        self.chosen = backend        # with "auto": the backend the last specialization used
        self.frozen = False   # compile_traced: no other specialization may be compiled
        self._guards_held: dict | None = None   # within `guards_checked_once`: id(guard) -> whether it held
        self._assigned: dict[type, dict] = {}    # node class -> fields the program assigns (frontend.nodes)
        self._kept_as_objects: set[type] = set()   # node classes whose trees the program reads as objects

    def _key(self, args, kwargs, flat: tuple[list, pytree.Spec] | None = None) -> tuple:
        """The arguments' structure, their tensors' layouts and dtypes, and their Python values:
        the cache key, with the symbolic sizes left out (_erase_key)."""
        leaves, spec = flat if flat is not None else pytree.flatten((args, kwargs))
        return spec, tuple(_leaf_key(x) for x in leaves)

    @staticmethod
    def _signature(key: tuple) -> tuple:
        """A key without any size: what calls that may share one dynamic program have in common."""
        spec, leaves = key
        return spec, tuple((kind, len(rest[0]), *rest[1:3]) if kind == "tensor" else (kind, *rest)
                           for kind, *rest in leaves)

    def _bind(self, args, kwargs) -> tuple[tuple, dict]:
        if not kwargs and len(args) == self._all_positional:
            return tuple(args), {}
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args, bound.kwargs

    def specialize(self, *args, **kwargs) -> Program:
        """Compile for these arguments (if not cached yet); return the program."""
        args, kwargs = self._bind(args, kwargs)
        return self._prepare(args, kwargs)[2][0]

    @contextlib.contextmanager
    def guards_checked_once(self):
        """Within, each program's constant guard is checked once: the instances of one batch
        run one model, whose parameters cannot change between them (64 instances checked the
        model's every parameter 64 times)."""
        self._guards_held = {}
        try:
            yield
        finally:
            self._guards_held = None

    def guard_of(self, program: Program) -> "_ConstantGuard | None":
        """The guard of the cached entry that runs `program`; None where none does."""
        return next((self._guards.get(key) for key, (p, _) in self.cache.items() if p is program), None)

    def _holds(self, guard: "_ConstantGuard") -> bool:
        if self._guards_held is None:
            return guard.holds()
        held = self._guards_held.get(id(guard))
        if held is None:
            held = self._guards_held[id(guard)] = guard.holds()
        return held

    def _prepare(self, args, kwargs, flat: tuple | None = None) -> tuple[list, list, tuple[Program, Callable]]:
        """(the leaves the program takes, the trees linearized into them, (program, run)).
        Trees of node objects are passed as index tables (frontend.nodes), so that one program
        serves every tree of their size; a field the program assigns adds tables for it.
        `flat`: pytree.flatten((args, kwargs)), where the caller has it already."""
        flat = flat if flat is not None else pytree.flatten((args, kwargs))
        for _ in range(_MAX_ASSIGNED_FIELDS):
            linked_args, linked_kwargs, linked, trees = self._linearize(args, kwargs, flat)
            try:
                return linked[0], trees, self._entry(linked_args, linked_kwargs, linked)
            except NeedsAssignedTable as e:
                self._assigned.setdefault(e.cls, {})[e.name] = e.type
            except UnsupportedError:   # tables the program cannot use as it uses the objects (a string field, or
                if not trees:          # a number it needs as a Python value): compiled per tree, as before
                    raise
                self._kept_as_objects.update(type(tree.nodes[0]) for tree in trees)
        raise CompiledCallError(f"the program assigns more than {_MAX_ASSIGNED_FIELDS} fields of node objects")

    def _linearize(self, args, kwargs, flat: tuple[list, pytree.Spec]) -> tuple[tuple, dict, tuple, list]:
        """The arguments with each tree of node objects replaced by its tables, flattened too;
        the arguments as they are (flattened once, by the caller) where there is none."""
        leaves, spec = flat
        if not any(is_node_object(x) and type(x) not in self._kept_as_objects for x in leaves):
            return args, kwargs, flat, []
        trees = []

        def tables(x):
            if not is_node_object(x) or type(x) in self._kept_as_objects:
                return x
            trees.append(linearize(x, self._assigned.get(type(x), {})))
            return trees[-1].ref
        linked_args, linked_kwargs = pytree.unflatten(spec, [tables(x) for x in leaves])
        return linked_args, linked_kwargs, pytree.flatten((linked_args, linked_kwargs)), trees

    def _entry(self, args, kwargs, flat: tuple[list, pytree.Spec] | None = None) -> tuple[Program, Callable]:
        flat = flat if flat is not None else pytree.flatten((args, kwargs))
        static = self._key(args, kwargs, flat)
        seen = self._seen_shapes.get(static)   # shapes called before: no new sizes to learn from them
        if seen is not None and (self.frozen or self._holds(seen[2])):
            return seen[1]
        if seen is None and static in self.cache:   # a program of exactly these sizes (the measured policy's)
            if self.frozen or self._holds(self._guards[static]):
                return self._remember(static, static, self.cache[static])
            del self.cache[static]
        dims = None if seen is not None else self._dims_of(static, flat[0])
        key = seen[0] if seen is not None else _erase_key(static, dims)
        entry = self.cache.get(key)
        if entry is not None and not self.frozen and not self._holds(self._guards[key]):
            entry = None   # the model's parameters were replaced since: compile for the ones it holds now
        if entry is None:
            if self.frozen:
                raise CompiledCallError("a traced graph only runs on inputs shaped like the ones it was traced with")
            if dims is None:   # the shapes were seen, but their program is stale: choose again
                dims = self._dims_of(static, flat[0])
            program, executable, dims = self._compile(args, kwargs, flat, dims, self._signature(static))
            key = _erase_key(static, dims)
            entry = self.cache[key] = (program, executable)
            self._guards[key] = _ConstantGuard(self.fn, program)
            if static in self.cache:   # the measured policy specialized this call's own sizes
                key, entry = static, self.cache[static]
        return self._remember(static, key, entry)

    def _remember(self, static: tuple, key: tuple, entry: tuple[Program, Callable]) -> tuple[Program, Callable]:
        """Calls of these exact shapes run `entry` (cached under `key`) from now on, while its guard holds."""
        if len(self._seen_shapes) >= _MAX_SEEN_SHAPES:
            self._seen_shapes.clear()
        self._seen_shapes[static] = (key, entry, self._guards.get(key))   # a symbolic program stays right for them
        return entry

    def _dims_of(self, static: tuple, leaves: list) -> frozenset:
        """The dims this call takes as symbolic sizes (asking again for the same call gives the same)."""
        return self.dims.choose(leaves, self._signature(static))

    def _compile(self, args, kwargs, flat, dims: frozenset, signature) -> tuple[Program, Callable, frozenset]:
        """(program, executable, the dims it takes as symbolic sizes): those of `dims` that
        capture and the backend could keep symbolic; the others are specialized from now on."""
        with _collector_paused():
            try:
                program = capture(self.fn, args, kwargs, dims)
            except Exception:   # symbolic sizes never make a program fail that compiles for numbers
                if not dims:
                    raise
                self.dims.specialize(signature, dims)
                return self._compile(args, kwargs, flat, frozenset(), signature)
            kept = _symbolic_dims(program, flat[0])
            self.dims.specialize(signature, dims - kept)
            static = self._key(args, kwargs, flat)
            calls = [(static, args, kwargs), *self._sample_calls(_erase_key(static, kept), kept)]
            samples = [_tensors(a, k) for _, a, k in calls]   # what the measured policy times candidates on
            try:
                executable = self._build(program, samples)
            except SymbolicSizeError as e:   # the backend needs these as numbers: the others may stay symbolic
                if not kept:
                    raise
                needed = _symbolic_dims(program, flat[0], e.syms) or kept
                self.dims.specialize(signature, needed)
                return self._compile(args, kwargs, flat, kept - needed, signature)
            if kept and isinstance(executable, TunedProgram):
                self._specialize_sample_sizes(program, executable, calls)
            return program, executable, kept

    def _build(self, program: Program, samples: list[list[torch.Tensor]]) -> Callable:
        try:
            return self._build_with(program, samples)
        except (CocktailerError, ValueError, SymbolicSizeError):
            raise
        except Exception as e:   # the backend failed on a captured program: a bug of ours
            raise InternalError(e, program.main.loc) from e

    def __call__(self, *args, **kwargs):
        if self._needs_grad((args, kwargs)):
            return self._eager(args, kwargs, GradFallbackWarning,
                               "cocktailer compiles inference only: this call needs gradients (grad mode is on and "
                               "an input or parameter requires grad), so it runs eagerly. Call the compiled model "
                               "under torch.no_grad() or torch.inference_mode().")
        args, kwargs = self._bind(args, kwargs)
        leaves, trees, (program, run) = self._prepare(args, kwargs)
        refresh_derived(program)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        boundary = program.boundary
        if boundary.written and _overlapping(tensors, program):
            return self._eager(args, kwargs, AliasedInputsWarning,
                               "this call's tensor arguments share memory with each other (or with a parameter the "
                               "program writes), and the program writes in place: it runs eagerly, so that every "
                               "alias sees the writes as in PyTorch")
        return self._finish(program, run, run(tensors), leaves, trees, tensors)

    def _finish(self, program: Program, run: Callable, results: list, leaves: list, trees: list, tensors: list,
                fresh: bool = False):
        """The call's Python result from the program's yields: writes into the caller's tensors
        (and trees) done, outputs that alias inputs rebuilt as views, attributes assigned.
        `fresh`: the yields are memory of their own, whatever `run` returns otherwise."""
        boundary = program.boundary
        if not (fresh or getattr(run, "fresh_outputs", False)):
            results = _own_memory(results, boundary, tensors, program)
        boundary.write_back(results, tensors, program.constants)   # the program wrote into these, as eager would
        if trees:   # and into the tables of these trees: onto their nodes
            written = {id(tensors[n]) for n in boundary.inputs_written}
            for tree in trees:
                tree.write_back(written)
        if boundary.plain:   # every output a yield of its own (the common case; per instance in a batch)
            outputs = [results[boundary.slots[o.index].value] for o in boundary.outputs]
        else:
            sizes = ({sym: tensors[position].shape[dim] for sym, position, dim in program.sizes}
                     if boundary.sized else None)
            outputs = boundary.outputs_of(results, tensors, program.constants, sizes)
        out_spec, kinds = program.output_spec
        if out_spec.kind == "leaf" and kinds[0][0]:   # one tensor (the common case: per instance in a batch)
            result = outputs[0]
        else:
            outputs = iter(outputs)
            result = pytree.unflatten(out_spec, [next(outputs) if is_tensor else value for is_tensor, value in kinds])
        if program.attribute_writes:   # `self.h = ...` in forward: assigned again, with real tensors
            result, values = result
            assign_attributes(program.attribute_writes, values, self.fn, leaves)
        return result

    def _eager(self, args, kwargs, warning: type, message: str):
        """Run the original model eagerly; say why, once per kind of reason."""
        if warning not in self._warned:
            warnings.warn(message, warning, stacklevel=3)
            self._warned.add(warning)
        return self.fn(*args, **kwargs)

    def _sample_calls(self, key: tuple, dims: frozenset):
        """(own key, args, kwargs) of each of options["samples"] that specializes to `key`,
        bound, with trees of node objects linearized as a call's are."""
        for extra in self.config.samples:
            extra_args, extra_kwargs = self._bind(_as_tuple(extra), {})
            extra_args, extra_kwargs, flat, _ = self._linearize(extra_args, extra_kwargs,
                                                                pytree.flatten((extra_args, extra_kwargs)))
            static = self._key(extra_args, extra_kwargs, flat)
            if _erase_key(static, dims) == key:
                yield static, extra_args, extra_kwargs

    def _specialize_sample_sizes(self, program: Program, symbolic: TunedProgram, calls: list[tuple]):
        """The measured policy's choice per size it was given (`calls`: (full key, args,
        kwargs) of this call and of the samples that share the symbolic program): where the
        program specialized at that size measured faster, calls of exactly that size run it
        (cached under their full key)."""
        tried = set()
        for key, call_args, call_kwargs in calls:
            if key in self.cache or key in tried:   # the first call's static program, or a size given twice
                continue
            tried.add(key)
            exact = capture(self.fn, call_args, call_kwargs)
            tensors = _tensors(call_args, call_kwargs)
            specialized, trial = specialize_measured(exact, symbolic, tensors, _describe_sizes(program, tensors))
            if trial.kept:
                self.cache[key] = (exact, specialized)
                self._guards[key] = _ConstantGuard(self.fn, exact)

    def _build_with(self, program: Program, samples: list[list[torch.Tensor]]) -> Callable:
        """The backend's executable for `program`. "auto" takes the first backend in AUTO_ORDER
        that can run it; a native backend without a C compiler falls back to the reference
        backend with one warning."""
        candidates = AUTO_ORDER if self.backend == "auto" else [self.backend, "reference"]
        for name in candidates:
            if name in NATIVE and find_compiler() is None:
                _warn_once("no C compiler found (set CC or install gcc): running the reference backend instead")
                continue
            if self.backend != "auto" and name == self.backend and not _gpu_program(name, program):
                self.chosen = name
                return self._backend(name, program, samples)   # an explicitly chosen backend's errors are the user's
            try:
                executable = self._backend(name, program, samples)
            except BackendUnavailable as e:
                if _gpu_program(name, program):   # no GPU or toolkit for these CUDA tensors
                    _warn_once(f"{e}: running the reference backend instead")
                continue
            self.chosen = name
            return executable
        raise AssertionError("the reference backend runs every program")

    def _backend(self, name: str, program: Program, samples: list[list[torch.Tensor]]) -> Callable:
        if name not in NATIVE:
            return BACKENDS[name](program)
        executable = build(program, replace(self.config, backend=name), samples)
        for notice in executable.record.notices:
            _warn_once(notice)
        return executable

    def _needs_grad(self, *calls: tuple) -> bool:
        """Whether grad mode is on and a parameter, or a tensor of any of the calls' (args,
        kwargs), requires grad (parameters looked at once, however many calls)."""
        if not torch.is_grad_enabled():
            return False
        return any(p.requires_grad for p in self.parameters) or \
            any(isinstance(x, torch.Tensor) and x.requires_grad for call in calls for x in pytree.flatten(call)[0])


_warned: set[str] = set()
_MAX_ASSIGNED_FIELDS = 16
_MAX_SEEN_SHAPES = 4096


def _warn_once(message: str):
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _overlapping(tensors: list[torch.Tensor], program: Program) -> bool:
    """Whether tensor arguments share memory with each other or with a constant the program
    writes (the compiled program treats them as separate memory)."""
    pointers = [x.untyped_storage().data_ptr() for x in tensors if x.numel()]
    written = {program.constants[name].untyped_storage().data_ptr() for name in program.boundary.constants_written}
    return len(set(pointers)) != len(pointers) or bool(written.intersection(pointers))


def _own_memory(results: list[torch.Tensor], boundary, tensors: list[torch.Tensor], program: Program) -> list:
    """What a program returns as new tensors, and the new contents of the tensors it writes,
    must not be memory of the caller's tensors. The reference executor hands back views of
    inputs and constants (`c.copy_(y[0])` leaves c's new contents a view of y, which the
    write-back into y would change first), an input itself where the program only copied it
    (`x.clone()` is no op in the IR), or one tensor for two outputs: those are copied."""
    inputs = {x.untyped_storage().data_ptr() for x in tensors}
    inputs |= {c.untyped_storage().data_ptr() for c in program.constants.values()}
    results, taken = list(results), set(inputs)
    for k in [slot.value for slot in boundary.slots] + [k for _, _, k in boundary.written]:
        y = results[k]
        pointer = y.untyped_storage().data_ptr()
        if pointer in taken or not y.numel():
            results[k] = y.clone()
        elif k not in [w for _, _, w in boundary.written]:
            taken.add(pointer)
    return results


def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [x for x in pytree.flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]


def _erase_key(key: tuple, dims: frozenset) -> tuple:
    """A cache key with the sizes of `dims` left out (the leaves' keys of _leaf_key), and which
    of them were equal: capture gives equal sizes one Sym, so that program is right only for
    calls where they are equal again."""
    if not dims:
        return key
    spec, leaves = key
    sizes = [leaves[leaf][1][dim] for leaf, dim in sorted(dims)]
    equal = tuple(sizes.index(n) for n in sizes)
    leaves = list(leaves)
    for leaf in {leaf for leaf, _ in dims}:
        kind, shape, *rest = leaves[leaf]
        leaves[leaf] = (kind, erase(shape, leaf, dims), *rest)
    return spec, tuple(leaves), equal


def _describe_sizes(program: Program, tensors: list[torch.Tensor]) -> str:
    """The values a call gives the program's symbolic sizes, as its IR names them."""
    values = {str(sym): tensors[position].shape[dim] for sym, position, dim in program.sizes}
    return ", ".join(f"{name} = {n}" for name, n in values.items())


def _symbolic_dims(program: Program, leaves: list, syms=None) -> frozenset:
    """The (leaf, dim) of every symbolic size the program takes (of `syms` only, if given)."""
    tensor_leaves = [k for k, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    return frozenset((tensor_leaves[position], dim) for sym, position, dim in program.sizes
                     if syms is None or sym in syms)


def _leaf_key(x) -> Any:
    if isinstance(x, torch.Tensor):   # a layout other than contiguous changes which reshapes are views
        return ("tensor", tuple(x.shape), x.dtype, x.device, None if x.is_contiguous() else x.stride())
    return ("python", python_key(x))


_PRIMITIVES = (int, float, complex, bool, str, bytes, type(None), type(Ellipsis), slice, range, enum.Enum,
               torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout)
_BY_IDENTITY = (torch.nn.Module, types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType, type)


def python_key(x, seen: dict | None = None) -> Any:
    """A key for a Python argument by value and structure, never by identity alone: capture
    reads Python values, so an object mutated since (a tree whose children changed) must
    not find the program compiled for its old contents. Tensors inside objects are
    constants of the program: they count by identity, shape and dtype."""
    if isinstance(x, _PRIMITIVES):
        return (type(x), x)
    if isinstance(x, torch.Tensor):
        return ("tensor", id(x), tuple(x.shape), x.dtype, x.device)
    seen = {} if seen is None else seen
    if id(x) in seen:   # a cycle, or an object reached twice: where it was first seen
        return ("seen", seen[id(x)])
    seen[id(x)] = len(seen)
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(python_key(v, seen) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple((python_key(k, seen), python_key(v, seen)) for k, v in x.items()))
    if isinstance(x, (set, frozenset)):
        return (type(x).__name__, frozenset(python_key(v, seen) for v in x))
    if isinstance(x, _BY_IDENTITY):
        return ("object", id(x))
    if type(x).__hash__ not in (object.__hash__, None):   # the class defines equality by value itself
        try:
            return ("value", type(x), hash(x), x)
        except TypeError:
            pass
    fields = dict(vars(x)) if hasattr(x, "__dict__") else {}
    fields.update((name, getattr(x, name)) for cls in type(x).__mro__ for name in getattr(cls, "__slots__", ())
                  if isinstance(name, str) and hasattr(x, name) and name != "__weakref__")
    if not fields:
        return ("object", id(x))
    return ("fields", type(x), tuple((name, python_key(v, seen)) for name, v in sorted(fields.items())))


class _ConstantGuard:
    """Notices when what a compiled program reads as constants is not what the model holds
    any more: a parameter, buffer or submodule replaced (`layer.weight = nn.Parameter(...)`),
    or new memory under the same tensor (`w.data = ...`). The program is then compiled again."""

    def __init__(self, fn: Callable, program: Program):
        sources = [t for name, t in program.constants.items() if name not in program.derived]
        self.tensors, self.pointers = sources, [t.data_ptr() for t in sources]
        self.attributes = _attribute_checks(fn, program) if isinstance(fn, torch.nn.Module) else []

    def holds(self) -> bool:
        return all(d.get(k) is v for d, k, v in self.attributes) and \
            [t.data_ptr() for t in self.tensors] == self.pointers


def _attribute_checks(module: torch.nn.Module, program: Program) -> list[tuple[dict, str, Any]]:
    """(dict, key, object) for every submodule, parameter and buffer on the paths to the
    constants named after the module's attributes."""
    named = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    checks = {}
    for name in program.constants:
        if name not in named:
            continue
        owner, path = [module], name.split(".")
        for part in path[:-1]:
            owner.append(owner[-1]._modules[part])
            checks[(id(owner[-2]._modules), part)] = (owner[-2]._modules, part, owner[-1])
        table = owner[-1]._parameters if path[-1] in owner[-1]._parameters else owner[-1]._buffers
        checks[(id(table), path[-1])] = (table, path[-1], table[path[-1]])
    return list(checks.values())
