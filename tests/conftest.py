"""Test-suite set-up: make the shared hypothesis strategies importable from every test folder."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ir"))

from hypothesis import HealthCheck, settings  # noqa: E402

# Deterministic examples and no per-example deadline: CI machines are shared and noisy, and a
# property test must fail on a real counterexample, not on a slow moment of the machine.
settings.register_profile(
    "ollie", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ollie")
