"""What ran the benchmark: CPU, cores, memory, library versions and the source commit."""
from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import subprocess

REPO = pathlib.Path(__file__).resolve().parent.parent
LIBRARIES = ("torch", "jax", "jaxlib", "onnx", "onnxruntime", "onnxscript", "numpy", "matplotlib", "dynet38", "ray")


def describe() -> dict:
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "vector_isa": vector_isa(), "memory_bytes": _memory_bytes(),
            "platform": platform.platform(), "python": platform.python_version(),
            "versions": versions(), "git": git_state(), "load_average": load_average()}


KEEP_MMAP_BYTES, KEEP_TRIM_BYTES = 32 << 20, 256 << 20


def keep_freed_memory() -> str:
    """Have glibc's allocator keep freed memory for reuse, for every system the process runs.

    By default glibc gives freed megabytes back to the OS, and the next tensor of that size
    is faulted in again, a page at a time. Which system pays depends on what ran before it:
    with throughput mode's outputs kept from call to call, the hand-batched Berxit 256 peer
    took 25,000 page faults a call (114 ms, 79 ms without). Tensors up to 32 MiB come from the
    heap, and up to 256 MiB of free heap stays with the process (mallopt M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD), as a serving process would set its allocator. What was set, for the
    results; elsewhere than glibc, nothing."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        if libc.mallopt(M_MMAP_THRESHOLD, KEEP_MMAP_BYTES) and libc.mallopt(M_TRIM_THRESHOLD, KEEP_TRIM_BYTES):
            return f"glibc, freed memory kept (M_MMAP_THRESHOLD {KEEP_MMAP_BYTES}, M_TRIM_THRESHOLD {KEEP_TRIM_BYTES})"
    except (OSError, AttributeError):
        pass
    return "the platform's allocator as it is"


def vector_isa() -> str:
    """The widest vector instructions the native code compiles for here: the kernels take a
    different path with AVX-512 than with AVX2, so results from the two do not compare."""
    from cocktailer.runtime.compiler import find_compiler, native_has_avx512
    if find_compiler() is None:
        return "unknown (no C compiler)"
    return "AVX-512" if native_has_avx512() else "AVX2 or narrower (no AVX-512)"


def summary(m: dict) -> str:
    """A table header's line: the machine, its load when the run started, the commit."""
    git = m.get("git", {})
    return (f"- machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('vector_isa', 'vector ISA not recorded')}; "
            f"load average at start "
            f"{(m.get('load_average') or ['?'])[0]}; commit {(git.get('commit') or '?')[:12]}"
            f"{' (dirty tree)' if git.get('dirty') else ''}")


def load_average() -> list[float] | None:
    """1/5/15-minute load: other processes on a small machine make every number noisier."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None   # a peer that is not installed: its systems say "missing"
    return out


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_bytes() -> int | None:
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def git_state() -> dict:
    """The commit and whether the tree has uncommitted changes (a dirty tree's numbers
    belong to no commit). GIT_OPTIONAL_LOCKS=0: never take the index lock of a tree that
    others are working in."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, env=env, capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "dirty": None, "error": str(exc)}
    return {"commit": commit, "dirty": bool(status.strip())}
