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
