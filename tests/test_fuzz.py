"""Differential fuzzing on fixed seeds (the generator and harness are in tests/fuzz).

Every generated program, compiled by the reference backend, and every fourth one also by a
native configuration its seed picks (workers, unroll, fan-out, wavefront, the host backend),
gives eager PyTorch's results and leaves its arguments (and a module's parameters and
buffers) as eager does, on several input sets that take different paths; or it is refused
with an UnsupportedError at the program's own line. Never a different answer, never another
exception. `python tests/fuzz/run.py --minutes N` runs the same for as long as asked, on new
seeds and every configuration (the measured policy too), minimizing each failure into a
stand-alone reproducer; `--also cuda-virtual` adds the cuda backend's virtual GPU, which
seven seeds here run too.
"""
import collections

from fuzz.gen import generate
from fuzz.harness import check, configs_for

SEEDS = range(100)
RAGGED_SEEDS = range(32)
NATIVE_EVERY = 4


def _configs(seed: int) -> list[str]:
    configs = configs_for(seed)
    native = [c for c in configs[1:] if c != "cpu-measured"] or ["cpu"]   # the measured policy: run.py
    return ["reference"] + (native if seed % NATIVE_EVERY == 0 else [])


def test_programs_agree_with_eager_or_are_refused_at_their_line():
    failures, verdicts = [], collections.Counter()
    for seed in SEEDS:
        program = generate(seed)
        for config in _configs(seed):
            outcome = check(program, config)
            if config == "reference":
                verdicts[outcome.status] += 1
            if outcome.status in ("mismatch", "crash"):
                failures.append(f"seed {seed} [{config}] {outcome.status}: {outcome.detail[:2000]}")
            elif outcome.status == "refused" and "fuzz_" not in outcome.detail.splitlines()[0]:
                failures.append(f"seed {seed}: a refusal that does not name the program's line: {outcome.detail}")
    assert not failures, "\n\n".join(failures) + \
        "\n\n(tests/fuzz/minimize.py shrinks one: minimize(generate(seed), config, outcome))"
    # a fuzzer that only meets refusals tests nothing: most valid programs must compile
    valid = sum(verdicts.values()) - verdicts["invalid"]
    assert verdicts["ok"] >= 0.8 * valid, dict(verdicts)


def test_programs_agree_with_eager_with_every_size_dynamic():
    """The same programs compiled with dynamic=True: every dim symbolic from the first call,
    specialized where the program needs it as a number (every eighth also natively)."""
    failures = []
    for seed in SEEDS:
        program = generate(seed)
        for config in ["reference-dynamic"] + (["cpu-dynamic"] if seed % (2 * NATIVE_EVERY) == 0 else []):
            outcome = check(program, config)
            if outcome.status in ("mismatch", "crash"):
                failures.append(f"seed {seed} [{config}] {outcome.status}: {outcome.detail[:2000]}")
    assert not failures, "\n\n".join(failures)


def test_programs_batched_agree_with_eager_per_instance():
    """The same programs through cocktailer.batch, six input sets as the instances of one call:
    each instance's results and arguments as eager gives them for it alone: every other program
    with every op by torch, every sixteenth with native code (each program compiles its own;
    run.py runs both on every program)."""
    failures = []
    for seed in SEEDS:
        configs = (["batch-torch"] if seed % 2 else []) + (["batch"] if seed % (4 * NATIVE_EVERY) == 0 else [])
        for config in configs:
            outcome = check(generate(seed), config)
            if outcome.status in ("mismatch", "crash"):
                failures.append(f"seed {seed} [{config}] {outcome.status}: {outcome.detail[:2000]}")
    assert not failures, "\n\n".join(failures)


def test_sentence_programs_batched_agree_with_eager_per_instance():
    """Programs over a sentence whose length differs between the instances (fuzz/ragged.py):
    position-wise layers on packed rows, attention masked in its block, decisions on a token,
    loops over the tokens; each instance's results as eager gives them for it alone."""
    from fuzz.harness import program_for
    failures = []
    for seed in RAGGED_SEEDS:
        for config in ["batch-ragged"] + (["batch-ragged-torch"] if seed % 4 == 0 else []):
            outcome = check(program_for(seed, config), config)
            if outcome.status in ("mismatch", "crash", "invalid"):
                failures.append(f"seed {seed} [{config}] {outcome.status}: {outcome.detail[:2000]}")
    assert not failures, "\n\n".join(failures)


CUDA_SEEDS = range(1, 100, 16)   # the cuda backend's programs on a virtual GPU: seven of the seeds


def test_programs_agree_with_eager_on_the_virtual_gpu():
    failures, verdicts = [], collections.Counter()
    for seed in CUDA_SEEDS:
        outcome = check(generate(seed), "cuda-virtual")
        verdicts[outcome.status] += 1
        if outcome.status in ("mismatch", "crash"):
            failures.append(f"seed {seed} [cuda-virtual] {outcome.status}: {outcome.detail[:2000]}")
    assert not failures, "\n\n".join(failures)
    assert verdicts["ok"] >= len(CUDA_SEEDS) // 2, dict(verdicts)


def test_a_reproducer_runs_on_its_own(tmp_path):
    """What `run.py` writes for a failure runs as written, for a module of either generator
    (a sentence program's module has no seeded buffer to fill): here, on programs that pass."""
    import subprocess
    import sys
    from fuzz.harness import program_for
    from fuzz.minimize import write_reproducer
    for seed, config in ((7, "reference"), (1, "batch-ragged")):
        program = program_for(seed, config)
        assert program.module
        path = write_reproducer(program, config, "(none: a check of the reproducer)", tmp_path)
        run = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)   # the tests' cache
        assert run.returncode == 0 and run.stdout.strip().endswith("passes"), run.stderr[-2000:]
