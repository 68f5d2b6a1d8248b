"""Tests run the IR verifier after capture and between passes."""
from cocktailer import settings

settings.verify = True
