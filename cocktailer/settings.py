"""Debug settings, read from the environment at import and settable at run time:
COCKTAILER_VERIFY=1 runs the IR verifier after capture and between passes (the tests turn
it on); COCKTAILER_PRINT_PASSES=1 prints the IR after each named pass."""
import os

verify: bool = os.environ.get("COCKTAILER_VERIFY", "0") not in ("", "0")
print_passes: bool = os.environ.get("COCKTAILER_PRINT_PASSES", "0") not in ("", "0")
