"""Structural and type checks of a Program. `verify(program)` raises VerifyError naming
the function, the operation and the rule broken."""
from __future__ import annotations

from cocktailer.ir.infer import infer_type
from cocktailer.ir.ops import ARITY, CONTROL, Op
from cocktailer.ir.program import Function, Operation, Program, Region
from cocktailer.ir.types import BOOL, INDEX, TensorType


class VerifyError(Exception):
    pass


class _Verifier:
    def __init__(self, program: Program):
        self.program = program
        self.defined: set[int] = set()   # values ever defined, to catch double definition

    def fail(self, fn: Function, op: Operation | None, msg: str):
        where = f"@{fn.name}" + (f", {op.op.name.lower()} -> {[f'%{r.id}' for r in op.results]}" if op else "")
        raise VerifyError(f"{where}: {msg}")

    def define(self, fn, op, values, scope: set[int]):
        for v in values:
            if v.id in self.defined:
                self.fail(fn, op, f"%{v.id} is defined twice")
            self.defined.add(v.id)
            scope.add(v.id)

    def use(self, fn, op, values, scope: set[int]):
        for v in values:
            if v.id not in scope:
                self.fail(fn, op, f"%{v.id} is used where it is not visible (undefined, defined later, "
                                  "in a sibling or inner region, or in another function)")

    def region(self, fn: Function, owner: Operation | None, region: Region, scope: set[int]):
        scope = set(scope)
        self.define(fn, owner, region.params, scope)
        for op in region.ops:
            self.operation(fn, op, scope)
        self.use(fn, owner, region.yields, scope)

    def operation(self, fn: Function, op: Operation, scope: set[int]):
        self.use(fn, op, op.operands, scope)
        arity = ARITY[op.op]
        if arity is not None and len(op.operands) != arity:
            self.fail(fn, op, f"expects {arity} operands, has {len(op.operands)}")
        if op.op in CONTROL:
            getattr(self, f"check_{op.op.name.lower()}")(fn, op, scope)
        elif op.regions:
            self.fail(fn, op, "a data op cannot own regions")
        else:
            self.check_data(fn, op)
        self.define(fn, op, op.results, scope)

    def check_data(self, fn, op):
        if len(op.results) != 1:
            self.fail(fn, op, "a data op has exactly one result")
        if op.op is Op.CONST:
            tensor = self.program.constants.get(op.attrs.get("name"))
            if tensor is None:
                self.fail(fn, op, f"unknown constant {op.attrs.get('name')!r}")
            expected = TensorType.of(tensor)
        else:
            try:
                expected = infer_type(op.op, [v.type for v in op.operands], op.attrs)
            except Exception as e:  # torch's own message says what is wrong with the operands
                self.fail(fn, op, f"invalid operands or attributes: {e}")
        if op.results[0].type != expected:
            self.fail(fn, op, f"result type {op.results[0].type} but the op computes {expected}")

    def check_if(self, fn, op, scope):
        if not op.operands or op.operands[0].type != BOOL or len(op.operands) != 1:
            self.fail(fn, op, "if takes exactly one operand, a bool[] condition")
        if len(op.regions) != 2:
            self.fail(fn, op, "if has a then and an else region")
        for region in op.regions:
            if region.params:
                self.fail(fn, op, "if regions take no parameters")
            self.region(fn, op, region, scope)
            self.same_types(fn, op, region.yields, op.results, "branch yields vs results")

    def check_loop(self, fn, op, scope):
        trip, inits = op.loop_trip, op.loop_inits
        if trip is not None and trip.type != INDEX:
            self.fail(fn, op, f"trip count must be i64[], is {trip.type}")
        expected_regions = 1 + bool(op.attrs.get("has_cond"))
        if len(op.regions) != expected_regions:
            self.fail(fn, op, f"loop needs {expected_regions} regions, has {len(op.regions)}")
        carried = [INDEX] + [v.type for v in inits]
        self.same_types(fn, op, op.results[:len(inits)], inits, "results vs initial values")
        body = op.loop_body
        self.same_types(fn, op, body.params, carried, "body parameters vs (i64 index, carried)", types=True)
        self.region(fn, op, body, scope)
        self.same_types(fn, op, op.loop_carried_yields, inits, "body yields vs carried")
        self.check_stacked(fn, op)
        cond = op.loop_cond
        if cond is not None:
            self.same_types(fn, op, cond.params, carried, "cond parameters vs (i64 index, carried)", types=True)
            self.region(fn, op, cond, scope)
            if [v.type for v in cond.yields] != [BOOL]:
                self.fail(fn, op, "the loop condition must yield one bool[]")

    def check_stacked(self, fn, op):
        k = op.loop_stacked
        if not k:
            return
        if op.loop_trip is None or op.loop_cond is not None:
            self.fail(fn, op, "stacked loop outputs need a trip count and no condition")
        stacks, stacked = op.results[len(op.loop_inits):], op.loop_body.yields[-k:]
        if len(stacks) != k or any(s.type.shape[1:] != y.type.shape or s.type.dtype != y.type.dtype
                                   for s, y in zip(stacks, stacked)):
            self.fail(fn, op, "each stacked result must be [steps, *yield shape] of its yield's dtype")

    def check_call(self, fn, op, scope):
        callee = self.program.functions.get(op.attrs.get("callee"))
        if callee is None:
            self.fail(fn, op, f"call of unknown function {op.attrs.get('callee')!r}")
        self.same_types(fn, op, op.operands, callee.params, f"arguments vs @{callee.name} parameters")
        self.same_types(fn, op, op.results, callee.body.yields, f"results vs @{callee.name} results")

    def same_types(self, fn, op, got, want, what, types=False):
        got_t = [v.type for v in got]
        want_t = list(want) if types else [v.type for v in want]
        if got_t != want_t:
            self.fail(fn, op, f"type mismatch, {what}: {list(map(str, got_t))} != {list(map(str, want_t))}")


def verify(program: Program) -> Program:
    """Check the whole program; return it unchanged so calls can be chained."""
    if program.entry not in program.functions:
        raise VerifyError(f"entry function @{program.entry} does not exist")
    v = _Verifier(program)
    for fn in program.functions.values():
        v.region(fn, None, fn.body, set())
    return program
