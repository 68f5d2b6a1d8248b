"""Compile generated C with the system compiler; cache shared libraries on disk.

The cache key is a hash of the source, the flags and the compiler's identity, so a second
compile of the same model only loads a file. A library is written under a temporary name
and renamed into place, so processes compiling the same program at once never see a
half-written file."""
from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-fno-math-errno",
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


CACHE_VARIABLE = "COCKTAILER_CACHE_DIR"   # where compiled libraries are kept (read at every compile)


def cache_dir() -> Path:
    path = Path(os.environ.get(CACHE_VARIABLE, Path.home() / ".cache" / "cocktailer"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def _link_flags(source: str) -> list[str]:
    """PyTorch's own BLAS (MKL) `sgemm_`, when a kernel calls it."""
    if "sgemm_(" in source:
        return [f"-L{TORCH_LIB}", "-ltorch_cpu", f"-Wl,-rpath,{TORCH_LIB}"]
    return []


def compile_shared_library(source: str) -> Path:
    cc = find_compiler()
    if cc is None:
        raise CompilerNotFound("no C compiler found (set CC, or install gcc)")
    link = _link_flags(source)
    key = hashlib.sha256("\0".join([source, *FLAGS, *link, _compiler_identity(cc)]).encode()).hexdigest()[:32]
    directory = cache_dir()
    library = directory / f"ct_{key}.so"
    if library.exists():
        return library
    (directory / f"ct_{key}.c").write_text(source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(fd)
    try:
        result = subprocess.run([cc, *FLAGS, str(directory / f"ct_{key}.c"), "-o", tmp, *link],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"C compilation failed ({directory / f'ct_{key}.c'}):\n{result.stderr[-4000:]}")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return library
