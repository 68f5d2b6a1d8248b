"""Constant folding: a data op whose operands are all constants (the transpose of a weight
that `F.linear` becomes, a batch-norm scale) is computed once, at compile time, and becomes
a constant itself — in a loop body that is work saved at every iteration.

A folded constant keeps its recipe (`Program.derived`): if a source tensor is later changed
in place (`load_state_dict`, an optimizer step), `refresh_derived` recomputes it before the
next call, using torch's version counters, so folding never serves stale weights."""
from __future__ import annotations

import torch

from cocktailer.ir import CREATION, SEMANTICS, Op, Program
from cocktailer.ir.printer import _attr
from cocktailer.runtime.memo import DERIVED, version

# Ops worth folding: anything but sources (already constant or cheap) and control flow.
_NOT_FOLDED = CREATION | {Op.CONST, Op.IF, Op.LOOP, Op.CALL}


def _name(op, sources: list[str]) -> str:
    attrs = ",".join(f"{k}={_attr(v)}" for k, v in op.attrs.items())
    return f"{op.op.name.lower()}({', '.join(sources)}{'; ' + attrs if attrs else ''})"


def fold_constants(program: Program) -> Program:
    for fn in program.functions.values():
        names: dict[int, str] = {}   # value id -> constant name
        for op in fn.body.walk():
            if op.op is Op.CONST:
                names[op.results[0].id] = op.attrs["name"]
            elif op.op is Op.SCALAR:   # a number is a constant too (the eps of a batch norm)
                names[op.results[0].id] = _scalar_constant(program, op)
            elif op.op not in _NOT_FOLDED and op.operands and all(v.id in names for v in op.operands):
                sources = [names[v.id] for v in op.operands]
                name = _name(op, sources)
                if name not in program.constants:
                    program.derived[name] = (op.op, dict(op.attrs), sources)
                    program.constants[name] = _compute(program, name)
                    program.derived_versions[name] = _versions(program, sources)
                op.op, op.operands, op.attrs = Op.CONST, [], {"name": name}
                names[op.results[0].id] = name
    return program


def _scalar_constant(program: Program, op) -> str:
    value, dtype = op.attrs["value"], op.attrs["dtype"]
    name = f"{value!r}:{str(dtype).removeprefix('torch.')}"
    if name not in program.constants:
        program.constants[name] = torch.tensor(value, dtype=dtype, device=program.device)
    return name


def _compute(program: Program, name: str) -> torch.Tensor:
    kind, attrs, sources = program.derived[name]
    tensors = [program.constants[s] for s in sources]

    def compute():
        with torch.no_grad():
            # one contiguous copy (never a view of a source: refreshing writes into it in place)
            return SEMANTICS[kind](*tensors, **attrs).clone(memory_format=torch.contiguous_format)
    # compiling the model again reuses it (programs sharing it refresh it alike: same sources)
    return DERIVED.get((kind, repr(sorted(attrs.items()))), tensors, compute)


def _versions(program: Program, sources: list[str]) -> tuple[int, ...]:
    return tuple(version(program.constants[s]) for s in sources)


def refresh_derived(program: Program):
    """Recompute folded constants whose sources were written in place since (in place, so
    native code holding their pointers sees the new values)."""
    for name, (_, _, sources) in program.derived.items():
        versions = _versions(program, sources)
        if versions != program.derived_versions[name]:
            with torch.no_grad():
                program.constants[name].copy_(_compute(program, name))
            program.derived_versions[name] = _versions(program, sources)
