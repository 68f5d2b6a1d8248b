"""The corpus of real-style programs (cocktailer/models/corpus.py), each compiled as written
and compared with eager on inputs that take different paths (other lengths, exits, experts)."""
import pytest

from cocktailer.models import corpus
from utils import assert_matches_eager

SEEDS = {"early_exit": 5, "greedy_decoder": 4, "gated_resnet": 4}
TOLERANCE = {"adaptive_ode": {"rtol": 1e-4, "atol": 1e-5}}


@pytest.mark.parametrize("name", list(corpus.CORPUS))
def test_corpus_program_matches_eager(name):
    inputs = corpus.CORPUS[name][1]
    assert_matches_eager(corpus.make(name), [inputs(s) for s in range(SEEDS.get(name, 3))],
                         **TOLERANCE.get(name, {}))
