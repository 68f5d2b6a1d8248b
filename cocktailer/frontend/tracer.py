"""The tracer: builds IR while the user's (converted) Python runs on proxy tensors.

A `Proxy` is a storage-less tensor standing for an IR value. Python variables hold
proxies; an in-place write (`k[:, i] = v`, `x.add_(y)`) rebinds the proxy to a new
value (the IR stays functional) and is logged per region, so that a branch or loop that
writes a tensor defined outside it yields the new value as an output.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from cocktailer.errors import UnsupportedError, user_location
from cocktailer.ir import (CREATION, Function, Op, Operation, Region, SourceLoc, TensorType, Value,
                           infer_type)


class Restart(BaseException):
    """Capture must start over knowing more: a loop to unroll, a recursive function.
    A BaseException so that user code's `except Exception` cannot swallow it."""

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


class Proxy(torch.Tensor):
    """A tensor during capture: an IR value and its static type, no data."""

    @staticmethod
    def __new__(cls, value: Value, tracer: "Tracer"):
        t = value.type
        return torch.Tensor._make_wrapper_subclass(cls, t.shape, dtype=t.dtype, device=tracer.device)

    def __init__(self, value: Value, tracer: "Tracer"):
        self.value = value
        self.tracer = tracer
        self.view_of: Proxy | None = None   # base proxy when this tensor is a view of another
        self.view_version = 0               # base.version when the view was taken
        self.view_key = None                # (SELECT key, dynamic indices) when the view is x[key] of its base
        self.version = 0                    # bumped by every in-place write

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise UnsupportedError(f"a captured tensor reached `{func}` outside of cocktailer's capture "
                               "(it was kept after capture ended, or used from another thread)")

    def __repr__(self) -> str:
        return f"Proxy(%{self.value.id}: {self.value.type})"


def is_proxy(x) -> bool:
    return isinstance(x, Proxy)


class Tracer:
    def __init__(self, device: torch.device, param_names: dict[int, str], hints: dict[str, set]):
        self.device = device
        self.param_names = param_names      # id(tensor) -> qualified parameter/buffer name
        self.hints = hints                  # "unroll": loop keys, "recursive": function keys
        self.constants: dict[str, torch.Tensor] = {}
        self._constant_names: dict[int, str] = {}
        self.functions: dict[str, Function] = {}
        self.chain: list[Region] = []                  # current function's regions, outermost first
        self.mutation_logs: list[dict[Proxy, Value]] = []
        self.value_region: dict[int, Region] = {}
        self.region_info: dict[int, RegionInfo] = {}
        self.producer: dict[int, Operation] = {}
        self.param_index: dict[int, int] = {}          # region parameter -> its position
        self._hoisted: dict[tuple, Value] = {}         # per function: constants and scalars
        self.unconverted: set[str] = set()             # user functions whose source could not be read

    # -- regions --------------------------------------------------------------------
    @contextmanager
    def in_region(self, region: Region, info: RegionInfo, new_function: bool = False) -> Iterator[dict]:
        """Trace into `region`; yields its mutation log (proxy -> value before the region)."""
        saved = (self.chain, self.mutation_logs)
        if new_function:
            self.chain, self.mutation_logs = [], []
        self.chain = self.chain + [region]
        self.mutation_logs = self.mutation_logs + [{}]
        self.region_info[id(region)] = info
        self.set_params(region, region.params)
        try:
            yield self.mutation_logs[-1]
        finally:
            self.chain, self.mutation_logs = saved

    def set_params(self, region: Region, params: list[Value]):
        region.params = params
        for i, p in enumerate(params):
            self.value_region[p.id] = region
            self.param_index[p.id] = i

    def outer_mutations(self, log: dict[Proxy, Value], region: Region) -> dict[Proxy, Value]:
        """The proxies written in `region` that existed before it, with their old values."""
        inside = {id(r) for r in self._regions_within(region)}
        return {p: old for p, old in log.items() if id(self.value_region[old.id]) not in inside}

    def _regions_within(self, region: Region) -> Iterator[Region]:
        yield region
        for op in region.ops:
            for r in op.regions:
                yield from self._regions_within(r)

    @property
    def region(self) -> Region:
        return self.chain[-1]

    # -- values ---------------------------------------------------------------------
    def new_param(self, type: TensorType, hint: str = "") -> Value:
        return Value(type, hint)

    def wrap(self, value: Value) -> Proxy:
        return Proxy(value, self)

    def value_of(self, x) -> Value:
        """The IR value of a proxy or a real tensor (a constant); checks it may be read here."""
        if isinstance(x, Proxy):
            if x.tracer is not self:
                raise UnsupportedError("a tensor from another capture was used here")
            if x.view_of is not None and x.view_of.version != x.view_version:
                raise UnsupportedError(
                    "a view of a tensor is read after the tensor was written in place",
                    hint="take the view again after the write (cocktailer keeps tensors functional)")
            self.check_visible(x.value)
            return x.value
        if isinstance(x, torch.Tensor):
            return self.constant(x)
        raise TypeError(f"expected a tensor, got {type(x).__name__}")

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

    def rebind(self, proxy: Proxy, value: Value):
        """An in-place write: `proxy` now stands for `value`. A write into `base[key]`
        (a view) also writes the base, as torch's shared memory would."""
        base = proxy.view_of
        if base is not None:
            if proxy.view_key is None:
                raise UnsupportedError(
                    "in-place write into a reshaped, transposed or twice-indexed view of another tensor",
                    hint="write through the original tensor with one index, e.g. `k[:, :, i, :] = v`")
            self.value_of(proxy)   # refuses a stale view
            key, dynamic = proxy.view_key
            new_base = self.emit1(Op.UPDATE, [base.value, value] + [self.value_of(d) for d in dynamic], key=key)
            self.rebind(base, new_base)
            proxy.view_version = base.version
        self.mutation_logs[-1].setdefault(proxy, proxy.value)
        proxy.value = value
        proxy.version += 1

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

    def _hoist(self, key: tuple, op: Op, attrs: dict, type: TensorType) -> Value:
        """Constants and scalars go to the top of the current function, once each."""
        root = self.chain[0]
        key = (id(root),) + key
        value = self._hoisted.get(key)
        if value is None:
            value = Value(type)
            operation = Operation(op, [], [value], attrs, [], None)
            n = sum(1 for o in root.ops if o.op in (Op.CONST, Op.SCALAR))
            root.ops.insert(n, operation)
            self.value_region[value.id] = root
            self.producer[value.id] = operation
            self._hoisted[key] = value
        return value

    @contextmanager
    def reopen(self, region: Region):
        """Append to a region traced earlier (to fill in a value one branch lacks)."""
        saved = (self.chain, self.mutation_logs)
        self.chain = self.chain + [region]
        self.mutation_logs = self.mutation_logs + [{}]
        try:
            yield
        finally:
            self.chain, self.mutation_logs = saved

    # -- Python needs a concrete value ------------------------------------------------
    def concretize(self, proxy: Proxy, what: str):
        """Python asked for the value of a tensor (bool(), int(), an index into a list).
        If it only depends on the index of loops with a Python trip count, unrolling those
        loops makes it a Python value: restart capture with them unrolled."""
        loops, other = self._loop_indices_behind(proxy.value)
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
