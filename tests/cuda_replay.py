"""Replays one call of a program compiled for the virtual GPU in a process of its own, built
with ThreadSanitizer: the library again with -fsanitize=thread, and a small C++ driver that
loads it, rebuilds the call's buffers from a file (inputs, constants, scratch, err[]) and
writes the outputs back. A process of its own because TSan's runtime must start with the
process (preloading it into Python crashes here); `replay` returns the outputs and what TSan
printed."""
from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import torch

from cocktailer.runtime import cache
from cocktailer.runtime.compiler import compile_shared_library, find_cxx_compiler
from cocktailer.runtime.native import ERR_SIGINTS, CompiledProgram

TSAN = ["-fsanitize=thread", "-g"]

_DRIVER = r"""
#include <dlfcn.h>
#include <cstdint>
#include <cstdio>
#include <vector>
typedef int64_t (*entry_fn)(void**, void**, void**, char*, char*, int64_t, int64_t*, int64_t*, int64_t*, int);
static int64_t number(FILE* f) { int64_t n = 0; if (fread(&n, 8, 1, f) != 1) n = 0; return n; }
static std::vector<char> blob(FILE* f) {
  std::vector<char> v((size_t)number(f) + 8);
  if (v.size() > 8 && fread(v.data(), 1, v.size() - 8, f) != v.size() - 8) v.clear();
  return v;
}
int main(int argc, char** argv) {
  if (argc != 5) return 2;
  void* lib = dlopen(argv[1], RTLD_NOW);
  entry_fn fn = lib ? (entry_fn)dlsym(lib, argv[2]) : 0;
  FILE* f = fopen(argv[3], "rb");
  if (!fn || !f) { fprintf(stderr, "cannot load %s or read %s\n", argv[1], argv[3]); return 2; }
  std::vector<std::vector<char>> ins, csts, outs;
  for (int64_t k = number(f); k > 0; --k) ins.push_back(blob(f));
  for (int64_t k = number(f); k > 0; --k) csts.push_back(blob(f));
  for (int64_t k = number(f); k > 0; --k) outs.emplace_back((size_t)number(f) + 8);
  std::vector<char> arena((size_t)number(f) + 64), stack((size_t)number(f) + 64);
  std::vector<int64_t> locals((size_t)number(f) / 8 + 1), rets((size_t)number(f) / 8 + 1);
  std::vector<char> err = blob(f);
  const int64_t max_depth = number(f), nw = number(f);
  std::vector<void*> in_p, cst_p, out_p;
  for (auto& b : ins) in_p.push_back(b.data());
  for (auto& b : csts) cst_p.push_back(b.data());
  for (auto& b : outs) out_p.push_back(b.data());
  in_p.push_back(0); cst_p.push_back(0); out_p.push_back(0);
  const int64_t code = fn(in_p.data(), out_p.data(), cst_p.data(), arena.data(), stack.data(), max_depth,
                          locals.data(), rets.data(), (int64_t*)err.data(), (int)nw);
  FILE* o = fopen(argv[4], "wb");
  fwrite(&code, 8, 1, o);
  for (auto& b : outs) fwrite(b.data(), 1, b.size() - 8, o);
  fclose(o);
  return 0;
}
"""


def _driver() -> Path:
    """The driver executable, built with TSan once per cache."""
    path = cache.cache_dir() / "ct_tsan_replay"
    if not path.exists():
        source = path.with_suffix(".cpp")
        source.write_text(_DRIVER)
        subprocess.run([find_cxx_compiler(), *TSAN, "-O1", str(source), "-o", str(path) + ".tmp", "-ldl"], check=True)
        os.replace(str(path) + ".tmp", path)
    return path


def _blob(data: bytes) -> bytes:
    return struct.pack("<q", len(data)) + data


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""   # (0-d too)


def replay(program: CompiledProgram, source: str, inputs: list[torch.Tensor], workdir: Path):
    """(outputs, error code, TSan's report) of `inputs` through `program`, whose generated
    source is `source`, replayed under TSan."""
    library, _ = compile_shared_library(source, TSAN, "c++")
    b = program.bind(inputs)
    err = bytes(b.err)
    err = err[:8 * ERR_SIGINTS] + struct.pack("<q", 0) + err[8 * (ERR_SIGINTS + 1):]   # no SIGINT counter there
    call = [struct.pack("<q", len(b.inputs)), *(_blob(_bytes(x)) for x in b.inputs),
            struct.pack("<q", len(program._constants)), *(_blob(_bytes(c)) for c in program._constants),
            struct.pack("<q", len(b.outputs)), *(struct.pack("<q", y.numel() * y.element_size()) for y in b.outputs),
            *(struct.pack("<q", t.numel() * t.element_size()) for t in (b.arena, b.stack, b.locals, b.rets)),
            _blob(err), struct.pack("<qq", program.max_depth, b.workers)]
    call_file, out_file = workdir / "call.bin", workdir / "out.bin"
    call_file.write_bytes(b"".join(call))
    env = {**os.environ, "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    done = subprocess.run([str(_driver()), str(library), program.entry.name, str(call_file), str(out_file)],
                          capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        return None, None, done.stderr + f"\n(exit code {done.returncode})"
    data = out_file.read_bytes()
    (code,) = struct.unpack_from("<q", data)
    at = 8
    for y in b.outputs:
        n = y.numel() * y.element_size()
        if n:
            y.view(-1).view(torch.uint8)[:] = torch.frombuffer(bytearray(data[at:at + n]), dtype=torch.uint8)
        at += n
    return b.outputs, code, done.stderr

