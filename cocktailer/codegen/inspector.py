"""C source of a native inspector (ACROBAT's ahead-of-time inspector, Cortex's linearizer): the
control slice of a recursive function, run once per call of every instance, in native code.

The slice (the ops that decide a function's self-calls and compute their arguments, found by
`batching.recursion`) of a tree recursion reads scalars out of the instance's tables
(`is_leaf[node]`, `left[node]`), compares and branches. Rendered as one C function, it walks
every instance's calls breadth first with a queue: each call's slice runs on scalars, and each
self-call it reaches appends a call (its instance, its depth, its scalar arguments) to the queue.
A pass over the queue backwards then gives every call its height (leaves 0), which orders the
levels. The batched executor's torch inspector runs the same slice a round of calls at a time;
this one costs nanoseconds per call instead of a round of torch ops per tree level.

What it takes: every op of the slice computes a 0-d value (constants, arithmetic, comparisons,
logic, `where`, casts, a table's size, a table read at scalar indices), branches yield 0-d
values, the tables are parameters every self-call hands on unchanged, and the arguments that
change per call are 0-d integers or bools. Anything else raises `NotImplementedError` with the
reason; the executor then keeps the torch inspector.

    int64_t ck_inspect(int64_t roots, void* const* tables, const int64_t* firsts, const int64_t* strides,
                       const int64_t* sizes, const int64_t* args0, int64_t cap, int64_t max_depth,
                       int64_t* root, int64_t* depth, int64_t* args, int64_t* kids,
                       int64_t* height, int64_t* path, int64_t* info)

`tables[k]`: the k-th table parameter's data, instance r's part of it from element
`firsts[k * roots + r]` on, with the strides `strides[at_k..]` (one per dim: the instances' rows
may lie one after another, packed, as well as padded to one width); `sizes[r * S + j]`:
instance r's value of size `syms[j]`; `args0`: the root calls' varying arguments. Out: per
call its instance `root`, `depth`, varying `args` (`[cap][V]`, as int64), the calls of its
sites `kids` (`[cap][sites]`, -1 where not reached), `height`, and `path`: bit b set where the
call took the first arm of the slice's branch b (`branches[b]`), so that calls of one height and
one path run the same ops. Returns the number of calls, or INSPECT_FULL (more than `cap` calls:
call again with room for more), INSPECT_INDEX (an index out of range: info = call, index, dim, size) or
INSPECT_DEEP (deeper than max_depth: info[0] = call).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cocktailer.codegen.kernels.common import lit
from cocktailer.codegen.kernels.context import ctype
from cocktailer.codegen.kernels.elementwise import binary_expr, compute_dtype, unary_expr
from cocktailer.ir import Function, Op, Operation, Region, Sym, Value

INSPECT_FULL, INSPECT_INDEX, INSPECT_DEEP = -1, -2, -3

_UNARY = {Op.NEG, Op.ABS, Op.NOT, Op.CAST}
_BINARY = {Op.ADD, Op.SUB, Op.MUL, Op.MAXIMUM, Op.MINIMUM, Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE,
           Op.AND, Op.OR, Op.XOR}
_INTEGRAL = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


@dataclass(frozen=True)
class InspectorSource:
    source: str
    tables: tuple[int, ...]    # the parameters read as tables, in `tables[]` order
    varying: tuple[int, ...]   # the parameters each call has its own value of, in `args` order
    syms: tuple[Sym, ...]      # the sizes `sizes[]` holds per instance, in order
    strides_at: tuple[int, ...]   # per table: where its strides (one per dim) start in `strides[]`
    branches: tuple[int, ...]  # id() of the slice's branches, bit b of `path` for branches[b]


def render_inspector(fn: Function, sites: tuple[Operation, ...], passthrough: tuple[bool, ...],
                     control: frozenset[int], if_results: dict) -> InspectorSource:
    return _Renderer(fn, sites, passthrough, control, if_results).render()


class _Renderer:
    def __init__(self, fn, sites, passthrough, control, if_results):
        self.fn, self.sites, self.passthrough = fn, sites, passthrough
        self.control, self.if_results = control, if_results
        self.param_index = {p.id: j for j, p in enumerate(fn.params)}
        self.tables: list[int] = []
        self.syms: list[Sym] = []
        self.varying = tuple(j for j, p in enumerate(fn.params) if not passthrough[j])
        self.names: dict[int, str] = {}   # value id -> the C expression of its (0-d) value
        self.branches: list[int] = []
        for j in self.varying:
            p = fn.params[j]
            if p.type.rank != 0 or p.type.dtype not in _INTEGRAL:
                raise NotImplementedError(f"parameter {j} changes per call and is not an integer or bool scalar")
            self.names[p.id] = f"a{j}"

    def render(self) -> InspectorSource:
        body = self.region(self.fn.body)
        strides_at = [sum(self.fn.params[j].type.rank for j in self.tables[:k]) for k in range(len(self.tables))]
        width = max(len(self.varying), 1)   # args[] per call (one even where none varies: no 0-size arrays)
        params = [f"const {ctype(self.fn.params[j].type.dtype)} a{j} = ({ctype(self.fn.params[j].type.dtype)})"
                  f"args[c * {width} + {k}];" for k, j in enumerate(self.varying)]
        source = _TEMPLATE.format(
            S=max(len(self.syms), 1), K=max(len(self.sites), 1), params="\n".join(params), body=body,
            strides="\n".join(f"const int64_t* st{k} = strides + {a}; "
                              f"const int64_t* fi{k} = firsts + {k} * roots;" for k, a in enumerate(strides_at)),
            init_args="\n".join(f"args[i * {width} + {k}] = args0[i * {width} + {k}];" for k in range(len(self.varying))),
            FULL=INSPECT_FULL, INDEX=INSPECT_INDEX, DEEP=INSPECT_DEEP)
        return InspectorSource(source, tuple(self.tables), self.varying, tuple(self.syms), tuple(strides_at),
                               tuple(self.branches))

    # ------------------------------------------------------------------ values

    def value(self, v: Value) -> str:
        if v.id in self.names:
            return self.names[v.id]
        j = self.param_index.get(v.id)
        if j is not None and self.passthrough[j] and v.type.rank == 0:   # a scalar every call hands on
            return f"(({ctype(v.type.dtype)}*)tables[{self.table(j)}])[fi{self.table(j)}[r]]"
        raise NotImplementedError("the slice reads a value it does not compute as a scalar")

    def table(self, j: int) -> int:
        if j not in self.tables:
            self.tables.append(j)
        return self.tables.index(j)

    def size(self, dim) -> str:
        """The C expression of one instance's size `dim` (a number, or a Sym read per instance)."""
        if not isinstance(dim, Sym):
            return str(dim)
        if dim not in self.syms:
            self.syms.append(dim)
        return f"sz[{self.syms.index(dim)}]"

    # ------------------------------------------------------------------ ops

    def region(self, region: Region) -> str:
        return "\n".join(self.op(op) for op in region.ops if id(op) in self.control)

    def op(self, op: Operation) -> str:
        kind = op.op
        if kind is Op.IF:
            return self.branch(op)
        if kind is Op.CALL:
            return self.call(op)
        if any(r.type.rank != 0 for r in op.results):
            raise NotImplementedError(f"the slice computes a tensor ({kind.name})")
        out = op.results[0]
        expr = self.expr(op)
        name = self.names[out.id] = f"v{out.id}"
        return f"{ctype(out.type.dtype)} {name} = {expr};"

    def expr(self, op: Operation) -> str:
        kind, out = op.op, op.results[0]
        dt = out.type.dtype
        if kind is Op.SCALAR:
            return lit(op.attrs["value"], dt)
        if kind is Op.DIM:
            return self.size(self.table_param(op.operands[0]).type.shape[op.attrs["dim"]])
        if kind is Op.SELECT:
            return self.select(op)
        if any(v.type.rank != 0 for v in op.operands):
            raise NotImplementedError(f"the slice's {kind.name} reads a tensor")
        xs = [self.value(v) for v in op.operands]
        if kind in _UNARY and (kind in (Op.CAST, Op.NOT) or dt in _INTEGRAL):
            return unary_expr(kind, xs[0], op.operands[0].type.dtype, dt)
        if kind in _BINARY:
            a, b = op.operands
            return binary_expr(kind, xs[0], xs[1], a.type.dtype, b.type.dtype, compute_dtype(op), dt)
        if kind is Op.WHERE:
            c = ctype(dt)
            return f"(({xs[0]}) ? ({c})({xs[1]}) : ({c})({xs[2]}))"
        raise NotImplementedError(f"the native inspector has no rule for {kind.name}")

    def table_param(self, v: Value) -> Value:
        j = self.param_index.get(v.id)
        if j is None or not self.passthrough[j]:
            raise NotImplementedError("the slice indexes a tensor that is not one of the tables every call hands on")
        return v

    def select(self, op: Operation) -> str:
        """A read of one element of a table; indices counted from the end when negative and
        checked against the instance's own sizes, as eager indexing checks them."""
        table = self.table_param(op.operands[0])
        k = self.table(self.param_index[table.id])
        shape, dynamic = table.type.shape, iter(op.operands[1:])
        if len(op.attrs["key"]) != len(shape):
            raise NotImplementedError("the slice reads a part of a table, not one element")
        offset = [f"fi{k}[r]"]
        for d, item in enumerate(op.attrs["key"]):
            if item[0] == "int":
                index = str(int(item[1]))
            elif item[0] == "dyn":
                v = next(dynamic)
                if v.type.rank != 0 or v.type.dtype not in _INTEGRAL or v.type.dtype is torch.bool:
                    raise NotImplementedError("the slice indexes a table with a tensor")
                index = f"(int64_t)({self.value(v)})"
            else:
                raise NotImplementedError(f"the slice indexes a table with {item[0]}")
            offset.append(f"ck_checked(c, {index}, {d}, {self.size(shape[d])}, info) * st{k}[{d}]")
        return f"(({ctype(table.type.dtype)}*)tables[{k}])[{' + '.join(offset)}]"

    def branch(self, op: Operation) -> str:
        needed = sorted(self.if_results.get(id(op), ()))
        cond = op.operands[0]
        if cond.type.rank != 0:
            raise NotImplementedError("a branch of the slice has a tensor condition")
        for k in needed:
            if op.results[k].type.rank != 0:
                raise NotImplementedError("a branch of the slice yields a tensor the slice needs")
        decls = [f"{ctype(op.results[k].type.dtype)} v{op.results[k].id};" for k in needed]
        if len(self.branches) == 63:
            raise NotImplementedError("the slice has more than 63 branches")
        self.branches.append(id(op))
        taken = f"path[c] |= INT64_C(1) << {len(self.branches) - 1};"
        arms = []
        for arm, note in zip(op.regions, (taken, "")):
            body = "\n".join([note, self.region(arm)])
            moves = [f"v{op.results[k].id} = {self.value(arm.yields[k])};" for k in needed]
            arms.append("{\n" + "\n".join([body, *moves]) + "\n}")
        for k in needed:
            self.names[op.results[k].id] = f"v{op.results[k].id}"
        return "\n".join([*decls, f"if ({self.value(cond)}) {arms[0]} else {arms[1]}"])

    def call(self, op: Operation) -> str:
        if op not in self.sites:
            raise NotImplementedError("the slice calls another function")
        s = self.sites.index(op)
        moves = [f"args[n * {max(len(self.varying), 1)} + {k}] = (int64_t)({self.value(op.operands[j])});"
                 for k, j in enumerate(self.varying)]
        return "\n".join([
            "{",
            f"if (n >= cap) return {INSPECT_FULL};",
            f"if (depth[c] >= max_depth) {{ info[0] = c; return {INSPECT_DEEP}; }}",
            *moves,
            f"root[n] = r; depth[n] = depth[c] + 1; kids[c * {max(len(self.sites), 1)} + {s}] = n; ++n;",
            "}"])


_TEMPLATE = r"""
#include <stdint.h>
#include <string.h>

/* an index into a dim of `size`, negative from the end; an error (the caller returns) when out of range */
#define ck_checked(c, i, d, size, info) ({{ int64_t ck_i = (i), ck_n = (size); \
  if (ck_i < 0) ck_i += ck_n; \
  if (ck_i < 0 || ck_i >= ck_n) {{ info[0] = (c); info[1] = (i); info[2] = (d); info[3] = ck_n; return {INDEX}; }} \
  ck_i; }})

int64_t ck_inspect(int64_t roots, void* const* tables, const int64_t* firsts, const int64_t* strides,
                   const int64_t* sizes, const int64_t* args0, int64_t cap, int64_t max_depth, int64_t* root,
                   int64_t* depth, int64_t* args, int64_t* kids, int64_t* height, int64_t* path, int64_t* info) {{
  {strides}
  if (roots > cap) return {FULL};
  for (int64_t i = 0; i < roots; ++i) {{
    root[i] = i; depth[i] = 0;
    {init_args}
  }}
  int64_t n = roots;
  for (int64_t c = 0; c < n; ++c) {{   /* the queue: calls in the order they are found (breadth first) */
    const int64_t r = root[c];
    const int64_t* sz = sizes + r * {S}; (void)sz;
    for (int64_t s = 0; s < {K}; ++s) kids[c * {K} + s] = -1;
    path[c] = 0;
    {params}
    {body}
  }}
  for (int64_t c = n - 1; c >= 0; --c) {{   /* children come after their parents */
    int64_t h = 0;
    for (int64_t s = 0; s < {K}; ++s) {{
      const int64_t k = kids[c * {K} + s];
      if (k >= 0 && height[k] + 1 > h) h = height[k] + 1;
    }}
    height[c] = h;
  }}
  return n;
}}
"""
