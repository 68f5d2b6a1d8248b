"""Python program -> IR: AST conversion of control flow plus tracing of torch calls."""
from cocktailer.frontend.capture import capture

__all__ = ["capture"]
