"""Kernel orchestration (Korch): operator fission into primitives, candidate kernels, BLP."""

from .fission import FISSION_RULES, Fission, FissionReport, fission  # noqa: F401
