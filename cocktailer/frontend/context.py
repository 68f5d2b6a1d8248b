"""The capture in progress (one per thread), for code that converted user code calls."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any

from cocktailer.ir import SourceLoc

_local = threading.local()


def current() -> Any:
    capture = getattr(_local, "capture", None)
    if capture is None:
        raise RuntimeError("cocktailer-converted code ran outside of a capture")
    return capture


def tracer():
    return current().tracer


@contextmanager
def active(capture):
    saved = getattr(_local, "capture", None)
    _local.capture = capture
    try:
        yield capture
    finally:
        _local.capture = saved


def loc(key) -> SourceLoc | None:
    """Converted code names source places as (filename, line, column) tuples."""
    return None if key is None else SourceLoc(key[0], key[1])
