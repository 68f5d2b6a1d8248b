"""Tests run the IR verifier after capture and between passes, and keep compiled libraries in
a cache of their own (one per test run, removed after it), never in the user's. Under
pytest-xdist the workers share the run's cache (a program compiled by one is a hit for the
other; the cache is safe across processes), and only the controller removes it."""
import os
import shutil
import tempfile

from cocktailer import settings
from cocktailer.runtime.cache import CACHE_VARIABLE

settings.verify = True
_WORKER = "PYTEST_XDIST_WORKER" in os.environ
if _WORKER and os.environ.get("COCKTAILER_TEST_CACHE"):
    _cache = os.environ["COCKTAILER_TEST_CACHE"]
else:
    _cache = tempfile.mkdtemp(prefix="cocktailer-test-cache-")
    os.environ["COCKTAILER_TEST_CACHE"] = _cache
os.environ[CACHE_VARIABLE] = _cache   # subprocesses the tests start inherit it
if _WORKER:
    # each of the processes gets its share of the cores for torch's own ops (the eager side of
    # every comparison): torch's threads of two processes on two cores took each other's time
    # slices, and ours, as spinning waits (the aliasing and construct files: 10% faster)
    import torch
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))


def pytest_unconfigure(config):
    if not _WORKER:
        shutil.rmtree(_cache, ignore_errors=True)
