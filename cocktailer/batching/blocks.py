"""Native blocks of the batched executor (ACROBAT's grain-size coarsening, §A.2: a static block
scheduled as a unit, not op by op).

Each maximal run of a region's data ops whose batching rule can be written in the IR becomes one
program over all the lanes: a value that differs by lane gets a leading dim of a symbolic size
(the lane count, `LANES`), a weight stays as it is, so a product with it is one GEMM. The blocks
of a program are compiled together into one library, once, by the native backend; the executor
calls a block once per run of its region, for whatever lanes reach it, in place of one torch op
per op. Control flow (branches split by lane, loops, levels) stays in the executor, as in the
host backend.

Where a run of position-wise ops reads and makes only values whose first dim is a ragged size
(a sentence's tokens: a Linear, a LayerNorm, a GELU over each token), its block computes on the
lanes' real rows packed one after another (`ROWS` of them) instead of on rows padded to the
longest lane: no work for padding (`row_wise`, `Packed`). The ops that mix a lane's rows
(attention's products and softmax) run in blocks over padded lanes as before.

A softmax along a ragged size, or a product that sums over one, reads padding: in a block, its
operand is first set to -inf (softmax) or 0 (product) past each lane's size, by a WHERE with a
mask the block takes as an input (each lane's valid positions, `Block.masks`), so attention
over sentences of different lengths is one native block, not torch ops between two.

Which values differ by lane is decided ahead (`lane_varying`), conservatively: a value the
analysis calls lane-varying may still be the same in every lane at run time (a branch all lanes
took alike); it is then repeated per lane for the block.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cocktailer.batching.lanes import Lanes, Packed, RowLayout, packed_rows, rows
from cocktailer.batching.ragged import masked_operands, needs_lane_sizes, padding_fill
from cocktailer.codegen import kernels
from cocktailer.ir import CONTROL, CREATION, ELEMENTWISE, Function, Op, Operation, Program, Region, Sym, TensorType, Value
from cocktailer.ir.analysis import sizes_of

LANES = Sym("lanes", hint=3)
ROWS = Sym("rows", hint=7)   # a packed block's rows: every lane's rows of one ragged dim, one after another

_REDUCE_DIMS = {Op.SUM, Op.MEAN, Op.AMAX, Op.AMIN, Op.ANY, Op.ALL, Op.PROD}


@dataclass(eq=False)
class Block:
    ops: list[Operation]
    inputs: list[Value]
    outputs: list[Value]
    varying_inputs: list[bool]
    varying_outputs: list[bool]
    packed: Sym | None = None        # the ragged size whose rows the block computes on packed (`row_wise`)
    masks: list = field(default_factory=list)   # (size, per-lane rank, dim) of each mask input, after the inputs
    program: Program | None = None   # the batched program, if every op has an IR rule
    compiled: object = None          # its entry point, once compiled


def lane_varying(program: Program, ragged: set) -> set[int]:
    """The ids of the values that may differ between lanes: every function's parameters, what
    is computed from them, a branch's results where its condition differs, every loop's carried
    values, and each lane's own size of a ragged dim."""
    varying: set[int] = {p.id for fn in program.functions.values() for p in fn.params}
    changed = True
    while changed:
        before = len(varying)
        for op in program.walk():
            varying |= _varying_results(op, varying, ragged)
        changed = len(varying) != before
    return varying


def _varying_results(op: Operation, varying: set[int], ragged: set) -> set[int]:
    kind = op.op
    if kind in CREATION or kind is Op.CONST:
        return set()
    if kind is Op.DIM:
        return {op.results[0].id} if op.operands[0].type.shape[op.attrs["dim"]] in ragged else set()
    if kind is Op.IF:
        cond = op.operands[0].id in varying
        return {r.id for k, r in enumerate(op.results)
                if cond or any(arm.yields[k].id in varying for arm in op.regions)}
    if kind is Op.LOOP:   # lanes leave at different iterations: every result and carried value
        return {r.id for r in op.results} | {p.id for region in op.regions for p in region.params[1:]}
    if kind is Op.CALL:
        return {r.id for r in op.results}
    return {r.id for r in op.results} if any(v.id in varying for v in op.operands) else set()


def segments(region: Region, varying: set[int], users: dict[int, set[int]], ragged: set,
             producers: dict[int, Operation], packed: bool = True, masks: bool = True) -> list:
    """The region's ops, maximal runs of two or more batchable data ops grouped into Blocks.
    `ragged`: the sizes that may differ by lane (an op that needs each lane's own to check an
    index runs in the executor, and one that must mask padding too unless `masks`);
    `producers`: the op defining each value; `packed`: row-wise runs compute on packed rows.

    IR ops are pure: a size read or a literal that reads nothing the run computes (a
    sentence's length for a `view`, between the query's and the key's Linear) runs before the
    run instead of ending it. (Such ops cannot fail: no error moves ahead of one the run
    would have raised first.)"""
    out, run, made = [], [], set()

    def close():
        for sym, ops in (_by_layout(run, varying, ragged, users) if packed and run else [(None, run)]):
            if len(ops) >= 2:
                out.append(_block(list(ops), varying, users, producers, ragged, sym))
            else:
                out.extend(ops)
        run.clear()
        made.clear()

    for op in region.ops:
        if _batchable(op, varying) and (not needs_lane_sizes(op, ragged) or masks and _maskable(op, varying, ragged)):
            run.append(op)
            made.update(r.id for r in op.results)
        elif op.op in _SIZES_AND_LITERALS and not any(v.id in made for v in op.operands):
            out.append(op)
        else:
            close()
            out.append(op)
    close()
    return out


_SIZES_AND_LITERALS = (Op.DIM, Op.SCALAR, Op.CONST)


def _maskable(op: Operation, varying: set[int], ragged) -> bool:
    """Whether the block can mask what `op` would read of the padding itself: a softmax or a
    product (not an index, checked by the executor) whose padded operands differ by lane."""
    return (op.op in (Op.MATMUL, Op.SOFTMAX, Op.LOG_SOFTMAX)
            and all(op.operands[k].id in varying and op.operands[k].type.dtype.is_floating_point
                    for k, _, _ in masked_operands(op, ragged)))


_ANY = object()   # the layout of a part that holds only ops reading nothing lane-varying, so far


def _by_layout(run: list[Operation], varying: set[int], ragged: set, users: dict[int, set[int]]) -> list[tuple]:
    """The run cut into parts of ops that are row-wise along one ragged size (packed) and of
    the others: (that size or None, ops). IR ops are pure, so an op goes to the first part of
    its layout after the parts that compute its operands, wherever it lies in the run: the
    query, key and value Linears of attention, each followed by its split into heads (a
    permute, not row-wise), make one packed part, not three parts between padded ones. An op
    that reads nothing lane-varying (a weight's transpose) joins the first part it may; a
    reshape goes to the part that reads it (`_views_to_readers`)."""
    parts: list[list] = []            # [layout, ops]
    part_of: dict[int, int] = {}      # value id -> the part computing it
    for op in run:
        shared = not any(v.id in varying for v in op.operands)
        sym = None if shared else row_wise(op, varying, ragged)
        first = 0
        for v in op.operands:
            at = part_of.get(v.id)
            if at is not None:
                first = max(first, at if shared or parts[at][0] in (sym, _ANY) else at + 1)
        at = next((k for k in range(first, len(parts)) if shared or parts[k][0] in (sym, _ANY)), None)
        if at is None:
            at = len(parts)
            parts.append([_ANY if shared else sym, []])
        elif not shared and parts[at][0] is _ANY:
            parts[at][0] = sym
        parts[at][1].append(op)
        part_of.update((r.id, at) for r in op.results)
    _views_to_readers(parts, users)
    return _joined([(None if sym is _ANY else sym, ops) for sym, ops in parts])


def _views_to_readers(parts: list[list], users: dict[int, set[int]]):
    """Move each reshape of a packed part whose only readers are in one later padded part to
    the front of that part. A native program's values are buffers of their own, so a reshape
    that a block gives out is a copy (attention's query, key and value split into heads: three
    copies of every token's row); in the padded block that reads it, it is a view its product
    reads in place (`passes.views`)."""
    where = {id(op): k for k, (_, ops) in enumerate(parts) for op in ops}
    for k, (sym, ops) in enumerate(parts):
        if sym is None or sym is _ANY:
            continue
        for op in [op for op in ops if op.op is Op.RESHAPE]:
            readers = {where.get(user) for user in users.get(op.results[0].id, ())}
            if len(readers) != 1:
                continue
            (to,) = readers
            if to is not None and to > k and parts[to][0] is None:
                ops.remove(op)
                parts[to][1].insert(0, op)
                where[id(op)] = to


def _joined(parts: list[tuple]) -> list[tuple]:
    """`parts` with the packed ones that hold no product made padded (packing costs a copy in
    and out; elementwise ops save less than that), and padded neighbours joined."""
    out: list[tuple] = []
    for sym, ops in parts:
        if sym is not None and not any(op.op is Op.MATMUL for op in ops):
            sym = None
        if out and sym is None and out[-1][0] is None:
            out[-1][1].extend(ops)
        else:
            out.append((sym, list(ops)))
    return out


def row_wise(op: Operation, varying: set[int], ragged: set) -> Sym | None:
    """The ragged size s if `op` computes each row along s from that row alone: every operand
    and result that differs by lane has s as its first dim and no ragged size elsewhere, shared
    operands have none, and the op does not mix rows (elementwise, a product with a shared
    matrix, reductions, softmaxes, permutes and selects that keep the first dim, a reshape of
    the dims after it). Such an op computes the same on the lanes' rows packed together."""
    values = [(v, v.id in varying) for v in op.operands] + [(r, True) for r in op.results]
    if not any(lane for v, lane in values[:len(op.operands)]):
        return None
    firsts = {v.type.shape[0] if v.type.rank else None for v, lane in values if lane}
    if len(firsts) != 1:
        return None
    (sym,) = firsts
    if sym not in ragged:
        return None
    for v, lane in values:
        if any(d in ragged for d in v.type.shape[1 if lane else 0:]):
            return None
    return sym if _keeps_rows(op, [lane for _, lane in values[:len(op.operands)]]) else None


def _keeps_rows(op: Operation, flags: list[bool]) -> bool:
    kind, attrs = op.op, op.attrs
    ranks = [v.type.rank for v in op.operands]
    rank = op.results[0].type.rank
    if kind in ELEMENTWISE:   # a shared operand broadcasts over the rows, never along them
        return all(r == rank if f else (r < rank or v.type.shape[0] == 1)
                   for r, f, v in zip(ranks, flags, op.operands))
    if kind is Op.MATMUL:
        return flags == [True, False] and ranks[1] == 2 and ranks[0] >= 2
    if kind in _REDUCE_DIMS:
        dims = attrs.get("dims")
        return dims is not None and ranks[0] >= 2 and all(d % ranks[0] != 0 for d in dims)
    if kind in (Op.SOFTMAX, Op.LOG_SOFTMAX):
        return ranks[0] >= 2 and attrs["dim"] % ranks[0] != 0
    if kind is Op.PERMUTE:
        return attrs["dims"][0] % ranks[0] == 0
    if kind is Op.RESHAPE:
        return rank >= 1
    if kind is Op.SELECT:
        key = attrs["key"]
        first = key[0] if key else None
        return (len(op.operands) == 1 and first is not None and first[0] == "slice" and first[1] in (None, 0)
                and first[2] is None and first[3] in (None, 1))
    if kind is Op.CAT:
        return all(flags) and attrs["dim"] % ranks[0] != 0
    return False


def constant_source(v: Value, producers: dict[int, Operation]) -> Operation | None:
    """The op that makes `v` from nothing (a weight, a literal), if one does. Loop-invariant code
    motion moves these out of loops; native code made of a loop's body defines them again itself,
    so that a weight is packed for the GEMM once, when the program loads, not at every call."""
    op = producers.get(v.id)
    return op if op is not None and op.op in (Op.CONST, Op.SCALAR) else None


def _block(ops: list[Operation], varying: set[int], users: dict[int, set[int]],
           producers: dict[int, Operation], ragged: set, packed: Sym | None = None) -> Block:
    """A block of `ops`, with the constants it reads from other regions (`constant_source`)."""
    defined = {r.id for o in ops for r in o.results}
    weights = list({v.id: source for o in ops for v in o.operands
                    if v.id not in defined and (source := constant_source(v, producers))}.values())
    ops = weights + ops
    inside = {id(o) for o in ops}
    defined |= {w.results[0].id for w in weights}
    inputs = list({v.id: v for o in ops for v in o.operands if v.id not in defined}.values())
    outputs = [r for o in ops[len(weights):] for r in o.results if users.get(r.id, set()) - inside]
    masks = list(dict.fromkeys((sym, op.operands[k].type.rank, d) for op in ops
                               for k, d, sym in masked_operands(op, ragged)))
    return Block(ops, inputs, outputs, [v.id in varying for v in inputs], [v.id in varying for v in outputs], packed,
                 masks)


# --------------------------------------------------------------------------- the IR's batching rules


def _batchable(op: Operation, varying: set[int]) -> bool:
    """Whether `op` has an IR batching rule here and a native kernel."""
    if op.op in CONTROL or op.op in CREATION or op.op is Op.CONST or not kernels.supported(op):
        return False
    flags = [v.id in varying for v in op.operands]
    if not any(flags):
        return True   # the same in every lane: computed once, as it is
    return _rule(op, flags) is not None


def _rule(op: Operation, flags: list[bool]):
    """The attributes of `op` over lanes (its operands' varying ones have a lane dim in front),
    or None where no rule is written (the op then runs in the executor, with torch)."""
    kind, attrs = op.op, op.attrs
    ranks = [v.type.rank for v in op.operands]
    rank = op.results[0].type.rank
    if kind in ELEMENTWISE:   # a lane value of a lower rank is aligned first (`aligned`): the lane dims pair
        return dict(attrs) if all(r <= rank for r in ranks) else None
    if kind is Op.MATMUL:
        if flags == [True, False]:   # lanes' vectors or matrices times a shared matrix: one GEMM, lanes folded into its rows
            return dict(attrs) if ranks[1] == 2 else None
        if flags == [False, True]:   # a shared vector or matrix times each lane's matrix: a batch of GEMMs
            return dict(attrs) if ranks[1] >= 2 and ranks[0] <= 2 else None
        # each lane's matrix times its own: a batch of GEMMs over the lanes
        return dict(attrs) if ranks[0] == ranks[1] >= 2 else None
    if kind in (Op.SELECT, Op.UPDATE):   # each lane's own tensor; an index that differs by lane, each lane's own
        fixed = 1 if kind is Op.SELECT else 2
        if not flags[0] or any(flags[fixed:]) and any(i[0] == "new" for i in attrs["key"]):
            return None   # (a lane index beside None: where torch puts the lanes' dim is not each lane's)
        if any(not isinstance(size, int) for size in _indexed_sizes(op)):
            return None   # an index into a size that may differ by lane: checked per lane by the executor
        lane = iter(flags[fixed:])
        key = tuple(("lane",) if item[0] == "dyn" and next(lane) else item for item in attrs["key"])
        # (an UPDATE, or an index per lane, by the kernels over lanes; a SELECT at shared indices is a strided copy)
        whole = ("lanes",) if kind is Op.UPDATE or any(flags[fixed:]) else ("slice", None, None, None)
        return {**attrs, "key": (whole,) + key}
    if kind is Op.GATHER:   # a shared table at each lane's indices (an embedding lookup of each lane's token):
        #                     the lanes' index dims land where dim was, in front for dim 0
        return dict(attrs) if flags == [False, True] and attrs["dim"] == 0 else None
    if kind is Op.CAT:
        if not all(flags):
            return None
        return {**attrs, "dim": attrs["dim"] % ranks[0] + 1}
    if kind in _REDUCE_DIMS:
        dims = attrs.get("dims")
        if ranks[0] == 0:
            return None
        dims = tuple(range(1, ranks[0] + 1)) if dims is None else tuple(d % ranks[0] + 1 for d in dims)
        return {**attrs, "dims": dims}
    if kind in (Op.ARGMAX, Op.ARGMIN):   # (dim None: an index into the flattened tensor, dim 0 only for a vector)
        dim = 0 if attrs.get("dim") is None and ranks[0] == 1 else attrs.get("dim")
        return {**attrs, "dim": dim % ranks[0] + 1} if dim is not None and ranks[0] else None
    if kind in (Op.SOFTMAX, Op.LOG_SOFTMAX) and ranks[0] > 0:
        return {**attrs, "dim": attrs["dim"] % ranks[0] + 1}
    if kind is Op.PERMUTE:
        return {**attrs, "dims": (0,) + tuple(d % ranks[0] + 1 for d in attrs["dims"])}
    if kind is Op.RESHAPE:
        return {**attrs, "shape": (LANES,) + tuple(attrs["shape"])}
    if kind is Op.EXPAND and ranks[0] == len(attrs["shape"]):   # (a lower rank: aligned first, `levels.Straight`)
        return {**attrs, "shape": (LANES,) + tuple(attrs["shape"])}
    return None


def _indexed_sizes(op: Operation) -> list:
    """The sizes of the dims a SELECT/UPDATE key indexes by a dynamic operand."""
    shape, found, dim = op.operands[0].type.shape, [], 0
    for item in op.attrs["key"]:
        if item[0] == "dyn":
            found.append(shape[dim])
        dim += item[0] != "new"
    return found


def batched_program(block: Block, program: Program) -> Program:
    """The block as a program over `LANES` lanes: its inputs are parameters, its outputs results."""
    if block.packed is not None:
        return _packed_program(block, program)
    rename: dict[int, Value] = {}
    params = []
    for v, lane in zip(block.inputs, block.varying_inputs):
        rename[v.id] = Value(_over_lanes(v.type) if lane else v.type, v.hint)
        params.append(rename[v.id])
    masks = {key: Value(_mask_type(*key)) for key in block.masks}
    params += masks.values()
    ops = []
    for op in block.ops:
        operands = [rename[v.id] for v in op.operands]
        for k, d, sym in masked_operands(op, [key[0] for key in block.masks]):
            operands[k] = _masked(operands[k], masks[(sym, op.operands[k].type.rank, d)], padding_fill(op), ops)
        flags = [v.type.rank != o.type.rank for v, o in zip(operands, op.operands)]
        if op.op in ELEMENTWISE and any(flags):
            operands = [aligned(v, o.type, op.results[0].type.rank, ops) if lane else v
                        for v, o, lane in zip(operands, op.operands, flags)]
        attrs = _rule(op, flags) if any(flags) else dict(op.attrs)
        results = [Value(_over_lanes(r.type) if any(flags) else r.type, r.hint) for r in op.results]
        rename.update({r.id: n for r, n in zip(op.results, results)})
        ops.append(Operation(op.op, operands, results, attrs, [], op.loc))
    yields = [_as_lanes(rename[v.id], lane, ops) for v, lane in zip(block.outputs, block.varying_outputs)]
    sizes = sizes_of(params)
    return Program({"main": Function("main", Region(params, ops, yields))}, "main", program.constants,
                   program.device, sizes=sizes)


def aligned(v: Value, ty: TensorType, rank: int, ops: list[Operation]) -> Value:
    """A lane value `v` (each lane's of type `ty`) of a lower rank than the elementwise op
    that reads it, with 1s after its lane dim, so that broadcasting pairs the lane dims (each
    instance's scalar with its matrix); as it is where it has that rank already."""
    if ty.rank == rank:
        return v
    shape = (LANES, *[1] * (rank - ty.rank), *ty.shape)
    out = Value(TensorType(shape, ty.dtype))
    ops.append(Operation(Op.RESHAPE, [v], [out], {"shape": shape}))
    return out


def _mask_type(sym: Sym, rank: int, dim: int) -> TensorType:
    """Each lane's valid positions along its dim `dim` of a rank-`rank` value, broadcastable."""
    return TensorType((LANES, *[sym if d == dim else 1 for d in range(rank)]), torch.bool)


def _masked(x: Value, mask: Value, fill: float, ops: list[Operation]) -> Value:
    """x with `fill` where `mask` is false (past a lane's size)."""
    value = Value(TensorType((), x.type.dtype))
    ops.append(Operation(Op.SCALAR, [], [value], {"value": fill, "dtype": x.type.dtype}))
    out = Value(x.type, x.hint)
    ops.append(Operation(Op.WHERE, [mask, x, value], [out], {}))
    return out


def lane_mask(lengths: torch.Tensor, width: int, rank: int, dim: int) -> torch.Tensor:
    """`_mask_type`'s tensor: position j of lane i is valid where j < lengths[i]."""
    valid = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
    return valid.view(len(lengths), *[width if d == dim else 1 for d in range(rank)])


def _packed_program(block: Block, program: Program) -> Program:
    """A row-wise block as a program over the lanes' packed rows: its ragged size renamed
    `ROWS` in every type and attribute; each op as it is (the first dim keeps its place)."""
    sym = block.packed
    rename: dict[int, Value] = {}

    def renamed(ty: TensorType) -> TensorType:
        return TensorType(tuple(ROWS if d == sym else d for d in ty.shape), ty.dtype)

    params = []
    for v in block.inputs:
        rename[v.id] = Value(renamed(v.type), v.hint)
        params.append(rename[v.id])
    ops = []
    for op in block.ops:
        results = [Value(renamed(r.type), r.hint) for r in op.results]
        rename.update({r.id: n for r, n in zip(op.results, results)})
        attrs = dict(op.attrs)
        if op.op is Op.RESHAPE:
            attrs["shape"] = tuple(ROWS if d == sym else d for d in attrs["shape"])
        ops.append(Operation(op.op, [rename[v.id] for v in op.operands], results, attrs, [], op.loc))
    yields = [rename[v.id] for v in block.outputs]
    return Program({"main": Function("main", Region(params, ops, yields))}, "main", program.constants,
                   program.device, sizes=sizes_of(params))


def _over_lanes(ty: TensorType) -> TensorType:
    return TensorType((LANES, *ty.shape), ty.dtype)


def _as_lanes(value: Value, lane: bool, ops: list[Operation]) -> Value:
    """An output the analysis calls lane-varying but that the block computed once for all
    lanes (its operands did not differ): repeated per lane, so its type is what callers expect."""
    if not lane or (value.type.shape[:1] == (LANES,) and value.type.rank >= 1):
        return value
    out = Value(_over_lanes(value.type), value.hint)
    ops.append(Operation(Op.EXPAND, [value], [out], {"shape": (LANES, *value.type.shape)}))
    return out


def run_block(block: Block, env: dict, count: int, layout: RowLayout | None = None, masks: list = (),
              alloc=None) -> None:
    """Call the block's native entry for `count` lanes; its outputs into `env`. `layout`: where
    the lanes' rows lie, for a packed block; `masks`: the tensors of `block.masks`; `alloc`:
    memory for the outputs (`CompiledProgram.bind`)."""
    if block.packed is not None:
        inputs = [packed_rows(env[v.id], layout, count) if lane else env[v.id]
                  for v, lane in zip(block.inputs, block.varying_inputs)]
        outs = block.compiled(inputs, alloc)
        for v, lane, t in zip(block.outputs, block.varying_outputs, outs):
            env[v.id] = Packed(t, layout) if lane else t
        return
    inputs = [rows(env[v.id], count) if lane else env[v.id] for v, lane in zip(block.inputs, block.varying_inputs)]
    outs = block.compiled(inputs + list(masks), alloc)
    for v, lane, t in zip(block.outputs, block.varying_outputs, outs):
        env[v.id] = Lanes(t) if lane else t
