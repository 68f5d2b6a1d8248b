"""The IR's data ops in JAX: `JAX_OPS[op](*operands, **attrs)` means what
`cocktailer.ir.SEMANTICS[op]` means in torch. Result dtypes are fixed by the caller (the IR
types every value), so torch's and JAX's type promotion rules never have to agree here."""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from cocktailer.ir import Op


def np_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


def _key(key: tuple, dynamic: tuple) -> tuple:
    it = iter(dynamic)
    table = {"slice": lambda item: slice(*item[1:]), "int": lambda item: item[1],
             "dyn": lambda item: next(it), "new": lambda item: None}
    return tuple(table[item[0]](item) for item in key)


def _reduce(fn):
    def impl(x, *, dims=None, keepdim=False):
        return fn(x, axis=None if dims is None else tuple(dims), keepdims=keepdim)
    return impl


def _arg_reduce(fn):
    def impl(x, *, dim=None, keepdim=False):
        if dim is None:
            return fn(x.reshape(-1))
        return fn(x, axis=dim, keepdims=keepdim)
    return impl


def _conv2d(x, w, b=None, *, stride, padding, dilation, groups):
    unbatched = x.ndim == 3
    x = x[None] if unbatched else x
    y = lax.conv_general_dilated(x, w, window_strides=stride, padding=[(p, p) for p in padding],
                                 rhs_dilation=dilation, feature_group_count=groups,
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    if b is not None:
        y = y + b[None, :, None, None]
    return y[0] if unbatched else y


def _pool_padding(x, kernel, stride, padding, dilation, ceil_mode):
    """torch's pooling padding as reduce_window's, with ceil_mode's extra right padding
    (a last window may start in the input or the left padding, never in the right one)."""
    pads = [(0, 0)] * (x.ndim - 2)
    for d in range(2):
        size, k = x.shape[x.ndim - 2 + d], dilation[d] * (kernel[d] - 1) + 1
        span = size + 2 * padding[d] - k
        extra = 0
        if ceil_mode and span % stride[d]:
            extra = stride[d] - span % stride[d]
            if (span + extra) // stride[d] * stride[d] >= size + padding[d]:
                extra -= stride[d]
        pads.append((padding[d], padding[d] + max(extra, 0)))
    return pads


def _max_pool2d(x, *, kernel, stride, padding, dilation, ceil_mode):
    pads = _pool_padding(x, kernel, stride, padding, dilation, ceil_mode)
    lead = (1,) * (x.ndim - 2)
    return lax.reduce_window(x, -jnp.inf, lax.max, lead + tuple(kernel), lead + tuple(stride), pads,
                             window_dilation=lead + tuple(dilation))


def _avg_pool2d(x, *, kernel, stride, padding, ceil_mode, count_include_pad):
    pads = _pool_padding(x, kernel, stride, padding, (1, 1), ceil_mode)
    lead = (1,) * (x.ndim - 2)
    window, strides = lead + tuple(kernel), lead + tuple(stride)
    total = lax.reduce_window(x, 0.0, lax.add, window, strides, pads)
    if count_include_pad:   # torch counts the explicit padding but not ceil_mode's extra
        ones = jnp.ones([x.shape[-2 + d] + 2 * padding[d] for d in range(2)], x.dtype)
        extra = [(0, hi - lo) for lo, hi in pads[-2:]]
        count = lax.reduce_window(ones, 0.0, lax.add, tuple(kernel), tuple(stride), extra)
    else:
        count = lax.reduce_window(jnp.ones(x.shape[-2:], x.dtype), 0.0, lax.add, tuple(kernel), tuple(stride),
                                  pads[-2:])
    return total / count


def _select(x, *dynamic, key):
    return _index_safe(x, key)[_key(key, dynamic)]


def _index_safe(x, key):
    """A dynamic index into an empty axis (the body of a loop that runs zero times, which
    lax still traces): index a one-element stand-in instead; its result is never used."""
    shape, axis = list(x.shape), 0
    for item in key:
        if item[0] == "dyn" and shape[axis] == 0:
            shape[axis] = 1
        axis += item[0] != "new"
    return x if list(x.shape) == shape else jnp.zeros(shape, x.dtype)


def _update(x, v, *dynamic, key):
    return x.at[_key(key, dynamic)].set(jnp.asarray(v, x.dtype))


def _gather(x, idx, *, dim):
    return x[(slice(None),) * dim + (idx,)]


_UNARY = {
    Op.NEG: jnp.negative, Op.ABS: jnp.abs, Op.EXP: jnp.exp, Op.LOG: jnp.log, Op.SQRT: jnp.sqrt,
    Op.RSQRT: lax.rsqrt, Op.RECIPROCAL: jnp.reciprocal, Op.TANH: jnp.tanh, Op.SIGMOID: jax.nn.sigmoid,
    Op.RELU: jax.nn.relu, Op.GELU: lambda x: jax.nn.gelu(x, approximate=False), Op.SILU: jax.nn.silu,
    Op.SIN: jnp.sin, Op.COS: jnp.cos, Op.ERF: jax.scipy.special.erf, Op.FLOOR: jnp.floor, Op.CEIL: jnp.ceil,
    Op.NOT: jnp.logical_not,
}
_BINARY = {
    Op.ADD: jnp.add, Op.SUB: jnp.subtract, Op.MUL: jnp.multiply, Op.DIV: jnp.true_divide,
    Op.FLOORDIV: jnp.floor_divide, Op.MOD: jnp.remainder, Op.POW: jnp.power,
    Op.MAXIMUM: jnp.maximum, Op.MINIMUM: jnp.minimum,
    Op.EQ: jnp.equal, Op.NE: jnp.not_equal, Op.LT: jnp.less, Op.LE: jnp.less_equal,
    Op.GT: jnp.greater, Op.GE: jnp.greater_equal,
    Op.AND: jnp.logical_and, Op.OR: jnp.logical_or, Op.XOR: jnp.logical_xor,
}

JAX_OPS: dict[Op, Callable] = {
    **{op: (lambda fn: lambda x: fn(x))(fn) for op, fn in _UNARY.items()},
    **{op: (lambda fn: lambda a, b: fn(a, b))(fn) for op, fn in _BINARY.items()},
    Op.CAST: lambda x, *, dtype: x.astype(np_dtype(dtype)),
    Op.WHERE: jnp.where,
    Op.SCALAR: lambda *, value, dtype: jnp.asarray(value, np_dtype(dtype)),
    Op.FULL: lambda *, shape, value, dtype: jnp.full(shape, value, np_dtype(dtype)),
    Op.ARANGE: lambda *, start, end, step, dtype: jnp.arange(start, end, step, dtype=np_dtype(dtype)),
    Op.SUM: _reduce(jnp.sum), Op.MEAN: _reduce(jnp.mean), Op.PROD: _reduce(jnp.prod),
    Op.AMAX: _reduce(jnp.max), Op.AMIN: _reduce(jnp.min), Op.ANY: _reduce(jnp.any), Op.ALL: _reduce(jnp.all),
    Op.ARGMAX: _arg_reduce(jnp.argmax), Op.ARGMIN: _arg_reduce(jnp.argmin),
    Op.SOFTMAX: lambda x, *, dim: jax.nn.softmax(x, axis=dim),
    Op.LOG_SOFTMAX: lambda x, *, dim: jax.nn.log_softmax(x, axis=dim),
    Op.MATMUL: jnp.matmul,
    Op.CONV2D: _conv2d,
    Op.MAX_POOL2D: _max_pool2d,
    Op.AVG_POOL2D: _avg_pool2d,
    Op.RESHAPE: lambda x, *, shape: x.reshape(shape),
    Op.PERMUTE: lambda x, *, dims: jnp.transpose(x, dims),
    Op.EXPAND: lambda x, *, shape: jnp.broadcast_to(x, shape),
    Op.CAT: lambda *xs, dim: jnp.concatenate(xs, axis=dim),
    Op.SELECT: _select,
    Op.UPDATE: _update,
    Op.GATHER: _gather,
}
