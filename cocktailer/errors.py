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


class CompiledCallError(CocktailerError):
    """A compiled program was called with inputs it cannot run on (shape, dtype, device,
    an index out of range, a recursion deeper than allowed)."""
