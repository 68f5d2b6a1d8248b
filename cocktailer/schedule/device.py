"""A device as levels of homogeneous parallel units (Cocktailer §3.1): control flow is placed
at the lowest level that is still correct, and every unit there runs its own copy of it."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class UnitLevel:
    name: str      # "L0", "L1", "L2"
    unit: str      # what one unit is on this device
    count: int     # units of this level inside one unit of the level above (L2: 1)


@dataclass(frozen=True)
class Device:
    kind: str                          # "cpu" (a "cuda" device has the same three levels)
    unit_levels: tuple[UnitLevel, ...]  # L0 first

    def level(self, name: str) -> UnitLevel:
        return next(l for l in self.unit_levels if l.name == name)

    @property
    def workers(self) -> int:
        return self.level("L1").count

    @staticmethod
    def cpu(workers: int | None = None, simd_lanes: int = 16) -> "Device":
        """L0: SIMD lanes (16 float32 lanes with AVX-512); L1: persistent worker threads (vEUs);
        L2: one native call of the whole program."""
        workers = workers or len(os.sched_getaffinity(0))
        return Device("cpu", (UnitLevel("L0", "SIMD lane", simd_lanes), UnitLevel("L1", "worker thread", workers),
                              UnitLevel("L2", "native call", 1)))

    @staticmethod
    def cuda(blocks: int, threads: int) -> "Device":
        """L0: a block's threads (its lanes); L1: the persistent kernel's blocks, one per vEU;
        L2: one launch of the whole program."""
        return Device("cuda", (UnitLevel("L0", "thread", threads), UnitLevel("L1", "thread block", blocks),
                               UnitLevel("L2", "kernel launch", 1)))


@dataclass(frozen=True)
class Gpu:
    """What decides how many blocks of a kernel a GPU holds at once (its SMs' limits)."""
    name: str
    sms: int
    registers_per_sm: int
    threads_per_sm: int
    blocks_per_sm: int
    shared_per_sm: int        # bytes a block may have at most is a little less (not needed here)
    shared_reserved: int = 1024   # bytes the runtime keeps per block (sm_80 and later)


H100 = Gpu("H100 SXM", sms=132, registers_per_sm=65536, threads_per_sm=2048, blocks_per_sm=32,
           shared_per_sm=228 * 1024)


def resident_blocks_per_sm(gpu: Gpu, threads: int, registers: int, shared: int) -> int:
    """Blocks of `threads` threads, `registers` per thread and `shared` bytes each that one SM
    holds at once: registers are given out per warp in units of 256, shared memory per block."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = gpu.registers_per_sm // max(per_warp * warps, 1)
    by_shared = gpu.shared_per_sm // (shared + gpu.shared_reserved)
    return min(gpu.blocks_per_sm, gpu.threads_per_sm // (warps * 32), by_registers, by_shared)
