"""The one configuration of a native build: what `compile(..., options=...)` asks for, checked
here once, then passed whole to every stage (each reads the fields it needs). The measured
policy's candidates are configurations too: the search proposes them and `build` builds them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

DEFAULT_MAX_DEPTH = 256   # frames of the recursion stack
POLICIES = ("simple", "measured")
BACKENDS = ("cpu", "host", "cuda")
CONTROL_STACKS = ("shared", "global")
# The measured policy's steps, in the order it takes them (schedule.search says what each tries).
STEPS = ("host level", "nested constructs at L1", "control flow at L1", "SetResource", "recursion unroll",
         "loop unroll", "wavefront", "fine-grained barriers")


@dataclass(frozen=True)
class Config:
    backend: str = "cpu"         # "cpu": control flow at L1 in one native program; "host": control flow in Python;
                                 # "cuda": the same program as one persistent CUDA kernel (backend/cuda.py)
    workers: int | None = None   # L1 units (worker threads); None: every CPU this process may use
    max_depth: int = DEFAULT_MAX_DEPTH
    # the most iterations one run of a loop may take; more raise CompiledCallError (None: no limit)
    max_iterations: int | None = None
    policy: str = "simple"       # "measured": build candidates, time them, keep the fastest
    # the measured policy's steps to take (what it searches, not part of what is built)
    steps: tuple[str, ...] = field(default=STEPS, compare=False, hash=False)
    rewrite: bool = True         # cpu: loop distribution and hoisting (off only to measure them)
    fuse: bool = True            # chains of elementwise ops as one loop each (off only to measure it)
    fan_out: bool = False        # cpu: independent calls at once on groups of workers (recursion unroll)
    unroll: int = 1              # cpu: steps per iteration of innermost loops with a trip count
    wavefront: bool = False      # cpu: independent ops of a wave side by side on groups of workers
    fine_barriers: bool = True   # with wavefront: a worker waits only for the workers it depends on
    measure_waves: bool = True   # with wavefront: time each wave both ways (else a balance rule decides)
    native_from: int | None = None   # host: constructs nested at least this deep run in native blocks
    # cuda: run the generated CUDA on a virtual GPU, its CPU execution mode (`workers` blocks of
    # `threads` threads, each an OS thread): how its programs are checked without a GPU
    virtual_gpu: bool = False
    threads: int = 32            # cuda: threads per block
    # cuda: where the control state (the simulated stack's labels and frames, loop counters) lives:
    # "shared" (a block's shared memory where it fits, else global memory) or "global"
    control_stack: str = "shared"
    # measured policy: more argument tuples to time candidates on (not part of what is built)
    samples: tuple = field(default=(), compare=False, hash=False)

    def __post_init__(self):
        _check(self)

    @staticmethod
    def from_options(options: dict | None, backend: str = "cpu") -> "Config":
        """The configuration `compile`'s `options` ask for; a ValueError names what is wrong."""
        options = dict(options or {})
        known = [f.name for f in fields(Config) if f.name != "backend"]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ValueError(f"unknown backend options {unknown}; known: {', '.join(known)}")
        for key in ("steps", "samples"):
            if key in options:
                options[key] = tuple(options[key])
        return Config(backend=backend if backend in BACKENDS else "cpu", **options)

    @property
    def control(self) -> str:
        """Where control flow runs: "L1" (in the native program) or "host" (Python; on the cuda
        backend, L2: where an op has no kernel, backend.cuda builds with native_from)."""
        return "host" if self.backend == "host" or (self.backend == "cuda" and self.native_from is not None) else "L1"

    def __str__(self) -> str:
        """The candidate as the measured policy's report names it."""
        where = "control flow at L1" if self.control == "L1" else "control flow on the host"
        if self.control == "host" and self.native_from is not None:
            where = f"constructs nested {self.native_from}+ deep at L1 in native blocks, the rest on the host"
        workers = f"{self.workers} worker{'s' if self.workers != 1 else ''}" if self.workers else "all workers"
        fan = ", independent calls fan out" if self.fan_out else ""
        unroll = f", loops unrolled by {self.unroll}" if self.unroll > 1 else ""
        wave = (", wavefront co-scheduling" + (" with fine-grained barriers" if self.fine_barriers else "")
                if self.wavefront else "")
        gpu = f", CUDA blocks of {self.threads} threads{' on a virtual GPU' if self.virtual_gpu else ''}" \
            if self.backend == "cuda" else ""
        return f"{where}, {workers}{fan}{unroll}{wave}{gpu}"


def _check(c: Config):
    if c.backend not in BACKENDS:
        raise ValueError(f"unknown native backend {c.backend!r}; known: {', '.join(BACKENDS)}")
    if c.policy not in POLICIES:
        raise ValueError(f"unknown policy {c.policy!r}; known: {', '.join(POLICIES)}")
    unknown = sorted(set(c.steps) - set(STEPS))
    if unknown:
        raise ValueError(f"unknown policy steps {unknown}; known: {', '.join(STEPS)}")
    if c.fan_out and c.wavefront:
        # a fan-out's groups run different numbers of steps, so the step array would disagree
        raise ValueError("wavefront co-scheduling and fan-out of calls cannot be combined")
    for name in ("workers", "max_depth", "unroll", "max_iterations", "threads"):
        value = getattr(c, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"option {name} must be a positive int, got {value!r}")
    if c.control_stack not in CONTROL_STACKS:
        raise ValueError(f"option control_stack must be one of {', '.join(CONTROL_STACKS)}, got {c.control_stack!r}")
    if c.native_from is not None and (not isinstance(c.native_from, int) or c.native_from < 0):
        raise ValueError(f"option native_from must be an int >= 0, got {c.native_from!r}")
