"""nvcc on every CUDA program the construct tests compile, not only the samples CI compiles.

    python tests/nvcc_all.py [--arch sm_80,sm_90] [--jobs 2] [--batch 30] [--keep DIR | --sources DIR] [test files...]

runs the tests (default: every file whose programs assert_matches_eager also runs on the
virtual GPU) with each CUDA program's source written to a directory (`--keep`: this one;
`--sources`: compile those of an earlier run instead), then compiles them all for each arch,
`--batch` programs a translation unit (`compile_cuda_many`; nvcc's header costs most of a small
program's run), `--jobs` nvcc runs at once. A program fails if nvcc errs or warns, or if a
block of 32 threads does not fit an H100 SM (the persistent grid is a block per SM). Noted, not
failed: more than 64 registers a thread (then registers, not the block limit, bound how many
32-thread blocks an SM holds) and spills. Prints a line per failure and note and a summary;
exit status 1 if any failed. Minutes: the construct set is about 150-180 programs, and the
largest (11,000 lines) takes nvcc two to three minutes on its own."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # (the fuzz harness imports `fuzz.gen`)

from cocktailer.runtime.compiler import compile_cuda_many   # noqa: E402
from fuzz.harness import kernel_problem   # noqa: E402
from tests.utils import CUDA_SOURCES   # noqa: E402

CONSTRUCT_FILES = ["test_constructs.py", "test_constructs_recursion.py", "test_aliasing.py", "test_real_programs.py",
                   "test_frontend_lists.py", "test_dynamic.py", "test_library_ops.py", "test_passes.py",
                   "test_corpus.py"]
MAX_REGISTERS = 64     # more: registers, not the block limit, bound how many 32-thread blocks an SM holds


def collect(files: list[str], into: Path, jobs: int) -> int:
    """Run the test files with every CUDA program's source written into `into`."""
    env = dict(os.environ, **{CUDA_SOURCES: str(into)})
    command = [sys.executable, "-m", "pytest", "-q", "-n", str(jobs), *[str(ROOT / "tests" / f) for f in files]]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


def problems(name: str, kernels: list, arch: str) -> tuple[list[str], list[str]]:
    """(failures, notes) of a program's kernels as nvcc reported them."""
    if len(kernels) != 1:
        return [f"{name} {arch}: {len(kernels)} kernels reported"], []
    k = kernels[0]
    problem = kernel_problem(k)
    failures = [f"{name} {arch}: {problem}"] if problem else []
    notes = [f"{name} {arch}: {k.registers} registers a thread"] if k.registers > MAX_REGISTERS else []
    notes += [f"{name} {arch}: {k.spill_bytes} bytes spilled"] if k.spill_bytes else []
    return failures, notes


def check(sources: dict[str, str], archs: list[str], batch: int, jobs: int) -> tuple[list[str], list[str], dict]:
    names = sorted(sources)
    work = [(arch, names[i:i + batch]) for arch in archs for i in range(0, len(names), batch)]

    def compile_chunk(item):
        arch, chunk = item
        start = time.perf_counter()
        try:
            found = compile_cuda_many([sources[n] for n in chunk], arch)
        except RuntimeError as e:   # nvcc failed: each alone, to name the program
            found = []
            for n in chunk:
                try:
                    found += compile_cuda_many([sources[n]], arch)
                except RuntimeError as one:
                    found.append(str(one))
        return arch, chunk, found, time.perf_counter() - start

    failures, notes, registers = [], [], {arch: [] for arch in archs}
    with ThreadPoolExecutor(jobs) as pool:
        for arch, chunk, found, seconds in pool.map(compile_chunk, work):
            print(f"{arch}: {len(chunk)} programs in {seconds:.1f} s", flush=True)
            for name, kernels in zip(chunk, found):
                if isinstance(kernels, str):
                    failures.append(f"{name} {arch}: {kernels}")
                    continue
                failed, noted = problems(name, kernels, arch)
                failures, notes = failures + failed, notes + noted
                registers[arch] += [k.registers for k in kernels]
    return failures, notes, registers


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", default=CONSTRUCT_FILES)
    p.add_argument("--arch", default="sm_80,sm_90")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--batch", type=int, default=30, help="programs per nvcc run")
    p.add_argument("--keep", type=Path, help="write the sources here (else a temporary directory)")
    p.add_argument("--sources", type=Path, help="compile the sources an earlier run kept here; run no tests")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ct_nvcc_all_") as tmp:
        into = args.sources or args.keep or Path(tmp)
        into.mkdir(parents=True, exist_ok=True)
        if not args.sources and collect(args.files, into, args.jobs) != 0:
            print("the tests failed: fix those first")
            return 1
        sources = {path.stem: path.read_text() for path in into.glob("*.cu")}
        print(f"{len(sources)} CUDA programs; nvcc for {args.arch}", flush=True)
        start = time.perf_counter()
        failures, notes, registers = check(sources, args.arch.split(","), args.batch, args.jobs)
    for line in notes:
        print("NOTE", line)
    for line in failures:
        print("FAIL", line[:2000])
    for arch, regs in registers.items():
        if regs:
            print(f"{arch}: {len(regs)} kernels, registers a thread {min(regs)}-{max(regs)}")
    print(f"{len(sources)} programs, {len(failures)} failures, {len(notes)} notes, nvcc {time.perf_counter() - start:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
