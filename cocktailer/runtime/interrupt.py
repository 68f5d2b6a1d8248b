"""Ctrl-C inside a native program.

While a compiled call runs, the main thread is inside C and Python's own SIGINT handler only
marks the signal pending: a runaway `while` would never return to let it act. So a small
library (compiled once, like any program, through the cache) installs a SIGINT handler that
counts the signal in a process-wide counter and then calls the handler it replaced (Python's,
which marks KeyboardInterrupt pending). Every generated program reads the counter when it
starts and again at each loop back-edge and call; once it has moved, the program stops
(`runtime.native` then raises). One counter for every library: a handler per library would
chain to one another and, installed in turn, call each other forever.

The handler is installed again when Python's handler changes (`signal.signal`); where SIGINT
is ignored or has its default action (the process ends), nothing is installed.
"""
from __future__ import annotations

import ctypes
import _signal
import signal
import threading

from cocktailer.runtime.compiler import compile_shared_library, load_library

_SOURCE = r"""
#include <signal.h>
#include <stdint.h>
#include <string.h>

static int64_t ct_sigints;   /* how many SIGINTs arrived since the library loaded */
static struct sigaction ct_previous;

static void ct_on_sigint(int sig, siginfo_t* info, void* context) {
  __atomic_add_fetch(&ct_sigints, 1, __ATOMIC_RELAXED);
  if (ct_previous.sa_flags & SA_SIGINFO) {
    if (ct_previous.sa_sigaction) ct_previous.sa_sigaction(sig, info, context);
  } else if (ct_previous.sa_handler != SIG_DFL && ct_previous.sa_handler != SIG_IGN) {
    ct_previous.sa_handler(sig);
  }
}

int64_t* ct_sigint_counter(void) { return &ct_sigints; }

/* Put ct_on_sigint in front of the current handler, if that is a function and not already it.
   Returns 1 when it is installed now or already was. */
int ct_sigint_arm(void) {
  struct sigaction current;
  if (sigaction(SIGINT, NULL, &current)) return 0;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == ct_on_sigint) return 1;
  if (!(current.sa_flags & SA_SIGINFO) && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN))
    return 0;
  struct sigaction mine;
  memset(&mine, 0, sizeof mine);
  mine.sa_sigaction = ct_on_sigint;
  mine.sa_flags = SA_SIGINFO | (current.sa_flags & SA_RESTART);
  sigemptyset(&mine.sa_mask);
  ct_previous = current;
  return sigaction(SIGINT, &mine, NULL) == 0;
}
"""

_lock = threading.Lock()
_library: ctypes.CDLL | None = None
library_path = None   # where the library is (in the cache)
_counter = 0        # the counter's address
_armed_for = None   # the Python-level SIGINT handler the C handler was installed in front of


def _load() -> ctypes.CDLL:
    global _library, _counter, library_path
    with _lock:
        if _library is None:
            path, _ = compile_shared_library(_SOURCE)
            library = load_library(path, _SOURCE)
            library.ct_sigint_counter.restype = ctypes.c_void_p
            library.ct_sigint_arm.restype = ctypes.c_int
            _counter = library.ct_sigint_counter()
            library_path = path
            _library = library
    return _library


def arm() -> int:
    """Make sure a SIGINT reaches running native programs (cheap when nothing changed); the
    address of the process-wide counter they poll."""
    global _armed_for
    current = _signal.getsignal(signal.SIGINT)   # (as signal.getsignal, less its enum conversion: per call)
    if current is _armed_for and _library is not None:
        return _counter
    library = _load()
    with _lock:
        library.ct_sigint_arm()
        _armed_for = current
    return _counter
