"""IR -> IR rewrites, run as one flat, named pipeline (see `run_pipeline`)."""
from cocktailer.passes.pipeline import CAPTURE_PIPELINE, run_pipeline

__all__ = ["CAPTURE_PIPELINE", "run_pipeline"]
