"""The traced graph: a program with its control flow resolved for one input.

Running a Program on concrete inputs and recording every data op it executes gives the
straight-line program that the papers call the traced graph: loops unrolled, only the
taken branches, recursion flattened in the order of that input's tree, tensor indices
frozen to their values. It computes the same result for that input only, and is the
lower bound of what control flow may cost (Cocktailer §5, Figures 15/16/18)."""
from __future__ import annotations

import weakref
from typing import Sequence

import torch

from cocktailer.ir import Function, Op, Operation, Program, Region, TensorType, Value
from cocktailer.passes.dce import dce
from cocktailer.reference.executor import ReferenceExecutor


class _Recorder(ReferenceExecutor):
    def __init__(self, program: Program):
        super().__init__(program)
        self.region = Region()
        self.recorded: dict[int, Value] = {}   # id of a live concrete tensor -> its value in the trace

    def new_value(self, tensor: torch.Tensor) -> Value:
        value = Value(TensorType.of(tensor))
        key = id(tensor)
        self.recorded[key] = value
        # When the executor drops the tensor, its id may be reused: forget it then (not before,
        # so a whole ResNet's activations need not stay alive while it is traced).
        weakref.finalize(tensor, self.recorded.pop, key, None)
        return value

    def traced(self, tensor: torch.Tensor) -> Value:
        value = self.recorded.get(id(tensor))
        if value is None:   # a loop index: a constant of the trace
            value = self.new_value(tensor)
            self.region.ops.append(Operation(Op.SCALAR, [], [value], {"value": int(tensor), "dtype": tensor.dtype}))
        return value

    def run_op(self, op: Operation, env: dict):
        super().run_op(op, env)
        if op.op in (Op.IF, Op.LOOP, Op.CALL):
            return   # their regions' ops were recorded as they ran
        operands, attrs = [env[v.id] for v in op.operands], dict(op.attrs)
        if op.op in (Op.SELECT, Op.UPDATE):   # freeze tensor indices to the values they had
            fixed = 1 if op.op is Op.SELECT else 2
            pairs = _with_operands(attrs["key"], operands[fixed:])
            attrs["key"] = tuple(("int", int(d)) if item[0] == "dyn" else item for item, d in pairs)
            operands = operands[:fixed] + [d for item, d in pairs if item[0] == "lane"]   # (over lanes: kept)
        result = env[op.results[0].id]
        if op.op is Op.CONST and id(result) in self.recorded:
            return
        new_operands = [self.traced(t) for t in operands]
        self.region.ops.append(Operation(op.op, new_operands, [self.new_value(result)], attrs, [], op.loc))


def _with_operands(key: tuple, dynamic: list) -> list[tuple]:
    """Each key item with the dynamic operand it reads (None for an item that reads none)."""
    it = iter(dynamic)
    return [(item, next(it) if item[0] in ("dyn", "lane") else None) for item in key]


def traced_graph(program: Program, inputs: Sequence[torch.Tensor]) -> Program:
    """The straight-line program `program` executes on `inputs` (see module doc)."""
    recorder = _Recorder(program)
    params = [recorder.new_value(t) for t in inputs]
    recorder.region.params = params
    outputs = recorder(list(inputs))
    recorder.region.yields = [recorder.traced(t) for t in outputs]
    main = Function("main", recorder.region, program.main.loc)
    traced = Program({"main": main}, "main", dict(program.constants), program.device, program.input_spec,
                     program.output_spec, dict(program.derived), dict(program.derived_versions),
                     program.boundary, program.attribute_writes)
    return dce(traced)
