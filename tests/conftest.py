"""Tests run the IR verifier after capture and between passes, and keep compiled libraries in
a cache of their own (one per test run, removed after it), never in the user's."""
import os
import shutil
import tempfile

from cocktailer import settings
from cocktailer.runtime.cache import CACHE_VARIABLE

settings.verify = True
_cache = tempfile.mkdtemp(prefix="cocktailer-test-cache-")
os.environ[CACHE_VARIABLE] = _cache   # subprocesses the tests start inherit it


def pytest_unconfigure(config):
    shutil.rmtree(_cache, ignore_errors=True)
