"""Subpackages that can be called like the function they are named after.

The public contract has both ``ollie.lift(x)`` (a function) and ``tvm_ollie.lift.LiftError`` (a
subpackage); likewise ``ollie.derive``. Python binds ``tvm_ollie.lift`` to the subpackage as soon
as it is imported, so instead of fighting over the name the subpackage itself forwards calls.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable


def make_callable(module_name: str, func: Callable[..., Any]) -> None:
    """Make ``sys.modules[module_name]`` callable: ``module(...)`` calls ``func(...)``."""

    class _CallableModule(types.ModuleType):
        __doc__ = sys.modules[module_name].__doc__

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

    sys.modules[module_name].__class__ = _CallableModule
