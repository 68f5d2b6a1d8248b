"""The tracer: builds IR while the user's (converted) Python runs on proxy tensors.

A `Proxy` is a storage-less tensor: a `Storage` (memory that aliasing tensors share, whose
contents are one IR value) and the chain of view ops from it (see `frontend.alias`). An
in-place write through any proxy makes a new value for its storage; every other view of the
storage recomputes its value the next time it is read, and storages that may be the same
memory (links) are written too, under their flags. Writes to storages created outside the
current region are logged per region, so that a branch, loop or function that writes them
yields their new values.
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from cocktailer.errors import UnsupportedError, user_location
from cocktailer.frontend.alias import Chain, Link, Storage, ViewStep, inverse_permutation
from cocktailer.ir import (BOOL, CREATION, Function, Op, Operation, Region, SourceLoc, Sym, TensorType, Value,
                           infer_type)


class Restart(BaseException):
    """Capture must start over knowing more: a loop to unroll, a recursive function, what a
    recursive function gives back. A BaseException so that user code's `except Exception`
    cannot swallow it."""

    def __init__(self, kind: str, key: Any):
        super().__init__(kind, key)
        self.kind, self.key = kind, key


@dataclass
class RegionInfo:
    kind: str                      # "function", "then", "else", "body", "cond"
    loc: SourceLoc | None = None
    loop_key: Any = None           # for loop regions: the key that hints use to unroll it
    static_trip: bool = False      # the loop's trip count is a Python int


class Undefined:
    """The value of a variable not yet assigned on every path to here."""

    def __init__(self, name: str):
        self.name = name

    def fail(self, *args, **kwargs):
        raise UnsupportedError(
            f"variable `{self.name}` is used where it may not have been assigned "
            "(for example it is set in only one branch of a tensor-dependent `if`, or only inside a loop)",
            hint=f"assign `{self.name}` before the `if`/loop, on every path")

    __getattr__ = __call__ = __bool__ = __iter__ = __len__ = __getitem__ = fail
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __matmul__ = fail

    def __repr__(self):
        return f"<undefined {self.name}>"


def type_of(x: torch.Tensor) -> TensorType:
    """x's IR type. A proxy's symbolic sizes included: its torch shape holds their captured values
    (reading it through torch would specialize them, see lowering). A view of a proxy has the
    shape of its layout, or where its storage has symbolic sizes, the type its view steps infer
    (`x[:, 0]` keeps x's symbolic rows)."""
    if isinstance(x, Proxy):
        if not x.chain:
            return x.storage.type
        if not x.storage.type.syms:
            return TensorType(tuple(x.meta.shape), x.meta.dtype)
        ty = x.storage.type
        for step in x.chain:
            ty = infer_type(step.op, [ty, *(d.type for d in step.dynamic)], step.kwargs)
        return ty
    return TensorType.of(x)


def contiguous_meta(type: TensorType) -> torch.Tensor:
    return meta_like(type.hinted.shape, None, type.dtype)   # a symbolic size at its captured value


def meta_like(shape, strides, dtype: torch.dtype) -> torch.Tensor:
    """A meta tensor of this layout (torch calls of the compiler's own bypass the capture mode)."""
    with torch._C.DisableTorchFunction():
        if strides is None:
            return torch.empty(tuple(shape), dtype=dtype, device="meta")
        return torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype, device="meta")


class Proxy(torch.Tensor):
    """A tensor during capture: a storage and the view chain from it; no data. Its sizes
    and strides are the ones eager PyTorch would give it (those of `meta`)."""

    @staticmethod
    def __new__(cls, tracer: "Tracer", storage: Storage, chain: Chain, meta: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, meta.shape, strides=meta.stride(),
                                                   storage_offset=meta.storage_offset(), dtype=meta.dtype,
                                                   device=tracer.device)

    def __init__(self, tracer: "Tracer", storage: Storage, chain: Chain, meta: torch.Tensor):
        self.tracer = tracer
        self.storage = storage
        self.chain = chain
        self.meta = meta
        self.cached: tuple[Value, int] | None = None   # (value, storage stamp it was computed at)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise UnsupportedError(f"a captured tensor reached `{func}` outside of cocktailer's capture "
                               "(it was kept after capture ended, or used from another thread)")

    def __repr__(self) -> str:
        return f"Proxy({self.storage}, {len(self.chain)} view steps)"

    def __str__(self) -> str:
        # torch.Tensor has no __str__ of its own (object's calls __repr__, which torch does not
        # see): `str(i)` of a loop index (`self.blocks[str(i)]`) must ask for its value as
        # formatting does, which unrolls the loop
        return torch.Tensor.__format__(self, "")



class SizeProxy(Proxy):
    """A symbolic size as a tensor (i64[]): what `x.shape` holds for a dim of symbolic size. A
    loop takes it as its trip count (`for t in range(n)`); anything else needs the size as a
    number (frontend.lowering specializes it)."""
    sym: Sym


def _layout(tensor: torch.Tensor) -> tuple:
    """Which memory a tensor is, and how it is laid out in it."""
    with torch._C.DisableTorchFunction():
        return ((tensor.device, tensor.untyped_storage().data_ptr()), tuple(tensor.shape), tensor.stride(),
                tensor.storage_offset(), tensor.dtype)


def is_proxy(x) -> bool:
    return isinstance(x, Proxy)


_MAX_ALIAS_UPDATES = 4096   # storages one in-place write updates, counted once per round that reaches them
# ... and all of a program's writes together. Each update is a conditional op in the program:
# the suite's programs make at most 1,716, the fuzzer's about 1 in 150 make 17,000-20,000,
# which took 13-18 s to capture and minutes in the C compiler (fuzz seeds 7273590, 7273632).
_MAX_PROGRAM_ALIAS_UPDATES = 8192


class Tracer:
    def __init__(self, device: torch.device, param_names: dict[int, str], hints: dict[str, Any]):
        self.symbolic = False   # some input has a symbolic size (frontend.lowering checks what meets it)
        self.device = device
        self.param_names = param_names      # id(tensor) -> qualified parameter/buffer name
        self.hints = hints                  # "unroll": loop keys, "recursive": function keys, "summaries"
        self.constants: dict[str, torch.Tensor] = {}
        self._constant_names: dict[int, str] = {}
        self.const_storages: dict[int, Storage] = {}   # id(tensor) -> its storage
        self._const_layouts: dict[tuple, Storage] = {}     # (memory, layout) -> storage
        self._const_tensors: dict[Storage, torch.Tensor] = {}     # storage -> the tensor it reads
        self.consts_written: set[str] = set()          # constants the program writes in place
        self.functions: dict[str, Function] = {}
        self.chain: list[Region] = []                  # current function's regions, outermost first
        self.logs: list[dict[Storage, tuple[Value, int]]] = []   # per region: first writes, old contents
        self.value_region: dict[int, Region] = {}
        self.region_info: dict[int, RegionInfo] = {}
        self.producer: dict[int, Operation] = {}
        self.param_index: dict[int, int] = {}          # region parameter -> its position
        self._hoisted: dict[tuple, Value] = {}         # per function: constants and scalars
        self._hoisted_count: dict[int, int] = {}      # per function: how many lead its body
        self._stamps = itertools.count(1)
        self.alias_updates = 0   # conditional updates every in-place write so far made (_propagate)
        self.unconverted: set[str] = set()             # user functions whose source could not be read

    # -- regions --------------------------------------------------------------------
    @contextmanager
    def in_region(self, region: Region, info: RegionInfo, new_function: bool = False) -> Iterator[dict]:
        """Trace into `region`; yields its write log (storage -> contents before the region)."""
        saved = (self.chain, self.logs)
        consts = self._enter_function() if new_function else None
        if new_function:
            self.chain, self.logs = [], []
        self.chain = self.chain + [region]
        self.logs = self.logs + [{}]
        self.region_info[id(region)] = info
        self.set_params(region, region.params)
        try:
            yield self.logs[-1]
        except Exception as e:
            if info.kind != "function":   # raised on a path capture traces but this call may not take
                e.cocktailer_traced_path = True
            raise
        finally:
            self.chain, self.logs = saved
            if consts is not None:
                self._leave_function(consts)

    def _enter_function(self) -> dict:
        """A function reads constants through CONST ops of its own: the caller's values are
        not visible in it."""
        saved = {s: (s.value, s.stamp) for s in self.const_storages.values()}
        for s in saved:
            s.value = None
        return saved

    def _leave_function(self, saved: dict):
        for s in self.const_storages.values():   # constants first read in the function: read again
            s.value, s.stamp = saved.get(s, (None, s.stamp))

    @contextmanager
    def reopen(self, region: Region):
        """Append to a region traced earlier (to fill in a value one branch lacks)."""
        saved = (self.chain, self.logs)
        self.chain = self.chain + [region]
        self.logs = self.logs + [{}]
        try:
            yield
        finally:
            self.chain, self.logs = saved

    def set_params(self, region: Region, params: list[Value]):
        region.params = params
        for i, p in enumerate(params):
            self.value_region[p.id] = region
            self.param_index[p.id] = i

    def regions_within(self, region: Region) -> Iterator[Region]:
        yield region
        for op in region.ops:
            for r in op.regions:
                yield from self.regions_within(r)

    def outer_writes(self, log: dict, region: Region) -> dict[Storage, tuple[Value, int]]:
        """The storages written in `region` that were created outside it, with their contents
        before it."""
        inside = {id(r) for r in self.regions_within(region)}
        return {s: old for s, old in log.items() if s.region is None or id(s.region) not in inside}

    def state_of(self, storages) -> dict[Storage, tuple[Value, int]]:
        return {s: (s.value, s.stamp) for s in storages}

    def set_state(self, state: dict[Storage, tuple[Value, int]]):
        """Put storages back to contents seen earlier (no log, no propagation: the other path
        of a branch starts from the same state)."""
        for s, (value, stamp) in state.items():
            s.value, s.stamp = value, stamp

    @contextmanager
    def storage_state(self, state: dict[Storage, tuple[Value, int]]):
        saved = self.state_of(state)
        self.set_state(state)
        try:
            yield
        finally:
            self.set_state(saved)

    def stamp(self) -> int:
        return next(self._stamps)

    @property
    def region(self) -> Region:
        return self.chain[-1]

    @property
    def in_main(self) -> bool:
        return self.chain[0] is self._main_body

    def start_main(self, body: Region):
        self._main_body = body

    # -- tensors --------------------------------------------------------------------
    def new_param(self, type: TensorType, hint: str = "") -> Value:
        return Value(type, hint)

    def new_storage(self, value: Value, origin: str = "local", meta: torch.Tensor | None = None,
                    region: Region | None = None) -> Storage:
        return Storage(value, next(self._stamps), region or self.region, origin,
                       meta if meta is not None else contiguous_meta(value.type))

    def fresh(self, value: Value, meta: torch.Tensor | None = None, origin: str = "local") -> Proxy:
        """A tensor with memory of its own, holding `value`."""
        storage = self.new_storage(value, origin, meta)
        return Proxy(self, storage, (), storage.meta)

    def size_of(self, x: Proxy, dim: int) -> SizeProxy:
        """x.shape[dim] where that size is symbolic: read when the program runs."""
        value = self.emit1(Op.DIM, [self.value_of(x)], dim=dim)
        storage = self.new_storage(value)
        size = SizeProxy(self, storage, (), storage.meta)
        size.sym = self.value_of(x).type.shape[dim]
        return size

    def on(self, storage: Storage, chain: Chain = (), meta: torch.Tensor | None = None) -> Proxy:
        """A tensor that is `storage` viewed through `chain`."""
        return Proxy(self, storage, chain, storage.meta if meta is None else meta)

    def as_proxy(self, x) -> Proxy:
        """A proxy for a tensor: itself, or for a constant the proxy of its storage."""
        return x if isinstance(x, Proxy) else self.on(self.const_storage(x))

    def view(self, x, step: ViewStep, meta: torch.Tensor) -> Proxy:
        """A view of `x` (shares its memory): `step` applied to it."""
        x = self.as_proxy(x)
        return Proxy(self, x.storage, x.chain + (step,), meta)

    def alias(self, x) -> Proxy:
        """Another tensor object for the same memory (`detach()`, `.data`)."""
        x = self.as_proxy(x)
        return Proxy(self, x.storage, x.chain, x.meta)

    def value_of(self, x) -> Value:
        """The IR value of a proxy or a real tensor (a constant); checks it may be read here."""
        if isinstance(x, Proxy):
            if x.tracer is not self:
                raise UnsupportedError("a tensor from another capture was used here")
            base = self.storage_value(x.storage)
            if not x.chain:
                return base
            if x.cached is not None and x.cached[1] == x.storage.stamp and self.visible(x.cached[0]):
                return x.cached[0]
            value = self.apply_chain(base, x.chain)
            x.cached = (value, x.storage.stamp)
            return value
        if isinstance(x, torch.Tensor):
            return self.storage_value(self.const_storage(x))
        raise TypeError(f"expected a tensor, got {type(x).__name__}")

    def storage_value(self, storage: Storage) -> Value:
        if storage.value is None:   # a constant not read yet in this function
            if storage.origin == "const" and self.const_name(storage) in self.consts_written:
                raise UnsupportedError(
                    f"a recursive function reads `{self.const_name(storage)}`, which the program writes in place",
                    hint="pass the tensor to the function as an argument, or write into a clone of it")
            storage.value = self.constant(self.const_tensor(storage))
        self.check_visible(storage.value)
        return storage.value

    def const_storage(self, tensor: torch.Tensor) -> Storage:
        """The storage of a tensor the program does not create (a parameter, buffer or global):
        one per memory, so that `w` and `w.data` (two tensor objects) are one storage."""
        storage = self.const_storages.get(id(tensor))
        if storage is None:
            layout = _layout(tensor)
            storage = self._const_layouts.get(layout)
            if storage is None:
                value = self.constant(tensor)
                storage = Storage(value, next(self._stamps), None, "const",
                                  meta_like(tensor.shape, tensor.stride(), tensor.dtype))
                self._const_layouts[layout] = storage
                self._const_tensors[storage] = tensor
            self.const_storages[id(tensor)] = storage
        return storage

    def const_tensor(self, storage: Storage) -> torch.Tensor:
        return self._const_tensors[storage]

    def const_name(self, storage: Storage) -> str:
        return self._constant_names[id(self._const_tensors[storage])]

    def visible(self, value: Value) -> bool:
        region = self.value_region.get(value.id)
        return region is None or any(r is region for r in self.chain)

    def check_visible(self, value: Value):
        region = self.value_region.get(value.id)
        if region is None or any(r is region for r in self.chain):
            return
        info = self.region_info.get(id(region), RegionInfo("?"))
        if info.kind in ("body", "cond") and info.static_trip and info.loop_key is not None:
            raise Restart("unroll", info.loop_key)
        where = {"body": "a loop body", "cond": "a loop condition", "then": "a branch of a tensor `if`",
                 "else": "a branch of a tensor `if`", "function": "another function"}.get(info.kind, "another region")
        at = f" (at {info.loc})" if info.loc else ""
        raise UnsupportedError(
            f"a tensor computed inside {where}{at} is used outside of it without passing through a variable: "
            "it was probably appended to a Python list or stored on an object",
            hint="preallocate a tensor before the loop and write into it (`out[:, t] = h`), "
                 "or assign the value to a local variable")

    # -- views ------------------------------------------------------------------------
    def apply_chain(self, value: Value, chain: Chain) -> Value:
        for step in chain:
            for d in step.dynamic:
                self.check_visible(d)
            value = self.emit1(step.op, [value, *step.dynamic], **step.kwargs)
        return value

    def scatter(self, base: Value, chain: Chain, value: Value) -> Value:
        """`base` with the part that `chain` views replaced by `value`."""
        parents = [base]
        for step in chain[:-1]:
            parents.append(self.apply_chain(parents[-1], (step,)))
        for step, parent in zip(reversed(chain), reversed(parents)):
            value = self._unview(step, parent, value)
        return value

    def _unview(self, step: ViewStep, parent: Value, value: Value) -> Value:
        attrs = step.kwargs
        if step.op is Op.SELECT:
            return self.emit1(Op.UPDATE, [parent, value, *step.dynamic], key=attrs["key"])
        if step.op is Op.PERMUTE:
            return self.emit1(Op.PERMUTE, [value], dims=inverse_permutation(attrs["dims"]))
        if step.op is Op.RESHAPE or (step.op is Op.EXPAND and value.type.numel == parent.type.numel):
            return self.emit1(Op.RESHAPE, [value], shape=parent.type.shape)
        raise UnsupportedError("an in-place write into a broadcast (expanded) view: several of its elements "
                               "are one element in memory (PyTorch refuses this too)",
                               hint="write into the tensor before expanding it, or `.clone()` the expanded one")

    # -- in-place writes ------------------------------------------------------------------
    def write(self, dest, value: Value):
        """`dest` (a proxy, or a constant tensor) now holds `value`, and so does the memory it
        shares with other tensors."""
        dest = self.as_proxy(dest)
        storage = dest.storage
        base = value if not dest.chain else self.scatter(self.storage_value(storage), dest.chain, value)
        self.assign(storage, base)
        dest.cached = (value, storage.stamp)

    def _check_const_write(self, storage: Storage):
        name = self.const_name(storage)
        if not self.in_main:
            raise UnsupportedError(f"a recursive function writes in place into `{name}`, a tensor the program "
                                   "does not create (a parameter, buffer or global)",
                                   hint="return the new values instead, or write into a clone")
        self.consts_written.add(name)

    def check_written_constants(self):
        """A constant written in place must not share memory with another one read in a
        different layout (a slice of a parameter kept as an attribute): their values would
        not follow each other."""
        for layout, storage in self._const_layouts.items():
            if self.const_name(storage) not in self.consts_written:
                continue
            shared = [self.const_name(s) for other, s in self._const_layouts.items()
                      if s is not storage and other[0] == layout[0]]
            if shared:
                raise UnsupportedError(f"an in-place write into `{self.const_name(storage)}`, which shares memory "
                                       f"with `{shared[0]}`", hint="write into a clone of it")

    def assign(self, storage: Storage, value: Value, propagate: bool = True):
        """New contents for `storage`; with `propagate`, for the storages it may share memory
        with too (each under its link's flag)."""
        self._set(storage, value)
        if propagate:
            self._propagate(storage)

    def _set(self, storage: Storage, value: Value):
        if storage.origin == "const":   # written back into the parameter or buffer after the call
            self._check_const_write(storage)
        log = self.logs[-1]
        if storage not in log:
            log[storage] = (storage.value, storage.stamp)
        storage.value, storage.stamp = value, next(self._stamps)

    def _propagate(self, origin: Storage):
        """Every storage that may share memory with the written one takes its new contents,
        under the condition that it does share it: the flags along some path of links from
        the written storage all hold. Round r follows the paths of r links, each storage
        reached in round r-1 passing on only the condition it was reached under then: a
        storage a false link "updated" with its old contents passes nothing on, so it cannot
        hand them back over one that really changed (x may be y, y may be z: the write into
        x reaches z through y only where both links hold). A path longer than the number of
        storages repeats one, so that many rounds suffice."""
        frontier, seen, unconditional, updates, rounds = {origin: True}, {origin}, {origin}, 0, 0
        while frontier and rounds < len(seen):
            rounds += 1
            reached: dict[Storage, Value | bool] = {}
            for storage, holds in frontier.items():
                for other, flag, derive in self._linked(storage):
                    cond = self._both(holds, flag)
                    if other in unconditional or cond is False:
                        continue
                    updates += 1
                    self.alias_updates += 1
                    self._check_alias_updates(updates)
                    self._set(other, self.select(cond, derive, lambda other=other: self.storage_value(other)))
                    reached[other] = cond if other not in reached else self._either(reached[other], cond)
                    seen.add(other)
            unconditional.update(s for s, cond in reached.items() if cond is True)
            frontier = reached

    def _check_alias_updates(self, updates: int):
        """Refuse a write whose conditional updates (`updates`), or the program's in all, pass
        their bound: past it the program grows faster than its writes."""
        if updates > _MAX_ALIAS_UPDATES:
            raise UnsupportedError(
                "an in-place write into a tensor that may share memory with too many others "
                "(variables rebound to each other's views in loops and branches)",
                hint="write into a `.clone()`, or keep the variables' aliasing the same on every path")
        if self.alias_updates > _MAX_PROGRAM_ALIAS_UPDATES:
            raise UnsupportedError(
                f"in-place writes into tensors that may share memory with others need more than "
                f"{_MAX_PROGRAM_ALIAS_UPDATES} conditional updates in all (variables rebound to each other's "
                "views in loops and branches, then written): the program would grow out of proportion",
                hint="write into `.clone()`s, or keep the variables' aliasing the same on every path")

    def _both(self, a: Value | bool, b: Value) -> Value | bool:
        """a AND b, folding the constant flags a merge gives where a path is known."""
        b = True if b is self.true() else False if b is self.false() else b
        if a is True or b is False:
            return b
        return a if b is True else self.emit1(Op.AND, [a, b])

    def _either(self, a: Value | bool, b: Value | bool) -> Value | bool:
        if a is True or b is True:
            return True
        return self.emit1(Op.OR, [a, b])

    def _linked(self, storage: Storage) -> Iterator[tuple[Storage, Value, Callable[[], Value]]]:
        """(storage, link flag, its contents after `storage` changed, where the flag holds)
        for each link from or to `storage`."""
        for link in list(storage.links):   # this storage may be part of the target: write it there
            target = link.target
            if not self._in_scope(target):
                continue
            yield target, link.flag, lambda link=link, target=target: self.scatter(
                self.storage_value(target), link.chain, storage.value)
        for link in list(storage.dependents):   # another storage may be part of this one: read it again
            alias = link.alias
            if alias is None or alias.value is None or not self._in_scope(alias):
                continue
            yield alias, link.flag, lambda link=link: self.apply_chain(storage.value, link.chain)

    def _in_scope(self, storage: Storage) -> bool:
        """Whether the program can still reach `storage`: it was made in a region enclosing this
        one. (One made in a branch or an earlier trace of a loop body is gone: what a region
        hands on is a new storage of the merge.)"""
        return storage.region is None or any(r is storage.region for r in self.chain)

    def select(self, flag: Value | bool, then_fn: Callable[[], Value], else_fn: Callable[[], Value]) -> Value:
        """An IF op choosing between two values computed in its branches."""
        if flag is True:
            return then_fn()
        if flag is False:
            return else_fn()
        regions = []
        for fn, kind in ((then_fn, "then"), (else_fn, "else")):
            region = Region()
            with self.in_region(region, RegionInfo(kind)):
                region.yields = [fn()]
            regions.append(region)
        return self.emit(Op.IF, [flag], result_types=[regions[0].yields[0].type], regions=regions)[0]

    def link(self, alias: Storage, target: Storage, chain: Chain, flag: Value):
        Link(alias, target, chain, flag)

    # -- emission -------------------------------------------------------------------
    def emit(self, op: Op, operands: list[Value], attrs: dict | None = None, *,
             result_types: list[TensorType] | None = None, regions: list[Region] | None = None,
             loc: SourceLoc | None = None) -> list[Value]:
        attrs = attrs or {}
        if result_types is None:
            try:
                result_types = [infer_type(op, [v.type for v in operands], attrs)]
            except Exception as e:   # torch explains the shape/dtype problem
                raise UnsupportedError(f"invalid {op.name.lower()}: {e}") from None
        results = [Value(t) for t in result_types]
        operation = Operation(op, list(operands), results, attrs, regions or [], loc or user_location(2))
        self.region.ops.append(operation)
        for r in results:
            self.value_region[r.id] = self.region
            self.producer[r.id] = operation
        return results

    def emit1(self, op: Op, operands: list[Value], **attrs) -> Value:
        return self.emit(op, operands, attrs)[0]

    def add_result(self, operation: Operation, type: TensorType) -> Value:
        """One more result of a control-flow op emitted earlier."""
        value = Value(type)
        operation.results.append(value)
        self.value_region[value.id] = self.value_region[operation.results[0].id]
        self.producer[value.id] = operation
        return value

    def constant(self, tensor: torch.Tensor) -> Value:
        name = self._constant_names.get(id(tensor))
        if name is None:
            name = self.param_names.get(id(tensor)) or f"const{len(self.constants)}"
            self._constant_names[id(tensor)] = name
            self.constants[name] = tensor
        return self._hoist(("const", name), Op.CONST, {"name": name}, TensorType.of(tensor))

    def scalar(self, value: bool | int | float, dtype: torch.dtype) -> Value:
        return self._hoist(("scalar", type(value), value, dtype), Op.SCALAR,
                           {"value": value, "dtype": dtype}, TensorType((), dtype))

    def true(self) -> Value:
        return self.scalar(True, torch.bool)

    def false(self) -> Value:
        return self.scalar(False, torch.bool)

    def zeros(self, type: TensorType) -> Value:
        if type == BOOL:
            return self.false()
        if type.shape == ():
            return self.scalar(False if type.dtype == torch.bool else 0, type.dtype)
        return self.emit1(Op.FULL, [], shape=type.shape, value=0, dtype=type.dtype)

    def _hoist(self, key: tuple, op: Op, attrs: dict, type: TensorType) -> Value:
        """Constants and scalars go to the top of the current function, once each."""
        root = self.chain[0]
        key = (id(root),) + key
        value = self._hoisted.get(key)
        if value is None:
            value = Value(type)
            operation = Operation(op, [], [value], attrs, [], None)
            n = self._hoisted_count.get(id(root), 0)   # counted, not searched: a big model has thousands
            if n > len(root.ops) or (n and root.ops[n - 1].op not in (Op.CONST, Op.SCALAR)):
                n = sum(1 for o in root.ops if o.op in (Op.CONST, Op.SCALAR))
            root.ops.insert(n, operation)
            self._hoisted_count[id(root)] = n + 1
            self.value_region[value.id] = root
            self.producer[value.id] = operation
            self._hoisted[key] = value
        return value

    # -- Python needs a concrete value ------------------------------------------------
    def concretize(self, proxy: Proxy, what: str):
        """Python asked for the value of a tensor (bool(), int(), an index into a list).
        If it only depends on the index of loops with a Python trip count, unrolling those
        loops makes it a Python value: restart capture with them unrolled."""
        loops, other = self._loop_indices_behind(self.value_of(proxy))
        if loops and not other:
            raise Restart("unroll", loops[0])
        unread = (" cocktailer could not read the source of " + ", ".join(sorted(self.unconverted)) +
                  ", so its control flow runs as plain Python;") if self.unconverted else ""
        raise UnsupportedError(
            f"Python needs the value of a tensor here ({what}), but it is only known when the program runs.{unread}",
            hint="keep tensor-dependent decisions in `if`/`while` statements of functions cocktailer converts, "
                 "index lists and ModuleLists only with Python ints or loop variables of `range(<python int>)`, "
                 "and index tensors with tensors")

    def _loop_indices_behind(self, value: Value) -> tuple[list, bool]:
        loops, other, seen, todo = [], False, set(), [value]
        while todo:
            v = todo.pop()
            if v.id in seen:
                continue
            seen.add(v.id)
            op = self.producer.get(v.id)
            if op is not None:
                if op.op in CREATION or op.op is Op.CONST:
                    continue
                if op.regions or op.op is Op.CALL:
                    other = True
                todo.extend(op.operands)
                continue
            region = self.value_region.get(v.id)
            info = self.region_info.get(id(region)) if region is not None else None
            if info and info.kind == "body" and info.static_trip and self.param_index.get(v.id) == 0:
                loops.append(info.loop_key)
            else:
                other = True
        return loops, other
