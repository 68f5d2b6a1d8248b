"""Compile generated C with the system compiler into a shared library, kept in the cache.

The key is a hash of the source, the flags, the compiler's identity and what -march=native
means here, so compiling the same program again (in this process or another) only loads a
file, and a cache shared between machines never hands one a library for another's CPU. Entries are written and
validated as `runtime.cache` describes: a damaged library is compiled again, never loaded."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from cocktailer.runtime import cache

# -fno-trapping-math: no program here unmasks floating-point traps, and without it GCC will not
# turn the selects of the exp/tanh/sigmoid kernels into vector blends on AVX2 ("control flow in
# loop"): they ran one float at a time (AVX-512's masks hid it). Values are unchanged (no
# reassociation, NaN and infinity as before).
FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math",
         "-Wno-unused-label", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]
TORCH_LIB = str(Path(torch.__file__).parent / "lib")


class CompilerNotFound(RuntimeError):
    pass


@functools.cache
def find_compiler() -> str | None:
    for name in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@functools.cache
def _compiler_identity(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


@functools.cache
def _native_target(cc: str) -> str:
    """What -march=native means on this machine: the compiler's predefined macros under it (the
    instruction sets it may use). Part of the cache key: a library built where AVX-512 exists
    must not be loaded from a shared cache where it does not."""
    result = subprocess.run([cc, "-march=native", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True)
    return result.stdout


def native_has_avx512() -> bool:
    """Whether code compiled here with -march=native may use AVX-512 (False without a compiler)."""
    cc = find_compiler()
    return cc is not None and "#define __AVX512F__ 1" in _native_target(cc)


def _link_flags(source: str) -> list[str]:
    """PyTorch's own BLAS (MKL) `sgemm_`, when a kernel calls it; libm for the math functions."""
    if "sgemm_(" in source:
        return [f"-L{TORCH_LIB}", "-ltorch_cpu", f"-Wl,-rpath,{TORCH_LIB}", "-lm"]
    return ["-lm"]


def compile_shared_library(source: str, extra_flags: Sequence[str] = ()) -> tuple[Path, bool]:
    """The path of a valid library built from `source`, and whether it came from the cache
    (else the compiler ran now)."""
    cc = find_compiler()
    if cc is None:
        raise CompilerNotFound("no C compiler found (set CC, or install gcc)")
    flags = [*FLAGS, *extra_flags]
    link = _link_flags(source)
    key = hashlib.sha256("\0".join([source, *flags, *link, _compiler_identity(cc), _native_target(cc)]).encode()
                         ).hexdigest()[:32]
    directory = cache.cache_dir()
    library = directory / f"ct_{key}.so"
    if cache.valid(library):
        return library, True
    c_file = directory / f"ct_{key}.c"
    cache.write_atomic(c_file, source.encode())
    fd, tmp = tempfile.mkstemp(prefix=f".{library.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        result = subprocess.run([cc, *flags, str(c_file), "-o", tmp, *link], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"C compilation failed ({c_file}):\n{result.stderr[-4000:]}")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    cache.commit(library)
    cache.evict()
    return library, False


def load_library(path: Path, source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The library at `path` (built from `source`), loaded. An entry that validated but does
    not load (another process evicted it in between) is built once more."""
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        cache.forget(path)
        path, _ = compile_shared_library(source, extra_flags)
        return ctypes.CDLL(str(path))
