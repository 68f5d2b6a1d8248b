"""Torch calls seen during capture, lowered to IR ops.

`lower_call(tracer, func, args, kwargs)` is what the capture mode calls for every torch
function, tensor method and operator. Handlers are looked up by the function's name (torch
spells the same op as `torch.add`, `Tensor.add`, `Tensor.__add__`); the few names whose
signature differs between `torch.*` and `torch.nn.functional.*` are looked up by identity
first. docs/ops.md lists what is supported.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from cocktailer import pytree
from cocktailer.errors import UnsupportedError
from cocktailer.frontend.alias import ViewStep
from cocktailer.frontend.tracer import Proxy, SizeProxy, Tracer, is_proxy, type_of
from cocktailer.ir import Op, Sym, SymbolicSizeError, TensorType, Value, infer_type
from cocktailer.ir.ops import SEMANTICS

Handler = Callable[..., Any]
_BY_NAME: dict[str, Handler] = {}
_BY_IDENTITY: dict[Any, Handler] = {}

_RANDOM = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
           "bernoulli", "multinomial", "uniform_", "normal_", "exponential_", "random_", "poisson"}
_FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "as_tensor", "zeros_like", "ones_like",
              "full_like", "empty_like", "scalar_tensor", "eye", "linspace"}


def register(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for n in names:
            _BY_NAME[n] = fn
        return fn
    return deco


class Lowering:
    """Helpers handlers use: values of arguments, emitting ops, new tensors and views."""

    def __init__(self, tracer: Tracer):
        self.t = tracer

    def val(self, x) -> Value:
        return self.t.value_of(x)

    def out(self, op: Op, operands: Sequence, **attrs) -> Proxy:
        """A new tensor: `op` of the operands."""
        return self.t.fresh(self.t.emit(op, [self.val(o) for o in operands], attrs)[0])

    def meta(self, x) -> torch.Tensor:
        """x's layout: a meta tensor with its sizes and strides."""
        return x.meta if isinstance(x, Proxy) else self.t.const_storage(x).meta

    def view(self, x, op: Op, meta: torch.Tensor, dynamic: Sequence = (), **attrs) -> Proxy:
        """A view of x (memory shared with it): `op` applied to it, with layout `meta`."""
        return self.t.view(x, ViewStep.make(op, [self.val(d) for d in dynamic], **attrs), meta)

    def scalar_like(self, x: numbers.Number, others: Sequence) -> Value:
        """A Python number as a 0-d value of the dtype torch computes with next to `others`."""
        tensors = [o for o in others if isinstance(o, torch.Tensor)]
        if tensors:
            dtype = torch.result_type(_meta(tensors[0]), x)
        else:
            dtype = torch.bool if isinstance(x, bool) else torch.int64 if isinstance(x, int) else torch.get_default_dtype()
        return self.t.scalar(x, dtype)

    def elementwise(self, op: Op, *args) -> Proxy:
        operands = [self.scalar_like(a, args) if _is_number(a) else self.val(a) for a in args]
        return self.t.fresh(self.t.emit(op, operands, {})[0])

    def reshape(self, x, shape) -> Proxy:
        """A view where torch's reshape gives one (the layout allows it), else a copy."""
        if type_of(x).syms or _syms(shape):
            return self._reshape_symbolic(x, tuple(shape))
        shape = tuple(_meta(x).reshape(shape).shape)   # resolves -1
        if shape == tuple(x.shape):
            return x
        _check_layout_known(x, "reshaping")
        meta = self.meta(x).reshape(shape)
        if _shares_memory(meta, self.meta(x)):
            return self.view(x, Op.RESHAPE, meta, shape=shape)
        return self.out(Op.RESHAPE, [x], shape=shape)

    def permute(self, x, dims) -> Proxy:
        dims = tuple(d % max(x.dim(), 1) for d in dims)
        if dims == tuple(range(x.dim())):
            return x
        return self.view(x, Op.PERMUTE, self.meta(x).permute(dims), dims=dims)

    def _reshape_symbolic(self, x, shape: tuple) -> Proxy:
        """A reshape of a tensor of symbolic sizes, or to sizes read off one (`x.shape[0]`):
        each symbolic size must stay one whole dim (`x.unsqueeze(1)`, `x.view(n, 1, -1)`;
        type inference checks it at two values, else the sizes are specialized). A view: of a
        contiguous layout, which it is for every size, or one that only inserts or removes dims
        of size 1, for any layout; another reshape of a non-contiguous layout specializes."""
        ty = _symbolic_operand(x, shape)
        out = infer_type(Op.RESHAPE, [ty], {"shape": shape})   # resolves -1
        if out.shape == ty.shape:
            return x
        _check_layout_known(x, "reshaping")
        if not (self.meta(x).is_contiguous() or _ones_only(ty.shape, out.shape)):
            # whether torch gives a view could depend on the sizes (strides are their products)
            raise SymbolicSizeError(ty.syms, "a reshape of a non-contiguous layout")
        return self.view(x, Op.RESHAPE, self.meta(x).reshape(out.hinted.shape), shape=out.shape)

    def expand(self, x, shape) -> Proxy:
        """x broadcast to `shape` (-1: x's size), a view; x itself where that changes nothing."""
        shape = tuple(shape)
        if type_of(x).syms or _syms(shape):
            ty = _symbolic_operand(x, shape)
            out = infer_type(Op.EXPAND, [ty], {"shape": shape})
            return x if out.shape == ty.shape else \
                self.view(x, Op.EXPAND, self.meta(x).expand(out.hinted.shape), shape=out.shape)
        meta = self.meta(x).expand(shape)
        return x if meta.shape == x.shape else self.view(x, Op.EXPAND, meta, shape=tuple(meta.shape))

    def cast(self, x, dtype: torch.dtype):
        if dtype is None or x.dtype == dtype:
            return x
        return self.out(Op.CAST, [x], dtype=dtype)

    def linear(self, x, w, b=None):
        y = self.out(Op.MATMUL, [x, self.permute(w, (1, 0))])
        return y if b is None else self.elementwise(Op.ADD, y, b)

    def select(self, x, key: list, dynamic: list):
        try:
            meta = SEMANTICS[Op.SELECT](self.meta(x), *(_META_INDEX for _ in dynamic), key=tuple(key))
        except IndexError as e:   # a constant index past a size known here: eager raises it on these inputs too
            e.cocktailer_user_raise = True
            raise
        return self.view(x, Op.SELECT, meta, dynamic, key=tuple(key))

    def copy(self, x) -> Proxy:
        """A new tensor with x's contents (and, as `clone()` keeps it, x's layout)."""
        proxy = self.t.fresh(self.val(x), torch.empty_like(self.meta(x)))
        proxy.storage.layout_varies = isinstance(x, Proxy) and x.storage.layout_varies
        return proxy

    def write(self, x, value) -> Proxy:
        """x, written in place with `value` (broadcast and cast to x, as torch's in-place ops do)."""
        value = value if isinstance(value, torch.Tensor) else self.t.fresh(self.t.scalar(value, x.dtype))
        if not torch.can_cast(value.dtype, x.dtype):
            raise UnsupportedError(f"result type {_dtype_name(value.dtype)} can't be cast to the desired output type "
                                   f"{_dtype_name(x.dtype)} (an in-place op on a {_dtype_name(x.dtype)} tensor)",
                                   hint="cast the tensor first, or compute out of place")
        if tuple(value.shape) != tuple(x.shape):
            if torch.broadcast_shapes(tuple(value.shape), tuple(x.shape)) != tuple(x.shape):
                raise UnsupportedError(f"an in-place op's result has shape {tuple(value.shape)}, which does not "
                                       f"broadcast to the written tensor's {tuple(x.shape)}")
            value = self.expand(value, tuple(x.shape))
        self.t.write(x, self.val(self.cast(value, x.dtype)))
        return x


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.int64: "Long", torch.int32: "Int",
            torch.bool: "Bool", torch.float16: "Half"}.get(dtype, str(dtype).removeprefix("torch."))


def _check_layout_known(x, what: str):
    if isinstance(x, Proxy) and x.storage.layout_varies:
        raise UnsupportedError(f"{what} a tensor whose memory layout (strides) depends on the path taken: torch "
                               "would give a view on one path and a copy on another",
                               hint="call `.contiguous()` on it where it is assigned, or `.clone()` it")


_META_INDEX = torch.zeros((), dtype=torch.int64, device="meta")


def _is_number(x) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, torch.Tensor)


def _meta(x) -> torch.Tensor:
    return torch.empty(tuple(x.shape), dtype=x.dtype, device="meta")


def _dims(dim, rank: int) -> tuple[int, ...] | None:
    if dim is None:
        return None
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(rank, 1) for d in dims)


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _shape_args(args) -> tuple:
    """A shape given as sizes or as one sequence; a size read off a tensor of symbolic size
    (`x.shape[0]`) as its Sym (only handlers that let it through, _SIZED_VIEWS, meet one)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = args[0]
    return tuple(a.sym if isinstance(a, SizeProxy) else a for a in args)


def _syms(shape) -> tuple:
    return tuple(d for d in shape if isinstance(d, Sym))


def _ones_only(shape: tuple, new_shape: tuple) -> bool:
    """The reshape only inserts or removes dims of size 1 (unsqueeze, squeeze): a view of any
    layout, for every size."""
    return [d for d in shape if d != 1] == [d for d in new_shape if d != 1]


def _symbolic_operand(x, shape: tuple) -> TensorType:
    """x's type, where `shape` may name only x's own symbolic sizes."""
    ty = type_of(x)
    foreign = tuple(d for d in _syms(shape) if d not in ty.syms)
    if foreign:   # a size of another tensor: nothing ties x's sizes to it
        raise SymbolicSizeError(foreign, "a shape of another tensor's size")
    return ty


def _has_tensor(tree) -> bool:
    if isinstance(tree, torch.Tensor):
        return True
    if isinstance(tree, (tuple, list)):
        return any(_has_tensor(x) for x in tree)
    if isinstance(tree, dict):
        return any(_has_tensor(x) for x in tree.values())
    return False


# -- entry point ---------------------------------------------------------------------

_METADATA = {"dim", "size", "numel", "nelement", "ndimension", "is_floating_point", "is_complex",
             "element_size", "get_device", "is_contiguous", "__len__", "__hash__", "__repr__", "has_names",
             "is_signed", "_is_view", "storage_offset", "stride", "__reduce_ex__", "__dir__", "__sizeof__",
             "data_ptr"}


# Python asks for the value: only possible when it is known at capture (see Tracer.concretize):
# a loop index formatted into a name (`getattr(self, f"layer{i}")`) unrolls the loop.
_CONCRETE = {"__bool__": "bool()", "__int__": "int()", "__float__": "float()", "__index__": "an index",
             "__complex__": "complex()", "tolist": ".tolist()", "numpy": ".numpy()", "__array__": "a numpy array",
             "__format__": "formatting it into a string", "__str__": "str()"}


def lower_call(tracer: Tracer, func, args: tuple, kwargs: dict):
    name = getattr(func, "__name__", "")
    if tracer.symbolic:
        shape = _symbolic_shape(tracer, func, name, args)
        if shape is not None:
            return shape
        _specialize_sizes(func, args, kwargs, name)
    if name == "__get__":      # a property: metadata (shape, dtype, ...) or .T / .data
        return _lower_property(tracer, func, args)
    if name in _METADATA:
        if name == "__repr__" and is_proxy(args[0]):
            return repr(args[0])
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)
    if name in _CONCRETE:
        if is_proxy(args[0]):
            tracer.concretize(args[0], _CONCRETE[name])
        with torch._C.DisableTorchFunction():   # a constant tensor: its value is known now
            return func(*args, **kwargs)
    if name in _RANDOM:
        raise UnsupportedError(f"random op `{name}` cannot be compiled (results would not be reproducible)",
                               hint="pass random tensors in as inputs")
    handler = _BY_IDENTITY.get(func) or _BY_NAME.get(name) or _inplace_handler(name)
    if handler is None:
        if not _has_tensor((args, kwargs)) and name not in _FACTORIES:
            with torch._C.DisableTorchFunction():   # grad mode queries, dtype helpers, ...
                return func(*args, **kwargs)
        raise UnsupportedError(f"unsupported torch op `{_qualname(func)}`",
                               hint="see docs/ops.md for the supported ops; write it with those")
    L = Lowering(tracer)
    out = kwargs.pop("out", None)
    in_place = kwargs.get("inplace") is True
    if in_place:
        kwargs["inplace"] = False
    born = tracer.stamp()
    result = handler(L, *args, **kwargs)
    if _layout_matters(args, kwargs):
        result = _torch_layout(tracer, func, args, kwargs, result, born)
    if in_place and result is not args[0]:   # F.relu(x, inplace=True), nn.ReLU(inplace=True)
        return L.write(args[0], result)
    if out is not None:
        return _write_out(L, out, result)
    return result


# What a tensor of a symbolic size may meet: indexing (checked op by op by the type rules, which
# know which dims it reads at run time) and metadata that does not depend on sizes.
_SIZE_BLIND_NAMES = {"__getitem__", "dim", "ndimension", "is_floating_point", "is_complex", "element_size",
                     "get_device", "is_signed", "__hash__", "__repr__", "has_names", "__reduce_ex__", "__dir__"}
_SIZE_PROPERTIES = ("shape", "H", "mH")   # `.T` and `.mT` are permutes (_lower_property): sizes not read
_NEW_LIKE = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}   # self: only its dtype and device


# Handlers that never read their operands' sizes: they emit one op (or a few) whose result
# type inference derives from the operands' types, symbolic sizes included (`ir.infer`).
# The unary and binary elementwise names join it where they are registered.
_SHAPE_POLYMORPHIC = {
    "gelu", "leaky_relu", "relu6", "hardtanh", "div", "divide",
    "where", "masked_fill", "clamp", "clip", "clamp_min", "clamp_max", "dropout", "transpose", "swapaxes", "t",
    "permute", "cat", "concat", "concatenate",
    "sum", "mean", "amax", "amin", "softmax", "log_softmax",
    "matmul", "mm", "__matmul__", "linear", "addmm", "__setitem__",
    "zeros_like", "ones_like", "empty_like", "full_like",   # their shape is read as the type's (`_like`)
    "embedding",   # a gather of rows: as many as the index has
    "max", "min", "argmax", "argmin", "norm", "layer_norm", "stack",   # reductions by their kernels' run-time counts
    "clone", "__deepcopy__", "contiguous", "detach", "to", "type", "type_as", "float", "double", "half", "bfloat16",
    "long", "int", "bool", "cpu", "cuda",
    "split", "chunk",   # they slice by the dim's size: of a symbolic dim, only partly (type inference refuses that)
}
# Views of new sizes that take a symbolic size through as a whole dim: their handlers read the
# IR type's shape, and sizes read off the tensor (`x.shape[0]`) as Syms (Lowering.reshape).
_SIZED_VIEWS = {"reshape", "view", "unsqueeze", "squeeze", "flatten", "expand"}
# Factories that take a symbolic size as a size (`torch.zeros(seq_len, h)`, `x.new_zeros(steps, b, h)`).
_SIZED_FACTORIES = {"zeros", "empty", "ones", "full", "new_zeros", "new_empty", "new_ones", "new_full"}


def _size_blind(func, name: str) -> bool:
    if name == "__get__":
        return not any(getattr(func, "__self__", None) is getattr(torch.Tensor, p) for p in _SIZE_PROPERTIES)
    base = _inplace_base(name)   # an in-place op writes its out-of-place result (L.write checks the shapes)
    return name in _SIZE_BLIND_NAMES or name in _SHAPE_POLYMORPHIC or name in _SIZED_VIEWS or \
        base is not None and (base in _SHAPE_POLYMORPHIC or f"__{base}__" in _SHAPE_POLYMORPHIC)


def _symbolic_shape(tracer: Tracer, func, name: str, args: tuple):
    """`x.shape`, `x.size()` and `x.size(d)` of a tensor of symbolic size: its symbolic dims as
    SizeProxy (a loop may run that many times), the others as ints. None for anything else."""
    x = args[0] if args else None
    if not isinstance(x, Proxy) or not x.storage.type.syms:
        return None
    shape = type_of(x).shape
    if name == "__get__" and getattr(func, "__self__", None) is torch.Tensor.shape or name == "size" and len(args) == 1:
        return tuple(_size_proxy(tracer, x, n) if isinstance(n, Sym) else n for n in shape)
    if name == "size" and len(args) == 2 and isinstance(args[1], int):
        n = shape[args[1]]
        return _size_proxy(tracer, x, n) if isinstance(n, Sym) else n
    return None


def _size_proxy(tracer: Tracer, x: Proxy, sym: Sym):
    """The size `sym`, read off x's storage (a view of it, `x.transpose(0, 1)`, has it too:
    reading it there needs no copy of the view)."""
    return tracer.size_of(tracer.on(x.storage), x.storage.type.shape.index(sym))


def _specialize_sizes(func, args, kwargs, name: str):
    """Any other torch function of a tensor of a symbolic size gets its size as a number (its
    handler may compute with `x.shape` and bake it in), and so does any use of a symbolic size
    itself but its own metadata (a loop's trip count is taken before it reaches torch):
    capture starts over with those sizes specialized."""
    leaves = pytree.flatten((args, kwargs))[0]
    sized = [] if _size_blind(func, name) else [x for x in leaves if isinstance(x, Proxy) and
                                                not (name in _NEW_LIKE and x is args[0])]
    syms = tuple(s for x in sized for s in type_of(x).syms)
    own_metadata = name in _METADATA or name == "__get__"
    syms += tuple(x.sym for x in leaves if isinstance(x, SizeProxy) and not (own_metadata and x is args[0])
                  and name not in _SIZED_FACTORIES and name not in _SIZED_VIEWS)
    if syms:
        raise SymbolicSizeError(tuple(dict.fromkeys(syms)), f"`{name}`")


def _write_out(L: Lowering, out, result):
    """`op(..., out=t)`: the result written into t, which the call returns."""
    if not isinstance(out, torch.Tensor) or not isinstance(result, torch.Tensor):
        raise UnsupportedError("`out=` with several outputs", hint="assign the results instead")
    if tuple(out.shape) != tuple(result.shape):
        raise UnsupportedError(f"`out=` tensor of shape {tuple(out.shape)} for a result of shape "
                               f"{tuple(result.shape)} (torch would resize it)", hint="assign the result instead")
    return L.write(out, result)


def _layout_matters(args, kwargs) -> bool:
    """Whether a tensor argument is laid out other than contiguously: then torch's result
    may be too (elementwise ops keep their inputs' layout), and which later reshapes are
    views depends on it."""
    return any(isinstance(x, Proxy) and (x.storage.layout_varies or not x.meta.is_contiguous())
               for x in pytree.flatten((args, kwargs))[0])


def _torch_layout(t: Tracer, func, args, kwargs, result, born: int):
    """New tensors of `result` with the strides torch gives them (it is asked, on meta tensors)."""
    leaves, spec = pytree.flatten(result if isinstance(result, (tuple, list)) else (result,))
    fresh = [isinstance(x, Proxy) and not x.chain and x.storage.born > born for x in leaves]
    if not any(fresh):
        return result
    metas = pytree.tree_map(lambda x: x.meta if isinstance(x, Proxy) else
                            t.const_storage(x).meta if isinstance(x, torch.Tensor) else x, (args, kwargs))
    try:
        with torch._C.DisableTorchFunction():
            shown = func(*metas[0], **metas[1])
    except Exception:   # no meta kernel, or arguments only cocktailer's lowering accepts: keep the default
        return result
    shown = pytree.flatten(shown if isinstance(shown, (tuple, list)) else (shown,))[0]
    varies = any(isinstance(x, Proxy) and x.storage.layout_varies for x in pytree.flatten((args, kwargs))[0])
    for k, (x, m) in enumerate(zip(leaves, shown)):
        if fresh[k] and isinstance(m, torch.Tensor) and m.shape == x.shape and (m.stride() != x.stride() or varies):
            x.storage.meta = torch.empty_strided(m.shape, m.stride(), dtype=x.dtype, device="meta")
            x.storage.layout_varies = varies
            leaves[k] = t.on(x.storage)
    out = pytree.unflatten(spec, leaves)
    return out if isinstance(result, (tuple, list)) else out[0]


def _qualname(func) -> str:
    module = getattr(func, "__module__", None) or ""
    return f"{module}.{getattr(func, '__qualname__', getattr(func, '__name__', func))}".lstrip(".")


def _lower_property(tracer: Tracer, getter, args):
    x = args[0]
    descriptor = getattr(getter, "__self__", None)   # `x.T` reaches here as the descriptor's __get__
    prop = next((n for n in ("T", "mT", "data", "real", "grad") if descriptor is getattr(torch.Tensor, n)), None)
    if prop == "T":
        return Lowering(tracer).permute(x, tuple(reversed(range(x.dim()))))
    if prop == "mT":
        return Lowering(tracer).permute(x, tuple(range(x.dim() - 2)) + (x.dim() - 1, x.dim() - 2))
    if prop == "data":   # the same memory, detached
        return tracer.alias(x)
    if prop == "real" and not x.is_complex():
        return x
    if prop == "grad":
        return None
    with torch._C.DisableTorchFunctionSubclass():
        return getter(*args)


# In-place ops that change a tensor's shape or strides, not its values: a proxy's are fixed.
_RESHAPING_IN_PLACE = {"unsqueeze_", "squeeze_", "t_", "transpose_", "swapdims_", "swapaxes_", "resize_",
                       "resize_as_", "as_strided_", "set_", "share_memory_"}


def _inplace_base(name: str) -> str | None:
    """The out-of-place op of an in-place one: `add_` and `__iadd__` -> `add`."""
    if name.startswith("__i") and name.endswith("__"):
        return name[3:-2]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else None


def _inplace_handler(name: str) -> Handler | None:
    """`x.add_(y)`, `x += y`: compute out of place, then write the result into x's memory."""
    if name in _RESHAPING_IN_PLACE:
        def refuse(L, x, *args, **kwargs):
            raise UnsupportedError(f"`{name}` changes a tensor's shape in place",
                                   hint=f"use the out-of-place `{name[:-1]}` and assign its result")
        return refuse
    base = _inplace_base(name)
    if base is None:
        return None
    handler = _BY_NAME.get(base) or _BY_NAME.get(f"__{base}__")
    if handler is None or base in ("copy", "fill", "zero"):
        return None

    def inplace(L: Lowering, x, *args, **kwargs):
        return L.write(x, handler(L, x, *args, **kwargs))
    return inplace


# -- elementwise -----------------------------------------------------------------------

def _unary(op: Op):
    def h(L: Lowering, x, *args, **kwargs):
        return L.elementwise(op, x)
    return h


for _op, _names in {
    Op.NEG: ("neg", "negative", "__neg__"), Op.ABS: ("abs", "__abs__"), Op.EXP: ("exp",), Op.LOG: ("log",),
    Op.SQRT: ("sqrt",), Op.RSQRT: ("rsqrt",), Op.RECIPROCAL: ("reciprocal",), Op.TANH: ("tanh",),
    Op.SIGMOID: ("sigmoid",), Op.RELU: ("relu",), Op.SILU: ("silu",), Op.SIN: ("sin",), Op.COS: ("cos",),
    Op.ERF: ("erf",), Op.FLOOR: ("floor",), Op.CEIL: ("ceil",), Op.NOT: ("logical_not",),
}.items():
    register(*_names)(_unary(_op))
    _SHAPE_POLYMORPHIC.update(_names)


@register("gelu")
def _gelu(L, x, approximate="none"):
    if approximate != "none":
        raise UnsupportedError(f"gelu(approximate={approximate!r})", hint="use approximate='none'")
    return L.elementwise(Op.GELU, x)


@register("__invert__", "bitwise_not")
def _invert(L, x):
    if x.dtype != torch.bool:
        raise UnsupportedError("bitwise not of an integer tensor", hint="only bool tensors support `~` here")
    return L.elementwise(Op.NOT, x)


def _binary(op: Op, swap: bool = False):
    def h(L: Lowering, a, b, *, alpha=None):
        if alpha is not None and alpha != 1:
            b = L.elementwise(Op.MUL, b, alpha)
        return L.elementwise(op, b, a) if swap else L.elementwise(op, a, b)
    return h


for _op, _names, _rnames in [
    (Op.ADD, ("add", "__add__"), ("__radd__",)), (Op.SUB, ("sub", "subtract", "__sub__"), ("__rsub__", "rsub")),
    (Op.MUL, ("mul", "multiply", "__mul__"), ("__rmul__",)),
    (Op.DIV, ("true_divide", "__truediv__", "__div__"), ("__rtruediv__", "__rdiv__")),
    (Op.FLOORDIV, ("floor_divide", "__floordiv__"), ("__rfloordiv__",)),
    (Op.MOD, ("remainder", "__mod__"), ("__rmod__",)), (Op.POW, ("pow", "__pow__"), ("__rpow__",)),
    (Op.MAXIMUM, ("maximum",), ()), (Op.MINIMUM, ("minimum",), ()),
    (Op.EQ, ("eq", "__eq__"), ()), (Op.NE, ("ne", "not_equal", "__ne__"), ()), (Op.LT, ("lt", "less", "__lt__"), ()),
    (Op.LE, ("le", "less_equal", "__le__"), ()), (Op.GT, ("gt", "greater", "__gt__"), ()),
    (Op.GE, ("ge", "greater_equal", "__ge__"), ()), (Op.AND, ("logical_and",), ()), (Op.OR, ("logical_or",), ()),
    (Op.XOR, ("logical_xor",), ()),
]:
    register(*_names)(_binary(_op))
    register(*_rnames)(_binary(_op, swap=True))
    _SHAPE_POLYMORPHIC.update(_names + _rnames)


@register("div", "divide")
def _div(L, a, b, *, rounding_mode=None):
    if rounding_mode is None:
        return L.elementwise(Op.DIV, a, b)
    if rounding_mode == "floor":
        return L.elementwise(Op.FLOORDIV, a, b)
    raise UnsupportedError(f"div(rounding_mode={rounding_mode!r})", hint="use rounding_mode='floor' or None")


def _bitwise(op: Op, swap=False):
    def h(L, a, b):
        if any(isinstance(x, torch.Tensor) and x.dtype != torch.bool for x in (a, b)):
            raise UnsupportedError(f"bitwise {op.name.lower()} of integer tensors", hint="use bool tensors")
        return L.elementwise(op, b, a) if swap else L.elementwise(op, a, b)
    return h


register("__and__", "bitwise_and")(_bitwise(Op.AND))
register("__rand__")(_bitwise(Op.AND, True))
register("__or__", "bitwise_or")(_bitwise(Op.OR))
register("__ror__")(_bitwise(Op.OR, True))
register("__xor__", "bitwise_xor")(_bitwise(Op.XOR))


@register("where")
def _where(L, cond, a=None, b=None):
    if a is None:
        raise UnsupportedError("torch.where(cond) with one argument (its result's shape depends on the data)")
    return L.elementwise(Op.WHERE, cond, a, b)


@register("masked_fill")
def _masked_fill(L, x, mask, value):
    return L.cast(L.elementwise(Op.WHERE, mask, value, x), x.dtype)


@register("clamp", "clip")
def _clamp(L, x, min=None, max=None):
    if min is not None:
        x = L.elementwise(Op.MAXIMUM, x, min) if isinstance(min, torch.Tensor) else L.elementwise(Op.WHERE, L.elementwise(Op.LT, x, min), min, x)
    if max is not None:
        x = L.elementwise(Op.MINIMUM, x, max) if isinstance(max, torch.Tensor) else L.elementwise(Op.WHERE, L.elementwise(Op.GT, x, max), max, x)
    return x


register("clamp_min")(lambda L, x, min: _clamp(L, x, min=min))
register("clamp_max")(lambda L, x, max: _clamp(L, x, max=max))


@register("leaky_relu")
def _leaky_relu(L, x, negative_slope=0.01, inplace=False):
    return L.elementwise(Op.WHERE, L.elementwise(Op.GT, x, 0), x, L.elementwise(Op.MUL, x, negative_slope))


@register("relu6", "hardtanh")
def _relu6(L, x, min_val=0.0, max_val=6.0, inplace=False):
    return _clamp(L, x, min_val, max_val)


@register("dropout", "dropout1d", "dropout2d", "feature_dropout", "alpha_dropout")
def _dropout(L, x, p=0.5, training=False, inplace=False):
    if training:
        raise UnsupportedError("dropout in training mode", hint="call model.eval() before compiling")
    return x


@register("type_as")
def _type_as(L, x, other):
    return L.cast(x, other.dtype)


# -- reductions ---------------------------------------------------------------------------

def _reduction(op: Op):
    def h(L, x, dim=None, keepdim=False, *, dtype=None):
        if isinstance(dim, torch.dtype):   # x.sum(torch.float64)
            dim, dtype = None, dim
        dims = _dims(dim, x.dim())
        y = L.out(op, [L.cast(x, dtype)], dims=dims, keepdim=keepdim if dims is not None else False)
        return y
    return h


register("sum")(_reduction(Op.SUM))
register("mean")(_reduction(Op.MEAN))
register("prod")(_reduction(Op.PROD))
register("amax")(_reduction(Op.AMAX))
register("amin")(_reduction(Op.AMIN))
register("any")(_reduction(Op.ANY))
register("all")(_reduction(Op.ALL))


def _arg_reduction(op: Op):
    def h(L, x, dim=None, keepdim=False):
        return L.out(op, [x], dim=None if dim is None else dim % max(x.dim(), 1), keepdim=keepdim)
    return h


register("argmax")(_arg_reduction(Op.ARGMAX))
register("argmin")(_arg_reduction(Op.ARGMIN))


def _max_min(value_op: Op, index_op: Op, elementwise: Op, result_type):
    def h(L, x, dim=None, keepdim=False):
        if isinstance(dim, torch.Tensor):
            return L.elementwise(elementwise, x, dim)
        if dim is None:
            return L.out(value_op, [x], dims=None, keepdim=False)
        d = dim % max(x.dim(), 1)
        values = L.out(value_op, [x], dims=(d,), keepdim=keepdim)
        indices = L.out(index_op, [x], dim=d, keepdim=keepdim)
        return result_type((values, indices))
    return h


register("max")(_max_min(Op.AMAX, Op.ARGMAX, Op.MAXIMUM, torch.return_types.max))
register("min")(_max_min(Op.AMIN, Op.ARGMIN, Op.MINIMUM, torch.return_types.min))


# topk and sort: k rounds of arg-max (or -min), each masking the element it took; static k.
SORT_MAX = 64   # sort unrolls one round per element: longer dims are refused


@register("topk")
def _topk(L, x, k, dim=-1, largest=True, sorted=True, *, out=None):
    """Values in order (largest first, or smallest with largest=False) and their indices;
    among equal values the lower index comes first. torch leaves that order unspecified,
    and with sorted=False any order; this order is one torch may give."""
    if not isinstance(k, int) or out is not None:
        raise UnsupportedError("topk with a tensor k or out=", hint="pass k as a Python int")
    dim = dim % max(x.dim(), 1)
    if not 0 < k <= x.shape[dim]:
        raise UnsupportedError(f"topk with k={k} for a dimension of size {x.shape[dim]}")
    best, fill = (Op.AMAX, _lowest(x.dtype)) if largest else (Op.AMIN, _highest(x.dtype))
    with torch._C.DisableTorchFunction():
        positions = torch.arange(x.shape[dim], device=L.t.device).reshape(
            tuple(-1 if d == dim else 1 for d in range(x.dim())))
    taken = L.elementwise(Op.NE, positions, positions)   # all False
    values, indices = [], []
    for _ in range(k):
        # the best value among those not taken yet, then the first position not taken that
        # holds it (not just the first that holds it: the data may hold the fill value, -inf)
        value = L.out(best, [L.elementwise(Op.WHERE, taken, fill, x)], dims=(dim,), keepdim=True)
        hits = L.elementwise(Op.AND, L.elementwise(Op.EQ, x, value), L.elementwise(Op.NOT, taken))
        index = L.out(Op.ARGMAX, [L.cast(hits, torch.int32)], dim=dim, keepdim=True)
        values.append(value)
        indices.append(index)
        taken = L.elementwise(Op.OR, taken, L.elementwise(Op.EQ, positions, index))
    return torch.return_types.topk((_cat(L, values, dim), _cat(L, indices, dim)))


@register("sort")
def _sort(L, x, dim=-1, descending=False, stable=False, *, out=None):
    dim = dim % max(x.dim(), 1)
    if x.shape[dim] > SORT_MAX:
        raise UnsupportedError(f"sort of a dimension of {x.shape[dim]} elements (at most {SORT_MAX} are supported)",
                               hint="use topk with the k you need")
    values, indices = _topk(L, x, x.shape[dim], dim, largest=descending)
    return torch.return_types.sort((values, indices))


register("argsort")(lambda L, x, dim=-1, descending=False, stable=False: _sort(L, x, dim, descending)[1])


def _lowest(dtype):
    return float("-inf") if dtype.is_floating_point else False if dtype == torch.bool else torch.iinfo(dtype).min


def _highest(dtype):
    return float("inf") if dtype.is_floating_point else True if dtype == torch.bool else torch.iinfo(dtype).max


def _triangle(upper: bool):
    def h(L, x, diagonal=0, *, out=None):
        """Zeros outside the triangle: a constant mask of the last two dims (shapes are static)."""
        if x.dim() < 2:
            raise UnsupportedError(f"{'triu' if upper else 'tril'} of a tensor with fewer than 2 dims")
        with torch._C.DisableTorchFunction():
            ones = torch.ones(x.shape[-2], x.shape[-1], dtype=torch.bool, device=L.t.device)
            keep = ones.triu(diagonal) if upper else ones.tril(diagonal)
        zero = False if x.dtype == torch.bool else 0
        return L.elementwise(Op.WHERE, keep, x, L.t.fresh(L.t.scalar(zero, x.dtype)))
    return h


register("triu")(_triangle(True))
register("tril")(_triangle(False))


@register("cumsum")
def _cumsum(L, x, dim, *, dtype=None, out=None):
    """Along dim, a sum with a triangular mask: out[i] = sum of x[j] for j <= i (floats: one
    matmul with the mask; integers and bools: in int64, as torch gives them)."""
    dim = dim % max(x.dim(), 1)
    x = L.cast(x, dtype or (x.dtype if x.dtype.is_floating_point else torch.int64))
    n = x.shape[dim] if x.dim() else 1
    last = _transpose(L, x, dim, -1) if x.dim() else L.reshape(x, (1,))
    with torch._C.DisableTorchFunction():
        upper = torch.ones(n, n, dtype=x.dtype, device=L.t.device).triu()   # upper[j, i] = j <= i
    if x.dtype.is_floating_point:
        summed = _matmul(L, last, upper)
    else:
        summed = _reduction(Op.SUM)(L, L.elementwise(Op.MUL, _unsqueeze(L, last, -1), upper), -2)
    return _transpose(L, summed, dim, -1) if x.dim() else L.reshape(summed, ())


@register("norm")
def _norm(L, x, p="fro", dim=None, keepdim=False, dtype=None):
    if p not in ("fro", 2, 2.0):
        raise UnsupportedError(f"norm with p={p!r}", hint="only the 2-norm is supported")
    squares = L.elementwise(Op.MUL, x, x)
    return L.elementwise(Op.SQRT, _reduction(Op.SUM)(L, squares, dim, keepdim))


def _variance(root: bool):
    """torch.var / std: the mean of the dims, the sum of the squared differences from it, over
    the count less `correction` (1 unless `unbiased=False`; a count at or below it gives inf or
    nan, as torch); std its square root. The count is a number: sizes are specialized here."""
    def h(L, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
        if isinstance(dim, bool):   # x.var(False): unbiased, not a dim
            dim, unbiased = None, dim
        if not x.dtype.is_floating_point:
            raise UnsupportedError(f"{'std' if root else 'var'} of a {x.dtype} tensor",
                                   hint="torch computes it for floating types only")
        if correction is None:
            correction = 0 if unbiased is False else 1
        dims = _dims(dim, x.dim()) if dim is not None else tuple(range(x.dim())) or None
        count = math.prod(x.shape[d] for d in dims) if dims is not None else 1
        mean = L.out(Op.MEAN, [x], dims=dims, keepdim=dims is not None)
        deviation = L.elementwise(Op.SUB, x, mean)
        squares = L.out(Op.SUM, [L.elementwise(Op.MUL, deviation, deviation)], dims=dims,
                        keepdim=keepdim if dims is not None else False)
        var = L.elementwise(Op.DIV, squares, L.t.fresh(L.t.scalar(float(max(count - correction, 0)), x.dtype)))
        return L.elementwise(Op.SQRT, var) if root else var
    return h


register("var")(_variance(root=False))
register("std")(_variance(root=True))


def _softmax(op: Op):
    def h(L, x, dim=None, _stacklevel=3, dtype=None):
        if dim is None:
            raise UnsupportedError("softmax without `dim`", hint="pass dim explicitly")
        return L.out(op, [L.cast(x, dtype)], dim=dim % max(x.dim(), 1))
    return h


register("softmax")(_softmax(Op.SOFTMAX))
register("log_softmax")(_softmax(Op.LOG_SOFTMAX))


# -- contractions and neural-network functions -----------------------------------------

@register("matmul", "mm", "bmm", "__matmul__")
def _matmul(L, a, b, *, out=None):
    return L.out(Op.MATMUL, [a, b])


register("__rmatmul__")(lambda L, a, b: L.out(Op.MATMUL, [b, a]))


@register("linear")
def _linear(L, x, weight, bias=None):
    return L.linear(x, weight, bias)


@register("addmm")
def _addmm(L, bias, a, b, *, beta=1, alpha=1):
    if beta != 1 or alpha != 1:
        raise UnsupportedError("addmm with alpha/beta", hint="write bias + a @ b")
    return L.elementwise(Op.ADD, L.out(Op.MATMUL, [a, b]), bias)


# -- attention: the math form, from ops that have native kernels --------------------------------

def _attention_weights(L, q, k, mask, scale: float):
    """softmax(q @ k^T * scale + mask) over the last dim; `mask` is None, bool (True: attend)
    or float (added), broadcast to the scores."""
    scores = L.elementwise(Op.MUL, _matmul(L, q, _transpose(L, k, -2, -1)), scale)
    if mask is not None and mask.dtype == torch.bool:
        scores = L.elementwise(Op.WHERE, mask, scores, float("-inf"))
    elif mask is not None:
        scores = L.elementwise(Op.ADD, scores, L.cast(mask, scores.dtype))
    return L.out(Op.SOFTMAX, [scores], dim=scores.dim() - 1)


def _causal_mask(L, n_query: int, n_key: int):
    with torch._C.DisableTorchFunction():
        return torch.ones(n_query, n_key, dtype=torch.bool, device=L.t.device).tril()


@register("scaled_dot_product_attention")
def _sdpa(L, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        raise UnsupportedError("scaled_dot_product_attention with dropout_p > 0 (it is random)",
                               hint="pass dropout_p=self.dropout if self.training else 0.0")
    if enable_gqa:
        raise UnsupportedError("scaled_dot_product_attention with enable_gqa", hint="repeat k and v per head group")
    if is_causal and attn_mask is not None:
        raise UnsupportedError("scaled_dot_product_attention with both attn_mask and is_causal")   # torch refuses too
    mask = _causal_mask(L, q.shape[-2], k.shape[-2]) if is_causal else attn_mask
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _matmul(L, _attention_weights(L, q, k, mask, scale), v)


@register("multi_head_attention_forward")
def _multi_head_attention(L, query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias,
                          bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True,
                          key_padding_mask=None, need_weights=True, attn_mask=None, use_separate_proj_weight=False,
                          q_proj_weight=None, k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                          average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention (sequence-first, as the module passes it): projections, one
    attention per head as a batched matmul, the output projection; the weights too when asked."""
    if bias_k is not None or bias_v is not None or add_zero_attn or static_k is not None or static_v is not None:
        raise UnsupportedError("nn.MultiheadAttention with add_bias_kv, add_zero_attn or static keys")
    if training and dropout_p:
        raise UnsupportedError("nn.MultiheadAttention dropout in training mode (it is random)", hint="call model.eval()")
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = (_unsqueeze(L, t, 1) for t in (query, key, value))
        key_padding_mask = None if key_padding_mask is None else _unsqueeze(L, key_padding_mask, 0)
    (n_query, batch, embed), n_key = query.shape, key.shape[0]
    heads, head_dim = num_heads, embed // num_heads
    if use_separate_proj_weight:
        weights = (q_proj_weight, k_proj_weight, v_proj_weight)
    else:
        weights = _chunk(L, in_proj_weight, 3, 0)
    biases = (None,) * 3 if in_proj_bias is None else _chunk(L, in_proj_bias, 3, 0)

    def heads_first(x, w, b, n):   # (n, batch, embed) -> (batch * heads, n, head_dim)
        return _transpose(L, L.reshape(L.linear(x, w, b), (n, batch * heads, head_dim)), 0, 1)
    q, k, v = (heads_first(x, w, b, n) for x, w, b, n in
               zip((query, key, value), weights, biases, (n_query, n_key, n_key)))
    # is_causal is only a hint about attn_mask here (torch requires the mask with it)
    mask = _mha_mask(L, attn_mask, key_padding_mask, batch, heads, n_key)
    weights = _attention_weights(L, q, k, mask, 1 / math.sqrt(head_dim))
    out = _transpose(L, _matmul(L, weights, v), 0, 1)                       # (n_query, batch * heads, head_dim)
    out = L.linear(L.reshape(out, (n_query * batch, embed)), out_proj_weight, out_proj_bias)
    out = L.reshape(out, (n_query, batch, embed))
    if need_weights:
        weights = L.reshape(weights, (batch, heads, n_query, n_key))
        weights = _reduction(Op.MEAN)(L, weights, 1) if average_attn_weights else weights
    else:
        weights = None
    if unbatched:
        out = _squeeze(L, out, 1)
        weights = None if weights is None else _squeeze(L, weights, 0)
    return out, weights


def _mha_mask(L, attn_mask, key_padding_mask, batch, heads, n_key):
    """nn.MultiheadAttention's masks (bool: True means *not* attended; float: added) as one
    additive float mask that broadcasts to (batch * heads, n_query, n_key), or None."""
    masks = []
    if attn_mask is not None:
        masks.append(attn_mask)
    if key_padding_mask is not None:   # (batch, n_key)
        pad = _expand(L, L.reshape(key_padding_mask, (batch, 1, 1, n_key)), (batch, heads, 1, n_key))
        masks.append(L.reshape(pad, (batch * heads, 1, n_key)))
    total = None
    for m in masks:
        if m.dtype == torch.bool:
            m = L.elementwise(Op.WHERE, m, float("-inf"), 0.0)
        total = m if total is None else L.elementwise(Op.ADD, total, m)
    return total


@register("conv2d")
def _conv2d(L, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same" and _pair(stride) == (1, 1):
            d = _pair(dilation)
            total = [d[i] * (weight.shape[2 + i] - 1) for i in range(2)]
            if any(t % 2 for t in total):
                raise UnsupportedError("conv2d padding='same' with an even kernel", hint="pad explicitly")
            padding = (total[0] // 2, total[1] // 2)
        else:
            raise UnsupportedError(f"conv2d padding={padding!r} with stride {stride}")
    operands = [x, weight] + ([bias] if bias is not None else [])
    return L.out(Op.CONV2D, operands, stride=_pair(stride), padding=_pair(padding), dilation=_pair(dilation),
                 groups=groups)


def _batch_norm_f(L, x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    if training or running_mean is None:
        raise UnsupportedError("batch norm in training mode", hint="call model.eval() before compiling")
    shape = (1, -1) + (1,) * (x.dim() - 2)
    scale = L.elementwise(Op.RSQRT, L.elementwise(Op.ADD, L.reshape(running_var, shape), eps))
    if weight is not None:
        scale = L.elementwise(Op.MUL, scale, L.reshape(weight, shape))
    y = L.elementwise(Op.MUL, L.elementwise(Op.SUB, x, L.reshape(running_mean, shape)), scale)
    return y if bias is None else L.elementwise(Op.ADD, y, L.reshape(bias, shape))


_BY_IDENTITY[F.batch_norm] = _batch_norm_f
_BY_IDENTITY[torch.batch_norm] = (lambda L, x, w, b, mean, var, training, momentum, eps, cudnn=True:
                                  _batch_norm_f(L, x, mean, var, w, b, training, momentum, eps))


@register("layer_norm")
def _layer_norm(L, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    centered = L.elementwise(Op.SUB, x, L.out(Op.MEAN, [x], dims=dims, keepdim=True))
    var = L.out(Op.MEAN, [L.elementwise(Op.MUL, centered, centered)], dims=dims, keepdim=True)
    y = L.elementwise(Op.MUL, centered, L.elementwise(Op.RSQRT, L.elementwise(Op.ADD, var, eps)))
    if weight is not None:
        y = L.elementwise(Op.MUL, y, weight)
    return y if bias is None else L.elementwise(Op.ADD, y, bias)


@register("max_pool2d", "_max_pool2d", "max_pool2d_with_indices")
def _max_pool2d(L, x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    if return_indices:
        raise UnsupportedError("max_pool2d(return_indices=True)")
    stride = kernel_size if stride in (None, ()) else stride
    return L.out(Op.MAX_POOL2D, [x], kernel=_pair(kernel_size), stride=_pair(stride), padding=_pair(padding),
                 dilation=_pair(dilation), ceil_mode=ceil_mode)


@register("avg_pool2d")
def _avg_pool2d(L, x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    if divisor_override is not None:
        raise UnsupportedError("avg_pool2d(divisor_override=...)")
    stride = kernel_size if stride in (None, ()) else stride
    return L.out(Op.AVG_POOL2D, [x], kernel=_pair(kernel_size), stride=_pair(stride), padding=_pair(padding),
                 ceil_mode=ceil_mode, count_include_pad=count_include_pad)


@register("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(L, x, output_size):
    out = tuple(x.shape[-2 + i] if s is None else s for i, s in enumerate(_pair(output_size)))
    if out == (1, 1):
        return L.out(Op.MEAN, [x], dims=(x.dim() - 2, x.dim() - 1), keepdim=True)
    h, w = x.shape[-2:]
    if h % out[0] or w % out[1]:
        raise UnsupportedError(f"adaptive_avg_pool2d from {h}x{w} to {out[0]}x{out[1]} (not a whole divisor)")
    k = (h // out[0], w // out[1])
    return L.out(Op.AVG_POOL2D, [x], kernel=k, stride=k, padding=(0, 0), ceil_mode=False, count_include_pad=True)


def _embedding(L, input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
               sparse=False):
    if max_norm is not None:
        raise UnsupportedError("Embedding(max_norm=...) (it rewrites the weights during the call)")
    return L.out(Op.GATHER, [weight, input], dim=0)


_BY_IDENTITY[F.embedding] = _embedding
_BY_IDENTITY[torch.embedding] = lambda L, weight, input, *rest: _embedding(L, input, weight)


def _split_gates(L, gates, n):
    size = gates.shape[-1] // n
    return [_narrow(L, gates, -1, i * size, size) for i in range(n)]


@register("lstm_cell")
def _lstm_cell(L, x, hx, w_ih, w_hh, b_ih=None, b_hh=None):
    h, c = hx
    gates = L.elementwise(Op.ADD, L.linear(x, w_ih, b_ih), L.linear(h, w_hh, b_hh))
    i, f, g, o = _split_gates(L, gates, 4)
    sig = lambda t: L.elementwise(Op.SIGMOID, t)
    c_next = L.elementwise(Op.ADD, L.elementwise(Op.MUL, sig(f), c),
                           L.elementwise(Op.MUL, sig(i), L.elementwise(Op.TANH, g)))
    h_next = L.elementwise(Op.MUL, sig(o), L.elementwise(Op.TANH, c_next))
    return h_next, c_next


@register("gru_cell")
def _gru_cell(L, x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    gi_r, gi_z, gi_n = _split_gates(L, L.linear(x, w_ih, b_ih), 3)
    gh_r, gh_z, gh_n = _split_gates(L, L.linear(h, w_hh, b_hh), 3)
    r = L.elementwise(Op.SIGMOID, L.elementwise(Op.ADD, gi_r, gh_r))
    z = L.elementwise(Op.SIGMOID, L.elementwise(Op.ADD, gi_z, gh_z))
    n = L.elementwise(Op.TANH, L.elementwise(Op.ADD, gi_n, L.elementwise(Op.MUL, r, gh_n)))
    # h' = (1 - z) * n + z * h  ==  n + z * (h - n)
    return L.elementwise(Op.ADD, n, L.elementwise(Op.MUL, z, L.elementwise(Op.SUB, h, n)))


@register("rnn_tanh_cell")
def _rnn_cell(L, x, h, w_ih, w_hh, b_ih=None, b_hh=None):
    pre = L.elementwise(Op.ADD, L.linear(x, w_ih, b_ih), L.linear(h, w_hh, b_hh))
    return L.elementwise(Op.TANH, pre)


register("rnn_relu_cell")(lambda L, x, h, w_ih, w_hh, b_ih=None, b_hh=None: L.elementwise(
    Op.RELU, L.elementwise(Op.ADD, L.linear(x, w_ih, b_ih), L.linear(h, w_hh, b_hh))))


@register("lstm", "gru", "rnn_tanh", "rnn_relu")
def _full_rnn(L, *args, **kwargs):
    raise UnsupportedError("nn.LSTM/nn.GRU/nn.RNN layers (cuDNN-style fused sequence ops)",
                           hint="write the time loop with nn.LSTMCell/nn.GRUCell: `for t in range(T): h, c = cell(x[t], (h, c))`")


# -- shapes and data movement --------------------------------------------------------------

@register("reshape")
def _reshape(L, x, *shape):
    return L.reshape(x, _shape_args(shape))


@register("view")
def _view(L, x, *shape):
    """Like reshape, but torch refuses where the layout allows no view."""
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise UnsupportedError("view(dtype) reinterpretation")
    shape = _shape_args(shape)
    _check_layout_known(x, "viewing")
    try:
        L.meta(x).view(TensorType(shape, x.dtype).hinted.shape if _syms(shape) else shape)
    except RuntimeError as e:
        raise UnsupportedError(f"view{tuple(shape)}: {e}", hint="use reshape(), or .contiguous() first") from None
    return L.reshape(x, shape)


register("view_as")(lambda L, x, other: _view(L, x, tuple(other.shape)))
register("reshape_as")(lambda L, x, other: L.reshape(x, tuple(other.shape)))


# The shapes below are the IR type's: a symbolic size stays one (never 1: sizes 0 and 1 are
# compiled apart, so squeeze never drops it).

@register("flatten")
def _flatten(L, x, start_dim=0, end_dim=-1):
    if x.dim() == 0:
        return L.reshape(x, (1,))
    s, e, shape = start_dim % x.dim(), end_dim % x.dim(), type_of(x).shape
    return L.reshape(x, shape if s == e else shape[:s] + (-1,) + shape[e + 1:])


@register("unsqueeze")
def _unsqueeze(L, x, dim):
    d, shape = dim % (x.dim() + 1), type_of(x).shape
    return L.reshape(x, shape[:d] + (1,) + shape[d:])


@register("squeeze")
def _squeeze(L, x, dim=None):
    dims = set(range(x.dim())) if dim is None else set(_dims(dim, x.dim()))
    return L.reshape(x, tuple(s for i, s in enumerate(type_of(x).shape) if not (i in dims and s == 1)))


@register("transpose", "swapaxes", "swapdims")
def _transpose(L, x, d0, d1):
    dims = list(range(x.dim()))
    d0, d1 = d0 % x.dim(), d1 % x.dim()
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return L.permute(x, tuple(dims))


register("t")(lambda L, x: L.permute(x, tuple(reversed(range(x.dim())))))
register("permute")(lambda L, x, *dims: L.permute(x, _shape_args(dims)))


@register("expand")
def _expand(L, x, *sizes):
    return L.expand(x, _shape_args(sizes))


register("expand_as")(lambda L, x, other: _expand(L, x, tuple(other.shape)))
register("broadcast_to")(lambda L, x, shape: _expand(L, x, tuple(shape)))


@register("repeat")
def _repeat(L, x, *sizes):
    sizes = _shape_args(sizes)
    x = L.reshape(x, (1,) * (len(sizes) - x.dim()) + tuple(x.shape))
    inter = tuple(v for r, s in zip(sizes, x.shape) for v in (r, s))
    spread = L.reshape(x, tuple(v for s in x.shape for v in (1, s)))
    return L.reshape(L.out(Op.EXPAND, [spread], shape=inter), tuple(r * s for r, s in zip(sizes, x.shape)))


@register("contiguous")
def _contiguous(L, x, memory_format=torch.contiguous_format):
    _check_layout_known(x, "`.contiguous()` of")
    if L.meta(x).is_contiguous():
        return x            # torch returns the tensor itself
    return L.t.fresh(L.val(x))


@register("clone", "__deepcopy__")
def _clone(L, x, *args, memory_format=torch.preserve_format):
    return L.copy(x) if memory_format is torch.preserve_format else L.t.fresh(L.val(x))


@register("detach")
def _detach(L, x):
    return L.t.alias(x)     # a new tensor object for the same memory


@register("requires_grad_", "detach_")
def _self(L, x, *args, **kwargs):
    return x


@register("to", "type")
def _to(L, x, *args, **kwargs):
    if kwargs.get("copy"):
        return L.copy(L.cast(x, kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)))
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, torch.Tensor):
            dtype = a.dtype
        elif isinstance(a, (str, torch.device)) and torch.device(a).type != L.t.device.type:
            raise UnsupportedError(f"moving a tensor to {a} inside the program", hint="move inputs before calling")
    return L.cast(x, dtype)


for _name, _dtype in {"float": torch.float32, "double": torch.float64, "half": torch.float16,
                      "bfloat16": torch.bfloat16, "long": torch.int64, "int": torch.int32, "bool": torch.bool}.items():
    register(_name)((lambda dt: lambda L, x, *a, **k: L.cast(x, dt))(_dtype))


@register("cpu", "cuda")
def _device_move(L, x, *args, **kwargs):
    return x


@register("cat", "concat", "concatenate")
def _cat(L, tensors, dim=0):
    tensors = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)] or list(tensors)[:1]
    if len(tensors) == 1:
        return L.t.fresh(L.val(tensors[0]))   # new memory, as torch.cat gives
    return L.out(Op.CAT, list(tensors), dim=dim % tensors[0].dim())


@register("stack")
def _stack(L, tensors, dim=0):
    d = dim % (tensors[0].dim() + 1)
    return _cat(L, [_unsqueeze(L, t, d) for t in tensors], d)


def _narrow(L, x, dim, start, length):
    d = dim % x.dim()
    key = [("slice", None, None, None)] * d + [("slice", start, start + length, None)]
    return L.select(x, key, [])


register("narrow")(_narrow)


@register("split")
def _split(L, x, split_size_or_sections, dim=0):
    d = dim % x.dim()
    n = x.shape[d]
    sizes = ([split_size_or_sections] * math.ceil(n / split_size_or_sections) if isinstance(split_size_or_sections, int)
             else list(split_size_or_sections))
    out, start = [], 0
    for s in sizes:
        s = min(s, n - start)
        out.append(_narrow(L, x, d, start, s))
        start += s
    return tuple(out)


@register("chunk")
def _chunk(L, x, chunks, dim=0):
    return _split(L, x, math.ceil(x.shape[dim % x.dim()] / chunks), dim)


register("tensor_split")(lambda L, x, sections, dim=0: _chunk(L, x, sections, dim))


@register("unbind", "__iter__")
def _unbind(L, x, dim=0):
    d = dim % x.dim()
    return tuple(L.select(x, [("slice", None, None, None)] * d + [("int", i)], []) for i in range(x.shape[d]))


@register("select")
def _select(L, x, dim, index):
    return _getitem(L, x, (slice(None),) * (dim % x.dim()) + (index,))


@register("index_select")
def _index_select(L, x, dim, index):
    return L.out(Op.GATHER, [x, index], dim=dim % x.dim())


@register("gather")
def _gather_elements(L, x, dim, index, *, sparse_grad=False, out=None):
    """torch.gather: out[i][j] = x[i][index[i][j]] (dim 1). The element's offset in x's
    contiguous copy is a constant part from the other dims' positions plus index * stride;
    one flat index_select then reads them all. An index out of range gets an offset past
    the end, so it fails as index_select's does (eager raises too)."""
    if out is not None or index.dim() != x.dim():
        raise UnsupportedError("torch.gather with out= or an index of another rank than the input")
    dim = dim % x.dim()
    if any(i > s for d, (i, s) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise UnsupportedError(f"torch.gather with an index of shape {tuple(index.shape)} larger than the input "
                               f"{tuple(x.shape)} outside dim {dim}")
    strides = _meta(x).contiguous().stride()
    with torch._C.DisableTorchFunction():
        base = torch.zeros(tuple(index.shape), dtype=torch.int64, device=L.t.device)
        for d, n in enumerate(index.shape):
            if d != dim:
                base += (torch.arange(n, device=L.t.device) * strides[d]).reshape([-1 if e == d else 1
                                                                                   for e in range(index.dim())])
    index = L.cast(index, torch.int64)
    offsets = L.elementwise(Op.ADD, base, L.elementwise(Op.MUL, index, strides[dim]))
    inside = L.elementwise(Op.AND, L.elementwise(Op.GE, index, 0), L.elementwise(Op.LT, index, x.shape[dim]))
    offsets = L.elementwise(Op.WHERE, inside, offsets, x.numel())
    return L.out(Op.GATHER, [L.reshape(x, (x.numel(),)), offsets], dim=0)


# -- scatters: as comparisons of the index with every target position, then reductions ----------

def _scatter_hits(L, x, dim, index):
    """A bool tensor `hit` of shape (n, *index.shape): hit[t, i...] says element i... of the
    index targets position t along `dim` (n = x.shape[dim]), for scatter's index layout."""
    if index.dim() != x.dim() or any(i != s for d, (i, s) in enumerate(zip(index.shape, x.shape)) if d != dim):
        raise UnsupportedError(f"scatter with an index of shape {tuple(index.shape)} for an input of shape "
                               f"{tuple(x.shape)}: only an index as large as the input outside `dim` is supported")
    with torch._C.DisableTorchFunction():
        positions = torch.arange(x.shape[dim], device=L.t.device).reshape((-1,) + (1,) * index.dim())
    return L.elementwise(Op.EQ, _unsqueeze(L, index, 0), positions)


def _to_target(L, per_source, dim):
    """(n, *index.shape) reduced over the index's `dim` (dim + 1 here) moved into place."""
    return _transpose(L, per_source, 0, dim + 1)


@register("scatter_add")
def _scatter_add(L, x, dim, index, src):
    """out = x; out[..index[i]..] += src[i] along dim: the sum over the index positions that
    hit each target."""
    dim = dim % x.dim()
    if not src.dtype.is_floating_point:
        raise UnsupportedError("scatter_add of an integer tensor", hint="add in a float dtype and cast back")
    src = _narrow_to(L, src, index.shape)
    hits = _scatter_hits(L, x, dim, index)
    added = _reduction(Op.SUM)(L, L.elementwise(Op.MUL, L.cast(hits, src.dtype), _unsqueeze(L, src, 0)), dim + 1)
    return L.elementwise(Op.ADD, x, _squeeze(L, _to_target(L, _unsqueeze(L, added, dim + 1), dim), 0))


@register("scatter")
def _scatter(L, x, dim, index, src=None, value=None, *, reduce=None):
    """out = x; out[..index[i]..] = src[i] along dim. Where several positions target one
    element, the last one's value is kept (what torch's CPU kernel does; torch leaves it
    undefined)."""
    if reduce is not None:
        raise UnsupportedError(f"scatter with reduce={reduce!r}", hint="use scatter_add or scatter_reduce")
    dim = dim % x.dim()
    if src is None or _is_number(src):
        src = _full_proxy(L, tuple(index.shape), value if src is None else src, x.dtype)
    src = _narrow_to(L, src, index.shape)
    hits = _scatter_hits(L, x, dim, index)
    with torch._C.DisableTorchFunction():
        order = torch.arange(index.shape[dim], device=L.t.device).reshape(
            (1,) + tuple(-1 if d == dim else 1 for d in range(index.dim())))
    last = _reduction(Op.AMAX)(L, L.elementwise(Op.WHERE, hits, order, -1), dim + 1, True)   # (n, ..1.., ...)
    last = _squeeze(L, _to_target(L, last, dim), 0)                                           # x's shape
    value = _gather_elements(L, L.cast(src, x.dtype), dim, _clamp(L, last, min=0))
    return L.elementwise(Op.WHERE, L.elementwise(Op.GE, last, 0), value, x)


@register("index_add")
def _index_add(L, x, dim, index, source, *, alpha=1):
    """out = x; out[index[i]] += alpha * source[i] along dim."""
    if not source.dtype.is_floating_point:
        raise UnsupportedError("index_add of an integer tensor", hint="add in a float dtype and cast back")
    dim = dim % x.dim()
    shape = [1] * x.dim()
    shape[dim] = index.shape[0]
    spread = _expand(L, L.reshape(index, tuple(shape)), tuple(source.shape))
    added = _scatter_add(L, _full_proxy(L, tuple(x.shape), 0, x.dtype), dim, spread, source)
    return L.elementwise(Op.ADD, x, added if alpha == 1 else L.elementwise(Op.MUL, added, alpha))


def _narrow_to(L, src, shape):
    if tuple(src.shape) == tuple(shape):
        return src
    if any(s < n for s, n in zip(src.shape, shape)):
        raise UnsupportedError(f"scatter with a source of shape {tuple(src.shape)} smaller than its index")
    return L.select(src, [("slice", None, n, None) for n in shape], [])


@register("item")
def _item(L, x):
    if x.numel() != 1:
        raise UnsupportedError(f".item() of a tensor with {x.numel()} elements")
    return L.t.fresh(L.val(L.reshape(x, ()) if x.dim() else x))   # a number: later writes to x do not change it


# -- indexing ---------------------------------------------------------------------------------

def _normalize_key(key) -> list:
    key = list(key) if isinstance(key, tuple) else [key]
    n_explicit = sum(1 for k in key if k is not None and k is not Ellipsis)
    return key, n_explicit


def _parse_key(L, x, key):
    """Split an index into basic items (slices, ints, 0-d tensor ints, None) and at most one
    integer-tensor index (advanced indexing), as (items, dynamic operands, advanced)."""
    key, n_explicit = _normalize_key(key)
    items, dynamic, advanced, dim = [], [], None, 0
    for k in key:
        if k is Ellipsis:
            fill = x.dim() - n_explicit
            items += [("slice", None, None, None)] * fill
            dim += fill
        elif k is None:
            items.append(("new",))
        elif isinstance(k, slice):
            for bound in (k.start, k.stop, k.step):
                if is_proxy(bound):   # the length would depend on the data, unless unrolling makes it Python
                    L.t.concretize(bound, "a slice bound")
            items.append(("slice", k.start, k.stop, k.step))
            dim += 1
        elif isinstance(k, bool):
            raise UnsupportedError("indexing with a Python bool")
        elif isinstance(k, int):
            items.append(("int", k))
            dim += 1
        elif isinstance(k, torch.Tensor):
            if k.dtype == torch.bool:
                raise UnsupportedError("boolean mask indexing (its result's shape depends on the data)",
                                       hint="use torch.where(mask, x, other) instead")
            if k.dtype.is_floating_point:
                raise UnsupportedError("indexing with a float tensor")
            if k.dim() == 0:
                items.append(("dyn",))
                dynamic.append(k)
            else:
                if advanced is not None:
                    raise UnsupportedError("indexing with more than one integer tensor")
                advanced = (len(items), dim, k)
                items.append(("slice", None, None, None))
            dim += 1
        elif isinstance(k, (list, tuple)):
            if advanced is not None:
                raise UnsupportedError("indexing with more than one integer tensor or list")
            if dim < x.dim() and isinstance(type_of(x).shape[dim], Sym):   # negative indices count from its end
                raise SymbolicSizeError(type_of(x).shape[dim], "an index list")
            advanced = (len(items), dim, _list_index(L, k, x.shape[dim] if dim < x.dim() else 0))
            items.append(("slice", None, None, None))
            dim += 1
        else:
            raise UnsupportedError(f"indexing with {type(k).__name__}")
    return items, dynamic, advanced


def _list_index(L, k, size: int):
    """`x[:, [0, -1]]`: a list of Python ints is a constant integer-tensor index (negative
    ones count from the end, as torch's; out of range is refused here, where torch raises)."""
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in k) or not k:
        raise UnsupportedError("indexing with a list that is not a non-empty list of Python ints",
                               hint="index with an integer tensor, or stack the indices with torch.stack")
    if any(not -size <= i < size for i in k):
        raise UnsupportedError(f"index list {list(k)} out of range for a dimension of size {size}")
    with torch._C.DisableTorchFunction():
        return torch.tensor([i % size for i in k], dtype=torch.int64, device=L.t.device)


@register("__getitem__")
def _getitem(L, x, key):
    items, dynamic, advanced = _parse_key(L, x, key)
    if advanced is not None:
        pos, dim, index = advanced
        if any(it[0] in ("int", "dyn", "new") for it in items):
            raise UnsupportedError("mixing an integer-tensor index with other integer or None indices")
        x = _getitem_basic(L, x, items)
        return L.out(Op.GATHER, [x, index], dim=dim)
    return _getitem_basic(L, x, items, dynamic)


def _getitem_basic(L, x, items, dynamic=()):
    if all(it == ("slice", None, None, None) for it in items):
        return x
    return L.select(x, items, list(dynamic))


@register("__setitem__")
def _setitem(L, x, key, value):
    mask = _mask_of(x, key)
    if mask is not None:
        if type_of(x).syms:   # the masked rows' shape would be read off x
            raise SymbolicSizeError(type_of(x).syms, "an assignment through a mask")
        return _masked_assign(L, x, mask, value)
    items, dynamic, advanced = _parse_key(L, x, key)
    if advanced is not None:
        raise UnsupportedError("assignment through an integer-tensor index", hint="write one row at a time with a 0-d index")
    target = x if all(it == ("slice", None, None, None) for it in items) else L.select(x, items, dynamic)
    _assign(L, target, value)


def _assign(L, target, value):
    """`target[...] = value`, `target.copy_(value)`: any dtype is cast; leading 1-sized dims
    of the value are dropped, then it broadcasts (as torch does)."""
    if _is_number(value):
        value = L.t.fresh(L.t.scalar(value, target.dtype))
    value = L.cast(value, target.dtype)
    if value.dim() > target.dim():
        extra = value.dim() - target.dim()
        if any(d != 1 for d in value.shape[:extra]):
            raise UnsupportedError(f"assigning a tensor of shape {tuple(value.shape)} to one of shape "
                                   f"{tuple(target.shape)}")
        value = L.reshape(value, tuple(value.shape[extra:]))
    L.write(target, value)


def _mask_of(x, key):
    """A boolean mask index over x's leading dims (`x[mask] = v`), else None."""
    k = key[0] if isinstance(key, tuple) and len(key) == 1 else key
    if isinstance(k, torch.Tensor) and k.dtype == torch.bool and k.dim() > 0 and \
            tuple(k.shape) == tuple(x.shape[:k.dim()]):
        return k
    return None


def _masked_assign(L, x, mask, value):
    """`x[mask] = v`: the elements where mask holds take v (a number, or a tensor that
    broadcasts to one masked row); no data-dependent shape is involved."""
    rows = tuple(x.shape[mask.dim():])
    if isinstance(value, torch.Tensor) and torch.broadcast_shapes(tuple(value.shape), rows) != rows:
        raise UnsupportedError("`x[mask] = v` with one value per selected element (their number depends on the data)",
                               hint="assign a number, or use torch.where(mask, new_values, x)")
    where = L.reshape(mask, tuple(mask.shape) + (1,) * len(rows))
    fill = L.t.fresh(L.t.scalar(value, x.dtype)) if _is_number(value) else L.cast(value, x.dtype)
    L.write(x, L.elementwise(Op.WHERE, where, fill, x))


@register("copy_")
def _copy(L, x, src, non_blocking=False):
    _assign(L, x, src)
    return x


@register("fill_")
def _fill(L, x, value):
    _assign(L, x, value)
    return x


register("zero_")(lambda L, x: _fill(L, x, 0))


# -- creation ------------------------------------------------------------------------------

def _full_proxy(L, shape, value, dtype):
    """New memory of `shape` filled with `value`; a size of the shape may be symbolic (a
    SizeProxy, or a Sym of a type)."""
    shape = tuple(d.sym if isinstance(d, SizeProxy) else d for d in shape)
    if isinstance(value, torch.Tensor):   # new memory filled with the value
        if any(isinstance(d, Sym) for d in shape):
            raise SymbolicSizeError(tuple(d for d in shape if isinstance(d, Sym)), "a fill with a tensor")
        return L.t.fresh(L.val(_expand(L, L.cast(value, dtype), shape)))
    return L.t.fresh(L.t.emit1(Op.FULL, [], shape=shape, value=value, dtype=dtype))


def _factory_dtype(dtype, value=0.0):
    if dtype is not None:
        return dtype
    return torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.get_default_dtype()


@register("zeros", "empty")
def _zeros(L, *size, dtype=None, device=None, layout=None, requires_grad=False, pin_memory=False, out=None,
           memory_format=None):
    return _full_proxy(L, _shape_args(size), 0, dtype or torch.get_default_dtype())


@register("ones")
def _ones(L, *size, dtype=None, device=None, layout=None, requires_grad=False, pin_memory=False, out=None):
    return _full_proxy(L, _shape_args(size), 1, dtype or torch.get_default_dtype())


@register("full")
def _full(L, size, fill_value, *, dtype=None, device=None, layout=None, requires_grad=False, pin_memory=False,
          out=None):
    return _full_proxy(L, tuple(size), fill_value, _factory_dtype(dtype, fill_value))


def _like(value):
    def h(L, x, *args, dtype=None, **kwargs):
        fill = args[0] if args else value
        return _full_proxy(L, type_of(x).shape, fill, dtype or x.dtype)   # symbolic sizes included
    return h


register("zeros_like", "empty_like")(_like(0))
register("ones_like")(_like(1))
register("full_like")(_like(None))


def _new(value):
    def h(L, x, *args, dtype=None, device=None, requires_grad=False, **kwargs):
        if value is None:
            size, fill = args[0], args[1]
        else:
            size, fill = _shape_args(args), value
        return _full_proxy(L, tuple(size), fill, dtype or x.dtype)
    return h


register("new_zeros", "new_empty")(_new(0))
register("new_ones")(_new(1))
register("new_full")(_new(None))


@register("arange")
def _arange(L, start, end=None, step=1, *, dtype=None, device=None, layout=None, requires_grad=False, out=None):
    if end is None:
        start, end = 0, start
    if any(isinstance(v, torch.Tensor) for v in (start, end, step)):
        raise UnsupportedError("arange with tensor bounds (its length would depend on the data)")
    if dtype is None:
        dtype = torch.int64 if all(isinstance(v, int) for v in (start, end, step)) else torch.get_default_dtype()
    return L.t.fresh(L.t.emit1(Op.ARANGE, [], start=start, end=end, step=step, dtype=dtype))


@register("tensor", "as_tensor", "scalar_tensor")
def _tensor(L, data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    if isinstance(data, torch.Tensor):   # torch.tensor(t) copies
        return L.t.fresh(L.val(L.cast(data, dtype)))
    if _has_tensor(data):
        raise UnsupportedError("torch.tensor() of a list holding tensors", hint="use torch.stack")
    with torch._C.DisableTorchFunction():
        value = torch.tensor(data, dtype=dtype, device=L.t.device)
    if value.dim() == 0 and _is_number(data):
        return L.t.fresh(L.t.scalar(data, value.dtype))
    return L.t.fresh(L.t.constant(value))   # new memory each call, starting from these values


def _new_tensor(L, x, data, *, dtype=None, **kwargs):
    return _tensor(L, data, dtype=dtype or x.dtype)


register("new_tensor")(_new_tensor)


@register("new")
def _new_legacy(L, x, *args, **kwargs):
    """The legacy `x.new(...)`: `x.new(2, 3)` or `x.new(torch.Size(...))` is a new tensor of
    that shape (uninitialized in torch: zeros here), `x.new([1, 2])` one from the data, both
    with x's dtype."""
    if kwargs or not args:
        raise UnsupportedError("Tensor.new with keyword arguments or no size", hint="use x.new_zeros(...) or x.new_tensor(...)")
    if len(args) == 1 and isinstance(args[0], (list, tuple)) and not isinstance(args[0], torch.Size):
        return _tensor(L, args[0], dtype=x.dtype)
    if all(isinstance(a, int) and not isinstance(a, bool) for a in _shape_args(args)):
        return _full_proxy(L, _shape_args(args), 0, x.dtype)
    raise UnsupportedError("Tensor.new of a tensor or storage", hint="use x.new_tensor(...) or x.clone()")


def supported_op_names() -> list[str]:
    """Every torch function/method name the frontend lowers (for docs/ops.md)."""
    names = set(_BY_NAME) | {getattr(f, "__name__", str(f)) for f in _BY_IDENTITY}
    return sorted(names)
