"""The library cache under faults: a library truncated or corrupted on disk, or an entry whose
manifest never got written (a compile killed half-way), is rebuilt rather than loaded; the
cache stays within its bound; every file appears whole or not at all."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import cocktailer
from cocktailer.runtime import cache, compiler, find_compiler

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.CACHE_VARIABLE, str(tmp_path))
    return tmp_path


def _compile(scale: float = 3.0):
    program = cocktailer.capture(lambda x: torch.relu(x) * scale, (torch.randn(7),))
    return cocktailer.BACKENDS["cpu"](program)


def _check(run, scale: float = 3.0):
    x = torch.randn(7)
    assert torch.allclose(run([x])[0], torch.relu(x) * scale)


def _counting_compiler(monkeypatch) -> list:
    runs = []
    real = compiler.subprocess.run

    def run(args, **kwargs):
        if "-o" in args:
            runs.append(args)
        return real(args, **kwargs)
    monkeypatch.setattr(compiler.subprocess, "run", run)
    return runs


def _damage(path, how: str):
    """Damage the file as another process would see it (a new file: this process has the old
    one mapped, and writing into a mapped library crashes its mapper)."""
    data = path.read_bytes()
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "corrupted":   # same size, different bytes: only the hash can tell
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0xFF for b in data[middle:middle + 64]) + data[middle + 64:]
    elif how == "unfinished":   # the library is there, its manifest is not (killed before the last write)
        path.with_name(path.name + ".json").unlink()
    damaged = path.with_name("damaged")
    damaged.write_bytes(data)
    os.replace(damaged, path)


@pytest.mark.parametrize("how", ["truncated", "corrupted", "unfinished"])
def test_a_damaged_library_is_rebuilt_not_loaded(cache_dir, monkeypatch, how):
    library = _compile().library
    runs = _counting_compiler(monkeypatch)
    monkeypatch.setattr(cache, "_valid", {})   # as a new process: nothing checked yet
    _damage(cache_dir / os.path.basename(library), how)
    again = _compile()
    assert len(runs) == 1 and again.library == library
    _check(again)


def test_a_new_process_rebuilds_a_truncated_library(cache_dir):
    """A truncated library loaded with dlopen can crash the process (SIGBUS): it must be
    rebuilt before anything maps it."""
    library = _compile().library
    _damage(cache_dir / os.path.basename(library), "truncated")
    script = textwrap.dedent("""
        import torch, cocktailer
        program = cocktailer.capture(lambda x: torch.relu(x) * 3.0, (torch.randn(7),))
        run = cocktailer.BACKENDS["cpu"](program)
        x = torch.randn(7)
        assert torch.allclose(run([x])[0], torch.relu(x) * 3.0)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, cache.CACHE_VARIABLE: str(cache_dir)})
    assert result.returncode == 0, result.stderr


def test_the_cache_stays_within_its_bound(cache_dir, monkeypatch):
    first = _compile(1.0)
    size = sum(p.stat().st_size for p in cache_dir.iterdir())
    monkeypatch.setenv(cache.BOUND_VARIABLE, str(2.5 * size / 2 ** 20))   # room for two entries
    runs = [_compile(scale) for scale in (2.0, 3.0, 4.0, 5.0)]
    total = sum(p.stat().st_size for p in cache_dir.rglob("*") if p.is_file())
    assert total <= 2.5 * size * 1.1
    assert not os.path.exists(first.library)   # the least recently used went first
    assert os.path.exists(runs[-1].library)
    for scale, run in zip((2.0, 3.0, 4.0, 5.0), runs):
        _check(run, scale)   # evicted libraries stay usable where they are loaded
    _check(_compile(1.0), 1.0)   # and are rebuilt when needed again


def test_no_partial_or_temporary_files_are_left(cache_dir):
    _compile()
    names = sorted(p.name for p in cache_dir.iterdir())
    assert len(names) == 3 and [n.rsplit(".", 1)[-1] for n in names] == ["c", "so", "json"]


def test_a_library_built_for_another_cpu_is_not_loaded(cache_dir, monkeypatch):
    """-march=native means something else on each machine: a cache shared between machines (a
    home directory, an image, Ray workers) keys libraries by what it means, so one built where
    AVX-512 exists is never loaded where it does not (it would die on its first instruction)."""
    source = "int ck_answer(void) { return 42; }\n"
    here, cached = compiler.compile_shared_library(source)
    assert compiler.compile_shared_library(source) == (here, True)
    monkeypatch.setattr(compiler, "_native_target", lambda cc: "#define __AVX512F__ 1\n")
    there, cached = compiler.compile_shared_library(source)
    assert there != here and not cached
