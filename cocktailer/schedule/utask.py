"""The uTask abstractions (Cocktailer §3.1, Rammer's rTasks): a data op becomes a uOperator
of homogeneous uTasks (tiles of its output); a loop becomes a Loop-uTask whose body is a
uProgram block run by every unit of its level; a branch a Branch-uTask; a call of a
(recursive) function a uTask reference. Barriers separate dependent uTasks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from cocktailer.ir import Operation, Program, Value
from cocktailer.schedule.device import Device


@dataclass
class UOperator:
    op: Operation
    num_tasks: int        # uTasks: the op's output split into this many tiles, dealt to the L1 units
    group: tuple[int, int] | None = None   # the workers [lo, hi) its uTasks go to; None: all of them


@dataclass
class Sync:
    """Rammer's barrier-rTask: every worker publishes its step in a step array of per-worker
    counters, then worker w waits only for the workers `waits[w]` (those whose earlier uTasks
    wrote what w reads next, or read what w writes next) to reach the same step."""
    waits: dict[int, tuple[int, ...]]


@dataclass
class Barrier:
    """All units of the level wait here. `reason` names the values whose writes must be seen."""
    reason: tuple[Value, ...] = ()


@dataclass
class Block:
    items: list["Item"] = field(default_factory=list)


@dataclass
class LoopUTask:
    op: Operation
    body: Block
    cond: Block | None
    level: str


@dataclass
class BranchUTask:
    op: Operation
    then: Block
    orelse: Block
    level: str


@dataclass
class UTaskRef:
    """A call: the callee's uProgram, entered with a new frame on the simulated stack."""
    op: Operation
    callee: str
    level: str


@dataclass
class FanOut:
    """Independent calls run at once (recursion unroll, Cocktailer Figure 8): the level's units
    split into min(calls, units) groups, call i goes to group i mod groups, and each group runs
    its calls with its own barrier and its own stack of frames; all meet at a barrier after.
    Nested inside a call that fanned out, a group splits again while it has units to spare,
    so the top ⌈log2 units⌉ levels of a binary recursion run in parallel subtrees."""
    calls: list[UTaskRef]
    level: str


Item = Union[UOperator, Barrier, Sync, LoopUTask, BranchUTask, UTaskRef, FanOut]


@dataclass
class UProgram:
    program: Program
    device: Device
    functions: dict[str, Block]       # one block per IR function, entry first
    control_level: str                # where control flow runs: "L1" (in native code) or "host" (Python)
    decisions: list[str] = field(default_factory=list)   # what the policy chose and why, for explain()

    # -- what the placement did, as later stages need to know it ---------------------------
    def items(self):
        """Every item at any depth."""
        pending = [item for block in self.functions.values() for item in block.items]
        while pending:
            item = pending.pop()
            yield item
            if isinstance(item, LoopUTask):
                pending += item.body.items + (item.cond.items if item.cond else [])
            elif isinstance(item, BranchUTask):
                pending += item.then.items + item.orelse.items

    @property
    def co_scheduled(self) -> bool:
        """Some uTasks run on a group of the workers: the program needs every worker it was placed on."""
        return any(isinstance(i, UOperator) and i.group is not None for i in self.items())

    @property
    def fine_barriers(self) -> bool:
        """Some synchronizations are fine-grained (a step array): they too need every worker."""
        return any(isinstance(i, Sync) for i in self.items())

    @property
    def fans_out(self) -> bool:
        """Calls fan out to worker groups, each with a stack of frames of its own."""
        return any(isinstance(i, FanOut) for i in self.items())
