"""IR Program -> uProgram: uTasks placed on the device's unit levels (Cocktailer/Rammer)."""
from cocktailer.schedule.device import Device, UnitLevel
from cocktailer.schedule.policy import SimplePolicy
from cocktailer.schedule.utask import Barrier, Block, BranchUTask, LoopUTask, UOperator, UProgram, UTaskRef

__all__ = ["Barrier", "Block", "BranchUTask", "Device", "LoopUTask", "SimplePolicy", "UOperator", "UProgram",
           "UTaskRef", "UnitLevel"]
