"""A uProgram as text: per function, its uOperators with their uTasks per worker, the barriers
between them, and the control-flow uTasks with the level they run at (for explain)."""
from __future__ import annotations

from cocktailer.ir import Op
from cocktailer.schedule.utask import Barrier, Block, BranchUTask, FanOut, LoopUTask, Sync, UOperator, UProgram, UTaskRef


def format_uprogram(up: UProgram) -> str:
    lines = [f"uProgram on {up.device.kind}: {up.device.workers} L1 worker(s); control flow at {up.control_level}"]
    lines += [f"  decision: {d}" for d in up.decisions]
    for name, block in up.functions.items():
        lines.append(f"  function @{name}:")
        _block(block, lines, "    ")
    return "\n".join(lines)


def _where(op) -> str:
    return f"  # {op.loc}" if op.loc else ""


def _block(block: Block, lines: list[str], indent: str):
    for item in block.items:
        if isinstance(item, UOperator):
            op = item.op
            result = f"%{op.results[0].id} = " if op.results else ""
            lo, hi = item.group or (0, item.num_tasks)
            tasks = f"1 uTask on w{lo}" if hi - lo == 1 else f"{hi - lo} uTasks, one per worker (w{lo}..w{hi - 1})"
            if item.group is not None:
                tasks += " [co-scheduled]"
            if op.op is Op.CONST:
                tasks = "bound zero-copy, no uTask"
            lines.append(f"{indent}{result}{op.op.name.lower()} {op.results[0].type if op.results else ''}: "
                         f"{tasks}{_where(op)}")
        elif isinstance(item, Barrier):
            reason = ", ".join(f"%{v.id}" for v in item.reason)
            lines.append(f"{indent}barrier (all workers{'; before reading ' + reason if reason else ''})")
        elif isinstance(item, Sync):
            waits = "; ".join(f"w{w} waits for {', '.join(f'w{p}' for p in on)}" for w, on in item.waits.items())
            lines.append(f"{indent}fine-grained barrier (step array: {waits or 'no waits'})")
        elif isinstance(item, LoopUTask):
            lines.append(f"{indent}loop-uTask at {item.level}{_where(item.op)}")
            if item.cond is not None:
                lines.append(f"{indent}  condition:")
                _block(item.cond, lines, indent + "    ")
            lines.append(f"{indent}  body:")
            _block(item.body, lines, indent + "    ")
        elif isinstance(item, BranchUTask):
            lines.append(f"{indent}branch-uTask at {item.level}{_where(item.op)}")
            lines.append(f"{indent}  then:")
            _block(item.then, lines, indent + "    ")
            lines.append(f"{indent}  else:")
            _block(item.orelse, lines, indent + "    ")
        elif isinstance(item, UTaskRef):
            lines.append(f"{indent}call @{item.callee} (uTask reference, new frame) at {item.level}{_where(item.op)}")
        elif isinstance(item, FanOut):
            calls = " | ".join(f"@{c.callee}" for c in item.calls)
            lines.append(f"{indent}fan-out at {item.level}: {len(item.calls)} independent calls on worker groups "
                         f"at once [{calls}], then a barrier{_where(item.calls[0].op)}")
