"""Errors that point at the user's code, never at the compiler's."""
from __future__ import annotations

import functools
import linecache
import os
import sys
import sysconfig

import torch

from cocktailer.ir.program import SourceLoc

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
# Our own example programs are user code: errors and conversion treat them like the user's.
_USER_CODE_IN_PACKAGE = (os.path.join(_PACKAGE_DIR, "models") + os.sep, os.path.join(_PACKAGE_DIR, "demo.py"))
_LIBRARY_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (torch.__file__, os.__file__)
) + (_PACKAGE_DIR + os.sep, sysconfig.get_paths()["stdlib"] + os.sep)


@functools.lru_cache(maxsize=4096)   # asked for every frame of every traced op
def is_user_file(filename: str) -> bool:
    """True for files the user wrote (not torch, not the standard library, not the compiler)."""
    if filename.startswith("<"):
        return False
    if filename.startswith(_USER_CODE_IN_PACKAGE):
        return True
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def user_location(skip: int = 1) -> SourceLoc | None:
    """The innermost frame on the current stack that belongs to user code."""
    frame = sys._getframe(skip)
    while frame is not None:
        code = frame.f_code
        if is_user_file(code.co_filename):
            return SourceLoc(code.co_filename, frame.f_lineno, code.co_name)
        frame = frame.f_back
    return None


class CocktailerError(Exception):
    """Base class of the errors cocktailer raises on purpose."""


class UnsupportedError(CocktailerError):
    """The frontend cannot capture a construct. The message names the user's file and line,
    the construct, and what to write instead."""

    def __init__(self, message: str, loc: SourceLoc | None = None, hint: str = ""):
        self.loc = loc if loc is not None else user_location(2)
        self.construct = message
        self.hint = hint
        text = message
        if self.loc is not None:
            line = linecache.getline(self.loc.filename, self.loc.lineno).strip()
            text = f"{self.loc.filename}:{self.loc.lineno}: {message}" + (f"\n    {line}" if line else "")
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)


class InternalError(CocktailerError):
    """cocktailer itself failed on a program (a bug in cocktailer): the message names the
    user's line it was working on and the compiler's own error."""

    def __init__(self, error: BaseException, loc: SourceLoc | None = None):
        self.loc = loc
        where = f"{loc.filename}:{loc.lineno}: " if loc is not None else ""
        super().__init__(f"{where}cocktailer failed on this program: {type(error).__name__}: {error}\n"
                         "  This is a bug in cocktailer; please report it with the program. Until it is fixed, "
                         "backend='reference' or running the model eagerly avoids it.")


def innermost_user_frame(tb) -> SourceLoc | None:
    """The last frame of a traceback that is the user's code."""
    loc = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            loc = SourceLoc(code.co_filename, tb.tb_lineno, code.co_name)
        tb = tb.tb_next
    return loc


def raised_by_user_code(tb) -> bool:
    """Whether the innermost frame of a traceback is not cocktailer's own (the user's code,
    or what it called: torch, the standard library)."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    filename = last.tb_frame.f_code.co_filename
    return is_user_file(filename) or not os.path.abspath(filename).startswith(_PACKAGE_DIR + os.sep)


class CompiledCallError(CocktailerError):
    """A compiled program was called with inputs it cannot run on (shape, dtype, device,
    an index out of range, a recursion deeper than allowed, a loop longer than the
    `max_iterations` option allows)."""


# Two of the ways a compiled call stops, by the message every backend gives them.
INTERRUPTED = "interrupted by SIGINT (Ctrl-C)"
ITERATIONS_EXCEEDED = "a loop ran more iterations than the max_iterations option allows"
