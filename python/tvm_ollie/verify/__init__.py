"""Checks that gate every rewrite: static index bounds (and numeric equivalence)."""

from .bounds import check_bounds  # noqa: F401
from .equivalence import EquivalenceResult, check_equivalent  # noqa: F401
