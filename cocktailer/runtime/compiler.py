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
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
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
# CUDA programs in their CPU execution mode (a virtual GPU, ct_cuda.h): the same source as nvcc
# compiles, as C++ with threads; it is there to check the programs, so it is compiled for
# compile time (-O1), not speed.
CXX_FLAGS = ["-x", "c++", "-O1", "-shared", "-fPIC", "-std=gnu++17", "-pthread", "-fno-math-errno",
             "-Wno-unused-label", "-Wno-unused-variable", "-Wno-unused-but-set-variable"]


class CompilerNotFound(RuntimeError):
    pass


@functools.cache
def find_compiler() -> str | None:
    return _first_on_path(os.environ.get("CC"), "gcc", "cc", "clang")


@functools.cache
def find_cxx_compiler() -> str | None:
    return _first_on_path(os.environ.get("CXX"), "g++", "c++", "clang++")


def _first_on_path(*names: str | None) -> str | None:
    """The path of the first of `names` (None: skipped) that is an executable on PATH."""
    return next((shutil.which(n) for n in names if n and shutil.which(n)), None)


@functools.cache
def _compiler_identity(cc: str) -> str:
    """What `cc --version` says (nvcc's release is on its last lines, gcc's on its first)."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout


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


def _toolchain(language: str) -> tuple[str, list[str], str]:
    """(compiler, flags, what else the library depends on: the CPU -march=native means) of
    `language`: "c", "c++" (a CUDA program in its CPU execution mode) or "cuda" (nvcc, for the
    arch in the extra flags)."""
    if language == "cuda":
        nvcc = find_nvcc()
        if nvcc is None:
            raise CompilerNotFound("nvcc not found (set NVCC, or install the CUDA toolkit)")
        return nvcc, NVCC_LIBRARY_FLAGS, ""
    cc = find_compiler() if language == "c" else find_cxx_compiler()
    if cc is None:
        raise CompilerNotFound(f"no {language.upper()} compiler found (set {'CC' if language == 'c' else 'CXX'}, "
                               "or install gcc)")
    return cc, FLAGS if language == "c" else CXX_FLAGS, _native_target(cc)


def compile_shared_library(source: str, extra_flags: Sequence[str] = (), language: str = "c") -> tuple[Path, bool]:
    """The path of a valid library built from `source`, and whether it came from the cache
    (else the compiler ran now). `language`: see `_toolchain`."""
    cc, flags, target = _toolchain(language)
    flags = [*flags, *extra_flags]
    link = _link_flags(source) if language != "cuda" else []
    key = hashlib.sha256("\0".join([source, *flags, *link, _compiler_identity(cc), target]).encode()
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
            raise RuntimeError(f"{'CUDA' if language == 'cuda' else 'C'} compilation failed ({c_file}):\n"
                               f"{result.stderr[-4000:]}")
        os.replace(tmp, library)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    cache.commit(library)
    cache.evict()
    return library, False


def load_library(path: Path, source: str, extra_flags: Sequence[str] = (), language: str = "c") -> ctypes.CDLL:
    """The library at `path` (built from `source`), loaded. An entry that validated but does
    not load (another process evicted it in between) is built once more."""
    try:
        return ctypes.CDLL(str(path))
    except OSError:
        cache.forget(path)
        path, _ = compile_shared_library(source, extra_flags, language)
        return ctypes.CDLL(str(path))


# -- nvcc: generated CUDA compiled for a GPU (checked in CI, where there is none) ----------------

NVCC_FLAGS = ["-x", "cu", "-std=c++17", "-O3", "-cubin", "-Xptxas", "-v"]
# A program for a GPU as a shared library the runtime loads: the host launcher and the kernel,
# with the CUDA runtime linked in statically (nothing to find at load time); -arch comes with
# the device (`gpu_arch`).
NVCC_LIBRARY_FLAGS = ["-x", "cu", "-std=c++17", "-O3", "-shared", "-Xcompiler", "-fPIC"]


@dataclass(frozen=True)
class CudaResources:
    """What ptxas reports for a kernel: per thread, registers, stack and spills; per block,
    static shared memory."""
    arch: str
    kernel: str
    registers: int
    shared_bytes: int
    stack_bytes: int
    spill_bytes: int          # stores + loads
    warnings: tuple[str, ...]  # every warning nvcc or ptxas printed


def find_nvcc() -> str | None:
    return shutil.which(os.environ.get("NVCC", "nvcc"))


def gpu_arch(device: torch.device) -> str:
    """nvcc's -arch for the GPU `device` is (sm_90 on an H100)."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


# Where a generated CUDA source's own part starts, after the header and kernels' prelude every
# program shares (codegen.renderer.assemble writes it)
PROGRAM_MARK = "/* ---------------------------------------------------------------- the program */"
# Programs compiled together: their kernels and launchers get internal linkage, so that each
# program's in a namespace of its own does not clash with another's of the same C name
_TOGETHER = "#undef CT_GLOBAL\n#define CT_GLOBAL static __global__\n#undef CT_HOST\n#define CT_HOST static __host__\n"


def compile_cuda(source: str, arch: str = "sm_90") -> list[CudaResources]:
    """Compile `source` with nvcc for `arch` (a cubin, discarded) and read back each kernel's
    resources. Raises CompilerNotFound without nvcc, RuntimeError if it fails."""
    return compile_cuda_many([source], arch)[0]


def compile_cuda_many(sources: Sequence[str], arch: str = "sm_90") -> list[list[CudaResources]]:
    """`compile_cuda` of each source, in one nvcc run: most of a run is the shared header
    (1.2 s of a small program's 1.3 s), so programs whose prelude up to PROGRAM_MARK is the
    same are compiled as one translation unit, each in a namespace. A warning is each
    program's whose lines it names (or whose kernel), else every program's."""
    if len(sources) == 1:
        output = _nvcc(sources[0], arch)
        return [_ptxas_resources(output, arch, _warnings(output.splitlines()))]
    heads = {source.partition(PROGRAM_MARK)[0] for source in sources}
    if len(heads) > 1 or any(PROGRAM_MARK not in source for source in sources):
        return [compile_cuda(source, arch) for source in sources]
    head = heads.pop() + PROGRAM_MARK + "\n" + _TOGETHER
    parts, firsts = [head], []
    line = head.count("\n") + 1
    for k, source in enumerate(sources):
        body = f"namespace ct_p{k} {{\n{source.partition(PROGRAM_MARK)[2]}\n}}\n"
        firsts.append(line)
        parts.append(body)
        line += body.count("\n")
    output = _nvcc("".join(parts), arch)
    lines, kernels = output.splitlines(), _ptxas_resources(output, arch, ())   # every program's, read once
    found = []
    for k, first in enumerate(firsts):
        last = firsts[k + 1] if k + 1 < len(firsts) else line
        own = _warnings(lines, lambda at, name: first <= at < last if at else
                        _in_namespace(name, f"ct_p{k}") is not None if name else True)
        found.append([replace(kernel, kernel=name, warnings=own) for kernel in kernels
                      if (name := _in_namespace(kernel.kernel, f"ct_p{k}")) is not None])
    return found


def _nvcc(source: str, arch: str) -> str:
    nvcc = find_nvcc()
    if nvcc is None:
        raise CompilerNotFound("nvcc not found (set NVCC, or install the CUDA toolkit)")
    with tempfile.TemporaryDirectory(prefix="ct_nvcc_") as tmp:
        src = Path(tmp) / "program.cu"
        src.write_text(source)
        result = subprocess.run([nvcc, *NVCC_FLAGS, f"-arch={arch}", str(src), "-o", str(Path(tmp) / "program.cubin")],
                                capture_output=True, text=True)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed for {arch}:\n{output[-4000:]}")
    return output


def _warnings(lines: list[str], mine=lambda at, name: True) -> tuple[str, ...]:
    """The warnings among nvcc's output `lines` for which mine(source line or None, kernel
    named or None) holds."""
    found = []
    for text in lines:
        if "warning" not in text.lower() or text.startswith("Remark"):   # (how to silence them: not one)
            continue
        at = re.search(r"\.cu\((\d+)\)", text)
        name = re.search(r"'(_Z\w+|\w+_kernel)'", text)
        if mine(int(at.group(1)) if at else None, name.group(1) if name else None):
            found.append(text.strip())
    return tuple(found)


def _ptxas_resources(output: str, arch: str, warnings: tuple[str, ...]) -> list[CudaResources]:
    """Each entry function's line of ptxas's report: registers, and the stack its calls take
    at most (cumulative) or its own frame; spills are the entry's own."""
    kernels, entries, current = [], set(), None
    numbers: dict[str, int] = {}
    for line in output.splitlines():
        if m := re.search(r"Compiling entry function '(\S+)'", line):
            entries.add(m.group(1))
        elif m := re.search(r"Function properties for (\S+)", line):
            current, numbers = (m.group(1) if m.group(1) in entries else None), {}
        elif current and (m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                                         line)):
            numbers["stack"], numbers["spill"] = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        elif current and (m := re.search(r"Used (\d+) registers", line)):
            shared = re.search(r"(\d+) bytes smem", line)
            stack = re.search(r"(\d+) bytes cumulative stack size", line)
            kernels.append(CudaResources(arch, current, int(m.group(1)), int(shared.group(1)) if shared else 0,
                                         int(stack.group(1)) if stack else numbers.get("stack", 0),
                                         numbers.get("spill", 0), warnings))
            current = None
    return kernels


def _in_namespace(mangled: str, namespace: str) -> str | None:
    """The name of a function that `mangled` (Itanium: _ZN <length><name>... E) names in
    `namespace`, or None if it is not in it."""
    names, at = [], 3 if mangled.startswith("_ZN") else None
    while at is not None and at < len(mangled) and (mangled[at].isdigit() or mangled[at] == "L"):
        at += mangled[at] == "L"   # (internal linkage, where a compiler marks it)
        digits = re.match(r"\d*", mangled[at:]).group()
        if not digits:
            break
        at += len(digits)
        names.append(mangled[at:at + int(digits)])
        at += int(digits)
    return names[1] if len(names) >= 2 and names[0] == namespace else None
