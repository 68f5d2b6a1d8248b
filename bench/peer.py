"""A cocktailer of another commit, in a process of its own, that the benchmark times
interleaved with this one (`--baseline REF`): same models, same inputs, one run per request.

Run as a script with PYTHONPATH at the other commit's tree, so that `import cocktailer` is that
commit's; it reads requests from stdin and answers on stdout, both pickled and length-prefixed:

    ("prepare", model, batch, size, seed, backend, options) -> None    compile (its own zoo)
    ("output",)                                              -> the first run's result
    ("run",)                                                 -> seconds of one run, timed here
"""
from __future__ import annotations

import pickle
import struct
import sys
import time


def send(stream, value):
    data = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    return pickle.loads(stream.read(struct.unpack("<Q", head)[0]))


def serve(stdin, stdout):
    import torch
    import cocktailer
    from cocktailer import models
    state = {}
    torch.set_grad_enabled(False)
    while True:
        try:
            request = receive(stdin)
        except EOFError:
            return
        try:
            send(stdout, ("ok", _answer(request, state, cocktailer, models)))
        except Exception as exc:   # the parent records it as this system's failure
            send(stdout, ("error", f"{type(exc).__name__}: {exc}"))


def _answer(request, state, cocktailer, models):
    kind = request[0]
    if kind == "prepare":
        _, model, batch, size, seed, backend, options = request
        w = models.make(model, batch, size=size, seed=seed)
        fast = cocktailer.compile(w.model, w.inputs, backend=backend, options=options)
        state.update(run=lambda: fast(*w.inputs), output=fast(*w.inputs))
        return None
    if kind == "output":
        return state["output"]
    if kind == "run":
        start = time.perf_counter_ns()
        state["run"]()
        return (time.perf_counter_ns() - start) * 1e-9
    raise ValueError(f"unknown request {kind!r}")


if __name__ == "__main__":
    answers = sys.stdout.buffer
    sys.stdout = sys.stderr   # whatever the compiler prints must not break the protocol
    serve(sys.stdin.buffer, answers)


def resolve(ref: str, repo: str) -> str:
    """`ref` as the short hash of its commit (what the results name)."""
    import subprocess
    return subprocess.run(["git", "-C", repo, "rev-parse", "--short", ref], capture_output=True, text=True,
                          check=True).stdout.strip()


class Peer:
    """The parent's side: the other commit's tree (from `git archive`) and its process."""

    def __init__(self, ref: str, repo: str):
        import atexit
        import subprocess
        import tempfile
        self.ref = ref
        self.tree = tempfile.mkdtemp(prefix="cocktailer-baseline-")
        archive = subprocess.run(["git", "-C", repo, "archive", ref], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", self.tree], input=archive, check=True)
        env = {**__import__("os").environ, "PYTHONPATH": self.tree}
        self.process = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        env=env, cwd=self.tree)
        atexit.register(self.close)

    def ask(self, *request):
        send(self.process.stdin, request)
        status, value = receive(self.process.stdout)
        if status == "error":
            raise RuntimeError(f"the baseline ({self.ref}) failed: {value}")
        return value

    def close(self):
        import shutil
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=60)
        shutil.rmtree(self.tree, ignore_errors=True)
