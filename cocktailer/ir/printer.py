"""The IR's text form: one operation per line, regions indented, control flow visible.

    func @main(%0: f32[1,8], %1: i64[]) -> (f32[1,8]) {
      %2 = const "cell.weight" : f32[8,8]
      %4 = loop trip=%1 carry(%0) {          # model.py:12
        ^(%5: i64[], %6: f32[1,8]):
        ...
        yield %9
      } : f32[1,8]
      return %4
    }
"""
from __future__ import annotations

from cocktailer.ir.ops import Op
from cocktailer.ir.program import Function, Operation, Program, Region
from cocktailer.ir.types import dtype_name

import torch


def _v(value) -> str:
    return f"%{value.id}"


def _attr(value) -> str:
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, tuple):
        return "(" + ",".join(_attr(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _key(key) -> str:
    parts = []
    for item in key:
        kind = item[0]
        if kind == "slice":
            start, stop, step = item[1:]
            s = f"{'' if start is None else start}:{'' if stop is None else stop}"
            parts.append(s if step in (None, 1) else f"{s}:{step}")
        elif kind == "int":
            parts.append(str(item[1]))
        elif kind == "dyn":
            parts.append("?")
        elif kind == "lane":
            parts.append("?lane")
        elif kind == "lanes":
            parts.append(":lanes")
        else:
            parts.append("None")
    return "[" + ", ".join(parts) + "]"


def _types(values) -> str:
    types = [str(v.type) for v in values]
    return types[0] if len(types) == 1 else "(" + ", ".join(types) + ")"


class _Printer:
    def __init__(self, show_locations: bool):
        self.lines: list[str] = []
        self.show_locations = show_locations

    def region(self, region: Region, depth: int, show_params: bool, keyword: str = "yield"):
        pad = "  " * depth
        if show_params and region.params:
            self.lines.append(pad + "^(" + ", ".join(f"{_v(p)}: {p.type}" for p in region.params) + "):")
        for op in region.ops:
            self.operation(op, depth)
        self.lines.append(pad + keyword + (" " + ", ".join(map(_v, region.yields)) if region.yields else ""))

    def operation(self, op: Operation, depth: int):
        pad = "  " * depth
        lhs = ", ".join(map(_v, op.results))
        lhs = lhs + " = " if lhs else ""
        loc = f"    # {op.loc}" if op.loc is not None and (self.show_locations or op.regions or op.op is Op.CALL) else ""
        name = op.op.name.lower()
        if op.op is Op.IF:
            self.lines.append(f"{pad}{lhs}if {_v(op.operands[0])} {{{loc}")
            self.region(op.regions[0], depth + 1, False)
            self.lines.append(f"{pad}}} else {{")
            self.region(op.regions[1], depth + 1, False)
            self.lines.append(f"{pad}}}" + (f" : {_types(op.results)}" if op.results else ""))
            return
        if op.op is Op.LOOP:
            trip = f" trip={_v(op.loop_trip)}" if op.loop_trip is not None else ""
            carry = " carry(" + ", ".join(map(_v, op.loop_inits)) + ")"
            stacked = f" stack(last {op.loop_stacked} yields)" if op.loop_stacked else ""
            self.lines.append(f"{pad}{lhs}loop{trip}{carry}{stacked} {{{loc}")
            if op.loop_cond is not None:
                self.lines.append(pad + "  cond:")
                self.region(op.loop_cond, depth + 2, True, keyword="continue_if")
                self.lines.append(pad + "  body:")
            self.region(op.loop_body, depth + 1, True)
            self.lines.append(f"{pad}}}" + (f" : {_types(op.results)}" if op.results else ""))
            return
        if op.op is Op.CALL:
            args = ", ".join(map(_v, op.operands))
            self.lines.append(f"{pad}{lhs}call @{op.attrs['callee']}({args}) : {_types(op.results)}{loc}")
            return
        if op.op is Op.CONST:
            self.lines.append(f"{pad}{lhs}const {op.attrs['name']!r} : {_types(op.results)}{loc}")
            return
        if op.op in (Op.SCALAR, Op.FULL):   # shape and dtype are in the result type
            self.lines.append(f"{pad}{lhs}{name} {op.attrs['value']} : {_types(op.results)}{loc}")
            return
        attrs = dict(op.attrs)
        key = attrs.pop("key", None)
        operands = ", ".join(map(_v, op.operands))
        text = f"{name} {operands}".rstrip()
        if key is not None:
            text += " " + _key(key)
        if attrs:
            text += " {" + ", ".join(f"{k}={_attr(v)}" for k, v in attrs.items()) + "}"
        self.lines.append(f"{pad}{lhs}{text} : {_types(op.results)}{loc}")

    def function(self, fn: Function):
        params = ", ".join(f"{_v(p)}: {p.type}" for p in fn.params)
        results = ", ".join(str(t) for t in fn.result_types)
        loc = f"    # {fn.loc}" if fn.loc is not None else ""
        self.lines.append(f"func @{fn.name}({params}) -> ({results}) {{{loc}")
        self.region(fn.body, 1, False, keyword="return")
        self.lines.append("}")


def format_region(region: Region, show_locations: bool = False) -> str:
    p = _Printer(show_locations)
    p.region(region, 0, True)
    return "\n".join(p.lines)


def format_program(program: Program, show_locations: bool = False) -> str:
    """The text form of a program: the entry function first, then the others."""
    p = _Printer(show_locations)
    order = [program.entry] + [n for n in program.functions if n != program.entry]
    for i, name in enumerate(order):
        if i:
            p.lines.append("")
        p.function(program.functions[name])
    return "\n".join(p.lines)
