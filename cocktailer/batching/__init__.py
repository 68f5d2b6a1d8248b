"""Throughput mode: many instances of one program run at once (ACROBAT, Cortex).
`cocktailer.batch` is the entry; `BatchedExecutor` runs a program for a batch of instances."""
from cocktailer.batching.executor import BatchedExecutor, Schedule, Techniques
from cocktailer.batching.lanes import Lanes

__all__ = ["BatchedExecutor", "Lanes", "Schedule", "Techniques"]
