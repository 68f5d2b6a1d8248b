"""The native pipelines: one configuration in (`Config`, checked once), one `build` running a
flat list of named stages, each recorded (what `cocktailer.explain` prints)."""
from cocktailer.backend.driver import BackendUnavailable, backend, build, specialize_measured
from cocktailer.backend.measured import TunedProgram
from cocktailer.backend.config import Config
from cocktailer.backend.record import Record

__all__ = ["BackendUnavailable", "Config", "Record", "TunedProgram", "backend", "build", "specialize_measured"]
