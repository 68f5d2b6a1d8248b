"""Level programs: one level of a recursion, for all its calls, as one native program.

Once the inspector has found every call, its height and the arms of the slice's branches it
takes (`inspector.NativeInspector`), the calls of one height that take the same arms run the same
ops, with no branch left to split them. For such a group the function's body becomes a straight
line over `LANES` calls (Cortex's level-by-level execution of a linearized tree, with the leaf
case its own program, §3.1), compiled once by the native stages:

- a parameter every self-call hands on (a tree's tables) is read through an index, never copied
  per call: `table[node]` of call c reads row `root[c] * rows + node[c]` of the instances' tables
  stacked and flattened (ACROBAT's gather fusion, in the kernel); one used whole is its
  instance's row of the stacked parameter;
- a self-call reads its callee's results from the tables of the levels below, at the callee's id;
- branches the inspector decided are replaced by the arm the group takes;
- a product with a weight is one GEMM over the group (parameter reuse).

Indices into a dim whose size differs between instances count from the call's own instance's
end when negative; one the inspector did not already check sets the program's last output when
it is outside that instance's size, and the executor then raises, as eager would.

The executor runs a recursion's groups with one call of the native level loop
(`codegen.level_loop`), which calls each group's program in turn; before, Python drove one
torch op per op.
Anything the straight line cannot hold (a branch the inspector does not decide, a loop, a call of
another function, an op without a batching rule, a size read per instance) raises
NotImplementedError; that group then runs op by op.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from cocktailer.backend.batched import LevelRun
from cocktailer.batching.blocks import LANES, _over_lanes, _rule, aligned
from cocktailer.batching.ragged import needs_lane_sizes
from cocktailer.batching.recursion import LevelPlan
from cocktailer.ir import CONTROL, CREATION, ELEMENTWISE, Function, Op, Operation, Program, Region, Sym, TensorType, Value
from cocktailer.ir.analysis import sizes_of
from cocktailer.passes.dce import dce

CALLS_SYM = Sym("calls", hint=7)
INSTANCES_SYM = Sym("instances", hint=5)


@dataclass
class LevelProgram:
    program: Program
    inputs: list[tuple]   # what each parameter takes: ("table", j), ("offsets", j), ("rows", j), ("whole", j),
    #                       ("root",), ("arg", j), ("kids", s), ("results", k) or ("sizes", column); see
    #                       `level_inputs` (and loop programs' ("carried", k), ("source",), ("buffer", k),
    #                       ("buffer_rows", k): `loops._inputs`)
    checks: bool          # whether the last output says an index was outside its instance's size
    outputs: list[tuple]  # what each output is, before the flag: ("yield", i), the region's yield i per lane;
    #                       ("buffer", k), carried buffer k written in place (the output IS its input ("buffer", k))
    compiled: object = None


def level_program(plan: LevelPlan, program: Program, path: int, branches: tuple[int, ...],
                  ragged: list) -> LevelProgram:
    """The program of the calls of `plan` whose slice branches took the arms `path` (bit b: the
    first arm of branches[b])."""
    taken = {op_id: bool(path >> b & 1) for b, op_id in enumerate(branches)}
    fn = plan.function
    outer = {p.id: ("stacked" if through else "arg", j) for j, (p, through) in enumerate(zip(fn.params, plan.passthrough))}
    return Straight(fn.body, program, ragged, outer, sites=plan.sites, control=plan.control, taken=taken).build()


def level_inputs(level: LevelProgram, stacked: list, tree, start: int, end: int, tables: list,
                 per_lane_sizes) -> list:
    """The tensors for the parameters of `level`, for the calls start..end-1 of `tree`:
    `stacked`, the outer call's arguments (`lanes.Table`s, where every call hands them on),
    `per_lane_sizes` the instances' sizes of ragged dims."""
    out = []
    for kind, *which in level.inputs:
        if kind == "table":
            out.append(stacked[which[0]].flat())
        elif kind == "offsets":
            out.append(stacked[which[0]].offsets())
        elif kind == "whole":
            out.append(stacked[which[0]].whole())
        elif kind == "rows":
            out.append(torch.tensor(stacked[which[0]].width))
        elif kind == "root":
            out.append(tree.root[start:end])
        elif kind == "arg":
            out.append(tree.arguments[which[0]][start:end])
        elif kind == "kids":
            out.append(tree.children[which[0]][start:end])
        elif kind == "results":
            out.append(tables[which[0]])
        else:   # "sizes"
            out.append(per_lane_sizes[:, which[0]].contiguous())
    return out


PER_CALL = ("root", "arg", "kids")   # the inputs of one row per call; the others are the same for every group


def run_level_loop(run: list[tuple[int, int, LevelProgram]], stacked: list, tree, tables: list, per_lane_sizes,
                   bindings: dict):
    """Groups (start, end, level program), in order, run by one call of the native level loop
    (`codegen.level_loop`): each program bound once at its widest group, every group's inputs
    and results found by offsetting row pointers. `bindings`: the caller's, kept across batches
    (a batch of the sizes of an earlier one repoints its bindings instead of binding again)."""
    loop, index = LevelRun(bindings), {}
    for level in {id(level): level for _, _, level in run}.values():
        widest = max(end - start for start, end, other in run if other is level)
        inputs = level_inputs(level, stacked, tree, 0, tree.calls, tables, per_lane_sizes)
        index[id(level)] = loop.add(level.compiled, inputs, [kind in PER_CALL for kind, *_ in level.inputs],
                                    widest, tables, level.checks)
    if loop.run([(start, end, index[id(level)]) for start, end, level in run]) is not None:
        raise IndexError("an index is out of range for its instance's own size")


def condition_slice(region: Region, branches: list[Operation], program: Program, ragged: list, outer: dict,
                    late: set[int], late_why: str) -> "Straight":
    """A straight line (not yet built) of the ops of `region` that the conditions of its
    `branches` read, yielding each condition per lane. A condition that reads a value of `late`
    (by id) cannot be decided this way (`late_why` says why), nor one computed by a branch, a
    loop or a call."""
    made = {r.id: o for o in region.ops for r in o.results}
    needed, todo = set(), [b.operands[0].id for b in branches]
    while todo:
        vid = todo.pop()
        if vid in late:
            raise NotImplementedError(f"a branch is decided by {late_why}")
        o = made.get(vid)
        if o is None or id(o) in needed:
            continue
        if o.op in CONTROL:
            raise NotImplementedError(f"a branch is decided by a value a {o.op.name.lower()} computes")
        needed.add(id(o))
        todo += [v.id for v in o.operands]
    slice_ = Region(list(region.params), [o for o in region.ops if id(o) in needed], [b.operands[0] for b in branches])
    return Straight(slice_, program, ragged, outer)


class Straight:
    """A region as one straight line of ops over `LANES` lanes (a level's calls, a loop's
    lanes), with no branch left. `outer` says how each value the region reads from outside
    enters, by id: ("arg", j), one row per lane; ("stacked", j), each lane's instance's row of
    a tensor of one row per instance (`root` maps lanes to instances), read whole or, where the
    region indexes it, one row of it (a table); ("shared", j), the same for every lane;
    ("const", op), made by `op` (a CONST or SCALAR: made again inside, as the region's own);
    ("carried", k), a loop's carried value k, read from its table of every step's values at the
    row the ("source",) input gives (the lanes come in another order every step); ("gather",
    (table, index)), the same for any table and index inputs; ("row", key), one row per lane
    under the input `key`; ("buffer", k),
    a loop's carried value k kept in one buffer of all lanes' rows, read and written in place one
    row at a time (`buffer_row`). `sites`: the self-calls whose results come from the tables of
    the levels below; `control`: the ops whose indices an inspector already checked; `taken`:
    the arm each branch takes, by id; `only`: where given, the ops to run (a control slice: its
    self-calls are not made, their arguments are what the caller yields), the others skipped."""

    def __init__(self, body: Region, program: Program, ragged: list, outer: dict[int, tuple], *,
                 sites: tuple = (), control: frozenset = frozenset(), taken: dict | None = None,
                 only: frozenset | None = None):
        self.body, self.program, self.ragged, self.outer = body, program, ragged, outer
        self.sites, self.control, self.taken, self.only = sites, control, taken or {}, only
        self.rename: dict[int, Value] = {}
        self.lane: set[int] = set()   # ids of new values with a lane dim in front
        self.params: list[Value] = []
        self.kinds: list[tuple] = []
        self.ops: list[Operation] = []
        self.bad: Value | None = None   # any index outside its instance's size so far
        self.versions: dict[int, tuple[int, Value]] = {}   # id of a region value that is carried buffer k -> (k, here)
        self.reads: dict[int, list[Value]] = {}   # buffer k -> the rows read of it so far
        self.written: dict[int, Value] = {}       # buffer k -> its version after this step's write

    def build(self) -> LevelProgram:
        kept = {j for kind, j in self.outer.values() if kind == "buffer"}
        for i, y in enumerate(self.body.yields):
            if y.type.syms and i not in kept:
                raise NotImplementedError("a result's size is known only per call")
        self.region(self.body)
        yields, outputs = [], []
        for i, y in enumerate(self.body.yields):
            version = self.buffer(y)
            if version is None and i in kept:
                raise NotImplementedError(f"carried value {i}, kept in place, is carried on as another value")
            if version is None:
                yields.append(self.lanes(self.value(y)))
                outputs.append(("yield", i))
            elif version[0] != i:
                raise NotImplementedError(f"carried value {version[0]}, kept in place, is carried on as value {i}")
            elif version[0] in self.written:
                yields.append(version[1])
                outputs.append(("buffer", i))
        if self.bad is not None:
            yields.append(self.bad)
        main = Function("main", Region(self.params, self.ops, yields))
        program = dce(Program({"main": main}, "main", self.program.constants, self.program.device,
                              sizes=sizes_of(self.params)))
        return LevelProgram(program, self.kinds, self.bad is not None, outputs)

    # ------------------------------------------------------------------ values

    def input(self, kind: tuple, ty: TensorType, lane: bool = False) -> Value:
        if kind in self.kinds:
            return self.params[self.kinds.index(kind)]
        v = Value(ty, kind[0])
        self.params.append(v)
        self.kinds.append(kind)
        if lane:
            self.lane.add(v.id)
        return v

    def value(self, v: Value) -> Value:
        if v.id in self.rename:
            return self.rename[v.id]
        kind, j = self.outer.get(v.id, (None, None))
        if kind is None:
            raise NotImplementedError("the body reads a value from outside it")
        if kind == "stacked":   # used whole: each lane's instance's row
            if v.type.syms:
                raise NotImplementedError(f"value {j} from outside, each instance's own, is used whole and its "
                                          "size differs by instance")
            root = self.input(("root",), TensorType((LANES,), torch.int64), lane=True)
            stacked = self.input(("whole", j), TensorType((INSTANCES_SYM, *v.type.shape), v.type.dtype))
            self.rename[v.id] = self.emit(Op.GATHER, [stacked, root], _over_lanes(v.type), True, dim=0)
            return self.rename[v.id]
        if kind == "const":   # a weight or a literal, made again here as the body's own are
            self.rename[v.id] = self.emit(j.op, [], v.type, False, **j.attrs)
            return self.rename[v.id]
        if kind == "carried":   # row `source` of the table of every step's values
            kind, j = "gather", (("carried", j), ("source",))
        if kind == "gather":   # j: (a table's input, an index's): each lane's row of the table
            table_key, index_key = j
            index = self.input(index_key, TensorType((LANES,), torch.int64), lane=True)
            rows_ = Sym("rows_" + "_".join(map(str, table_key)), hint=17)
            table = self.input(table_key, TensorType((rows_, *v.type.shape), v.type.dtype))
            self.rename[v.id] = self.emit(Op.GATHER, [table, index], _over_lanes(v.type), True, dim=0)
            return self.rename[v.id]
        if kind == "row":   # j: the key of an input of one row per lane
            return self.input(j, _over_lanes(v.type), lane=True)
        if kind == "buffer":
            raise NotImplementedError(f"carried value {j}, kept in place, is used other than one row at a time")
        if kind == "shared":
            if v.type.syms:
                raise NotImplementedError(f"value {j} from outside, the same in every lane, has a symbolic size")
            return self.input(("shared", j), v.type)
        return self.input(("arg", j), _over_lanes(v.type), lane=True)

    def known(self, v: Value) -> bool:
        """Whether `v` is defined here or enters from outside."""
        return v.id in self.rename or v.id in self.outer or v.id in self.versions

    def emit(self, kind: Op, operands: list[Value], ty: TensorType, lane: bool, **attrs) -> Value:
        out = Value(ty)
        self.ops.append(Operation(kind, operands, [out], attrs))
        if lane:
            self.lane.add(out.id)
        return out

    def lanes(self, v: Value) -> Value:
        """`v` with a lane dim: a value the same for every call repeated per call."""
        if v.id in self.lane:
            return v
        return self.emit(Op.EXPAND, [v], _over_lanes(v.type), True, shape=(LANES, *v.type.shape))

    # ------------------------------------------------------------------ ops

    def region(self, region: Region):
        for op in region.ops:
            if self.only is None or id(op) in self.only:
                self.op(op)

    def op(self, op: Operation):
        kind = op.op
        if kind is Op.IF:
            return self.branch(op)
        if kind is Op.CALL:
            return self.call(op) if self.only is None else None
        if kind in CONTROL:
            raise NotImplementedError(f"the body holds a {kind.name.lower()}")
        if kind in (Op.SELECT, Op.UPDATE) and self.buffer(op.operands[0]) is not None:
            return self.buffer_row(op)
        if kind is Op.SELECT and self.outer.get(op.operands[0].id, ("",))[0] == "stacked":
            return self.read_table(op)
        if kind is Op.DIM:
            raise NotImplementedError("the body reads a size")
        if needs_lane_sizes(op, self.ragged):
            raise NotImplementedError(f"{kind.name} reads padding each instance's own size must mask")
        operands = [self.value(v) for v in op.operands]
        if kind in ELEMENTWISE or kind is Op.EXPAND:
            operands = [self.aligned(v, o.type, op.results[0].type.rank) for v, o in zip(operands, op.operands)]
        flags = [v.id in self.lane for v in operands]
        if kind is Op.MATMUL and flags == [True, True] and [v.type.rank for v in op.operands] == [2, 1]:
            return self.matrix_times_vector(op, operands)
        if any(flags):   # (elementwise and EXPAND: every per-call operand aligned to the result's rank above)
            attrs = (dict(op.attrs) if kind in ELEMENTWISE else
                     {**op.attrs, "shape": (LANES, *op.attrs["shape"])} if kind is Op.EXPAND else _rule(op, flags))
            if attrs is None:
                raise NotImplementedError(f"{kind.name} has no batching rule for these operands")
            results = [Value(_over_lanes(r.type)) for r in op.results]
        else:
            if (kind in CREATION or kind is Op.CONST) and any(r.type.syms for r in op.results):
                raise NotImplementedError(f"{kind.name} makes a tensor of a size known per call")
            attrs, results = dict(op.attrs), [Value(r.type) for r in op.results]
        self.ops.append(Operation(kind, operands, results, attrs, [], op.loc))
        for r, new in zip(op.results, results):
            self.rename[r.id] = new
            if any(flags):
                self.lane.add(new.id)

    def matrix_times_vector(self, op: Operation, operands: list[Value]):
        """Each call's matrix times its own vector (MV-RNN's `B @ a`): the vectors made columns,
        one batch of products over the calls, the columns made vectors again."""
        (m, k), n = op.operands[0].type.shape, op.results[0].type
        column = self.emit(Op.RESHAPE, [operands[1]], TensorType((LANES, k, 1), n.dtype), True, shape=(LANES, k, 1))
        product = self.emit(Op.MATMUL, [operands[0], column], TensorType((LANES, m, 1), n.dtype), True)
        self.rename[op.results[0].id] = self.emit(Op.RESHAPE, [product], _over_lanes(n), True, shape=(LANES, m))

    def aligned(self, v: Value, ty: TensorType, rank: int) -> Value:
        """A per-call value of a lower rank than the elementwise op's result, with 1s after its
        lane dim (`blocks.aligned`)."""
        if v.id not in self.lane:
            return v
        out = aligned(v, ty, rank, self.ops)
        self.lane.add(out.id)
        return out

    def branch(self, op: Operation):
        if id(op) not in self.taken and chooses_only(op):
            return self.choice(op)
        if id(op) not in self.taken:
            raise NotImplementedError("a branch not decided before the program runs (by the inspector, or, in a loop, "
                                      "by the program of its condition: not inside another branch)")
        arm = op.regions[0] if self.taken[id(op)] else op.regions[1]
        self.region(arm)
        for r, y in zip(op.results, arm.yields):
            if self.only is not None and not self.known(y):
                continue   # a result the slice does not need: its arm's ops were skipped
            version = self.buffer(y)
            if version is not None:
                self.versions[r.id] = version
            else:
                self.rename[r.id] = self.value(y)

    def choice(self, op: Operation):
        """A branch whose arms compute nothing, only choose between values (`flag = True if
        done.all() else flag`): a WHERE per result, each lane taking its own condition's value."""
        cond = self.value(op.operands[0])
        for r, a, b in zip(op.results, *(arm.yields for arm in op.regions)):
            if self.buffer(a) is not None or self.buffer(b) is not None:
                raise NotImplementedError("a branch chooses between versions of a buffer kept in place")
            operands = [self.value(a), self.value(b)]
            lane = any(v.id in self.lane for v in [cond, *operands])
            operands = [self.aligned(v, t, r.type.rank) for v, t in zip([cond, *operands],
                                                                       [op.operands[0].type, a.type, b.type])]
            self.rename[r.id] = self.emit(Op.WHERE, operands, _over_lanes(r.type) if lane else r.type, lane)

    def call(self, op: Operation):
        if op not in self.sites:
            raise NotImplementedError("the body calls another function")
        kids = self.input(("kids", self.sites.index(op)), TensorType((LANES,), torch.int64), lane=True)
        for k, r in enumerate(op.results):
            table = self.input(("results", k), TensorType((CALLS_SYM, *r.type.shape), r.type.dtype))
            self.rename[r.id] = self.emit(Op.GATHER, [table, kids], _over_lanes(r.type), True, dim=0)

    # ------------------------------------------------------------------ carried buffers

    def buffer(self, v: Value) -> tuple[int, Value] | None:
        """(k, its value here) where `v` is a version of carried buffer k, else None."""
        if v.id in self.versions:
            return self.versions[v.id]
        kind, k = self.outer.get(v.id, (None, None))
        if kind != "buffer":
            return None
        flat = self.input(("buffer", k), TensorType((Sym(f"buffer{k}", hint=13), *v.type.shape[1:]), v.type.dtype))
        self.versions[v.id] = (k, flat)
        return self.versions[v.id]

    def buffer_row(self, op: Operation):
        """`buf[i]` or `buf[i] = x` of a carried buffer: row root * rows + i of all lanes' rows,
        read by a GATHER or written in place by a SCATTER. The write must be the step's only
        one, and come after (depend on) every read of the rows it may overwrite."""
        x = op.operands[0]
        k, current = self.buffer(x)
        if not one_row(op.attrs["key"]):
            raise NotImplementedError(f"carried value {k}, kept in place, is indexed other than by one row")
        if k in self.written and current is not self.written[k]:
            raise NotImplementedError(f"carried value {k}, kept in place, is read as it was before this step wrote it")
        index = self.flat_row(op, ("buffer_rows", k), x, check=True)
        if op.op is Op.SELECT:
            row = self.emit(Op.GATHER, [current, index], _over_lanes(op.results[0].type), True, dim=0)
            self.rename[op.results[0].id] = row
            self.reads.setdefault(k, []).append(row)
            return
        if k in self.written:
            raise NotImplementedError(f"carried value {k}, kept in place, is written twice in one step")
        value = op.operands[1]
        if value.type.shape != x.type.shape[1:] or value.type.dtype != x.type.dtype:
            raise NotImplementedError(f"a write into carried value {k}, kept in place, is not one whole row")
        value = self.lanes(self.value(value))
        before = self.ancestors([value, index])
        if any(row.id not in before for row in self.reads.get(k, [])):
            raise NotImplementedError(f"a write into carried value {k}, kept in place, may overtake a read of it")
        self.written[k] = self.emit(Op.SCATTER, [current, index, value], current.type, False, dim=0)
        self.versions[op.results[0].id] = (k, self.written[k])

    def flat_row(self, op: Operation, rows_input: tuple, x: Value, check: bool) -> Value:
        """For `x[i]` or `x[i] = v` (`op`, the key one index i), where each lane's instance has
        its rows of x in a table of `rows_input` rows per instance: row first + i, i counted
        from the instance's own end when negative and, with `check`, checked. `first`, the
        instance's first row, is root * rows in a carried buffer, and read from the table's
        offsets in an outer table (`lanes.Table`: packed or padded rows)."""
        key = op.attrs["key"]
        i64 = TensorType((), torch.int64)
        if key[0][0] == "dyn":
            index = self.value(op.operands[1 if op.op is Op.SELECT else 2])
        else:
            index = self.emit(Op.SCALAR, [], i64, False, value=int(key[0][1]), dtype=torch.int64)
        if index.type.dtype is not torch.int64:
            index = self.emit(Op.CAST, [index], TensorType(index.type.shape, torch.int64), index.id in self.lane,
                              dtype=torch.int64)
        root = self.input(("root",), TensorType((LANES,), torch.int64), lane=True)
        lanes = TensorType((LANES,), torch.int64)
        if x.type.shape[0] in self.ragged:
            sizes = self.input(("sizes", self.ragged.index(x.type.shape[0])), TensorType((INSTANCES_SYM,), torch.int64))
            size = self.emit(Op.GATHER, [sizes, root], lanes, True, dim=0)
        else:
            size = self.input(rows_input, i64)
        index = self.own_index(index, size, check)
        if rows_input[0] == "rows":
            offsets = self.input(("offsets", rows_input[1]), TensorType((INSTANCES_SYM,), torch.int64))
            first = self.emit(Op.GATHER, [offsets, root], lanes, True, dim=0)
        else:
            first = self.emit(Op.MUL, [root, self.input(rows_input, i64)], lanes, True)
        return self.emit(Op.ADD, [first, index], lanes, True)

    def ancestors(self, values: list[Value]) -> set[int]:
        """The ids of the values (of the ops emitted so far) that `values` are computed from."""
        made = {r.id: op for op in self.ops for r in op.results}
        seen, todo = set(), [v.id for v in values]
        while todo:
            vid = todo.pop()
            if vid in seen:
                continue
            seen.add(vid)
            if vid in made:
                todo += [v.id for v in made[vid].operands]
        return seen

    def read_table(self, op: Operation):
        """`table[i]` of a table each lane's instance has: row root * rows + i of the stacked tables."""
        table = op.operands[0]
        _, j = self.outer[table.id]
        if not one_row(op.attrs["key"]):
            raise NotImplementedError("the body indexes a value from outside other than by one row of a table")
        flat = self.flat_row(op, ("rows", j), table, check=id(op) not in self.control)
        stacked = self.input(("table", j), TensorType((Sym(f"table{j}", hint=11), *table.type.shape[1:]),
                                                      table.type.dtype))
        self.rename[op.results[0].id] = self.emit(Op.GATHER, [stacked, flat], _over_lanes(op.results[0].type),
                                                  True, dim=0)

    def own_index(self, index: Value, size: Value, check: bool) -> Value:
        """The index counted from its instance's own end when negative; with `check`, noted
        when outside that instance's size."""
        lane = index.id in self.lane or size.id in self.lane
        ty = TensorType((LANES,) if lane else (), torch.int64)
        flag = TensorType(ty.shape, torch.bool)
        zero = self.emit(Op.SCALAR, [], TensorType((), torch.int64), False, value=0, dtype=torch.int64)
        negative = self.emit(Op.LT, [index, zero], flag, lane)
        index = self.emit(Op.WHERE, [negative, self.emit(Op.ADD, [index, size], ty, lane), index], ty, lane)
        if check:
            outside = self.emit(Op.OR, [self.emit(Op.LT, [index, zero], flag, lane),
                                        self.emit(Op.GE, [index, size], flag, lane)], flag, lane)
            found = self.emit(Op.ANY, [outside], TensorType((), torch.bool), False, dims=None, keepdim=False)
            self.bad = found if self.bad is None else self.emit(Op.OR, [self.bad, found], found.type, False)
        return index


def chooses_only(op: Operation) -> bool:
    """Whether the branch `op`'s arms hold no op: each result is one of two values."""
    return op.op is Op.IF and all(not arm.ops for arm in op.regions)


def one_row(key: tuple) -> bool:
    """Whether a SELECT/UPDATE key is one index into the first dim (`x[i]`)."""
    return len(key) == 1 and key[0][0] in ("dyn", "int")
