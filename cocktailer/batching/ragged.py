"""Which symbolic sizes may differ between the instances of one batch.

Instances run together hold their values in one tensor per value, padded along a size that
differs between them (a tree's node count, a sentence's length) to the largest. That is exact
where the program never lets the padding reach a real result: it reads such a dim only through
per-instance indices (`inp[node]`, `xs[t]`: checked against the instance's own size, negative
ones counted from its own end; constant ones from the start, checked too), keeps it where it
was through elementwise ops, reshapes of the dims after it, products and reductions over other
dims, products that sum over it and softmaxes along it (the executor masks the padding: zeros
into the product, -inf into the softmax), asks for its size (`len(x)`, `x.shape[0]`: each
instance's own, so `range(len(x))` runs each instance's count), creates a tensor of that size
(`zeros_like(x)`: created padded too), or returns it (cut back to each instance's size). Any
other use (a sum over it, a reshape or cat along it, a size computed into an attribute) would
mix padding into results: such sizes stay equal within a batch, and instances that differ in
them run in separate groups.
"""
from __future__ import annotations

from cocktailer.ir import CREATION, ELEMENTWISE, Op, Operation, Program, Sym
from cocktailer.ir.infer import syms_in
from cocktailer.ir.ops import REDUCE

_KEEP = ELEMENTWISE | {Op.PERMUTE, Op.DIM, Op.CALL, Op.IF, Op.LOOP, Op.CONST}


def ragged_syms(program: Program) -> frozenset[Sym]:
    """The symbolic sizes of the entry's parameters that instances of one batch may differ in."""
    syms = {sym for sym, _, _ in program.sizes}
    for op in program.walk():
        syms -= _mixing(op)
        if not syms:
            break
    return frozenset(syms)


def masked(op: Operation) -> set[Sym]:
    """The sizes along which `op` reads padding unless the executor masks it: a softmax's dim
    (padding set to -inf first) and a product's contracted dim (padding set to 0 first)."""
    shapes = [v.type.shape for v in op.operands]
    if op.op is Op.MATMUL:
        a, b = shapes
        return _syms([a[-1]] + ([b[-2]] if len(b) >= 2 else [b[0]]))
    if op.op in (Op.SOFTMAX, Op.LOG_SOFTMAX) and shapes[0]:
        return _syms([shapes[0][op.attrs["dim"] % len(shapes[0])]])
    return set()


def masked_operands(op: Operation, ragged) -> list[tuple[int, int, Sym]]:
    """(operand, dim of one lane's value, size) of each operand dim along which `op` reads
    padding: a softmax's dim, a product's contracted dims (`masked`)."""
    if not masked(op) & set(ragged):
        return []
    shapes = [v.type.shape for v in op.operands]
    if op.op is Op.MATMUL:
        dims = [(0, len(shapes[0]) - 1), (1, len(shapes[1]) - 2 if len(shapes[1]) >= 2 else 0)]
    else:
        dims = [(0, op.attrs["dim"] % len(shapes[0]))]
    return [(k, d, shapes[k][d]) for k, d in dims if shapes[k][d] in ragged]


def padding_fill(op: Operation) -> float:
    """What `masked_operands`' padding is set to first: 0 into a product, -inf into a softmax."""
    return 0.0 if op.op is Op.MATMUL else float("-inf")


def needs_lane_sizes(op: Operation, ragged) -> bool:
    """Whether `op` needs each lane's own sizes of the ragged dims it reads (a mask, or a check
    of a constant index), which the batched executor applies and native code does not."""
    if masked(op) & set(ragged):
        return True
    if op.op in (Op.SELECT, Op.UPDATE):
        return any(d in ragged for _, d, _ in constant_indices(op))
    return False


def constant_indices(op: Operation) -> list[tuple[int, object, int]]:
    """(dim, size, index) of each constant index of a SELECT/UPDATE key."""
    shape, found, dim = op.operands[0].type.shape, [], 0
    for item in op.attrs["key"]:
        if item[0] == "new":
            continue
        if item[0] == "int" and dim < len(shape):
            found.append((dim, shape[dim], int(item[1])))
        dim += 1
    return found


def _mixing(op: Operation) -> set[Sym]:
    """The sizes this op would mix padding into results along."""
    kind = op.op
    if kind in CREATION:   # created padded, as the inputs are (`zeros_like(x)`, `arange(len(x))`)
        return set()
    found = set(syms_in(tuple(op.attrs.values())))
    if kind in _KEEP:
        return found
    if kind in (Op.SELECT, Op.UPDATE):
        return found | _indexed_other_than_per_lane(op.operands[0].type.shape, op.attrs["key"])
    x_shapes = [v.type.shape for v in op.operands]
    if kind in (Op.MATMUL, Op.SOFTMAX, Op.LOG_SOFTMAX):   # masked where the padding would be read
        return found
    if kind is Op.RESHAPE:
        return _reshaped_across(x_shapes[0], op.results[0].type.shape)
    if kind in REDUCE:
        return found | _syms(_reduced(op, x_shapes[0]))
    if kind is Op.CAT:
        dim = op.attrs["dim"] % len(x_shapes[0])
        return found | _syms([shape[dim] for shape in x_shapes])
    return found | _syms([d for shape in x_shapes for d in shape])


def _reduced(op: Operation, shape: tuple) -> list:
    if op.op in (Op.SOFTMAX, Op.LOG_SOFTMAX):
        dims = [op.attrs["dim"]]
    elif op.op in (Op.ARGMAX, Op.ARGMIN):
        dims = None if op.attrs.get("dim") is None else [op.attrs["dim"]]
    else:
        dims = op.attrs.get("dims")
    return list(shape) if dims is None or not shape else [shape[d % len(shape)] for d in dims]


def _reshaped_across(before: tuple, after: tuple) -> set[Sym]:
    """The sizes a reshape moves elements across: none where every dim up to the last symbolic
    one stays as it is (`x.view(n, heads, d)` of an (n, heads * d) x)."""
    last = max((k for k, d in enumerate(before) if isinstance(d, Sym)), default=-1)
    if tuple(before[:last + 1]) == tuple(after[:last + 1]):
        return set()
    return _syms(list(before) + list(after))


def _indexed_other_than_per_lane(shape: tuple, key: tuple) -> set[Sym]:
    """Sizes a SELECT/UPDATE key reads by a negative constant or a partial slice (full slices,
    per-instance dynamic indices and constants from the start are checked against each
    instance's own size)."""
    mixed, dim = set(), 0
    for item in key:
        if item[0] == "new":
            continue
        size = shape[dim] if dim < len(shape) else None
        full = item[0] == "slice" and item[1] in (None, 0) and item[2] is None and item[3] in (None, 1)
        from_start = item[0] == "int" and int(item[1]) >= 0
        if isinstance(size, Sym) and not (item[0] == "dyn" or full or from_start):
            mixed.add(size)
        dim += 1
    return mixed


def _syms(dims) -> set[Sym]:
    return {d for d in dims if isinstance(d, Sym)}
