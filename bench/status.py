"""Why a system has no timing. Preparing a system raises one of these; the runner records
the status and the reason instead of a number, so a table never shows a fake time."""
from __future__ import annotations

import re

INSTALL_HINT = "pip install -e .[bench]"

OK = "ok"
UNSUPPORTED = "unsupported"   # the system cannot run this model (cannot script, export, capture...)
MISSING = "missing"           # the peer's package is not installed
WRONG = "wrong result"        # it ran, but its result differs from eager: not timed
TIMEOUT = "timeout"           # preparing (compiling) it took longer than the budget
FAILED = "failed"             # an unexpected exception while preparing or running it
SKIPPED = "skipped"           # not asked for, or the workload does not batch


class NotTimed(Exception):
    status = FAILED

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Unsupported(NotTimed):
    status = UNSUPPORTED


class Missing(NotTimed):
    status = MISSING

    def __init__(self, package: str):
        super().__init__(f"{package} is not installed ({INSTALL_HINT})")


class Timeout(BaseException):
    """Raised by a timer inside whatever code is compiling. A BaseException, so that a
    compiler's own `except Exception` (torch.compile falls back to eager on errors) cannot
    swallow it and leave us timing something else under its name."""
    status = TIMEOUT

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe(exc: BaseException, limit: int = 300) -> str:
    """One line naming the exception: the reason recorded for an unsupported system."""
    text = " ".join(_ANSI.sub("", str(exc)).split()) or "(no message)"
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def label(status: str, reason: str = "") -> str:
    """How a status reads in the table: 'missing (pip install -e .[bench])', 'unsupported: why'."""
    if status == MISSING:
        return f"missing ({INSTALL_HINT})"
    return f"{status}: {reason}" if reason else status
