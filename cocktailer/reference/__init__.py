"""The reference executor: runs the IR with torch ops, control flow on the host."""
from cocktailer.reference.executor import ReferenceExecutor

__all__ = ["ReferenceExecutor"]
