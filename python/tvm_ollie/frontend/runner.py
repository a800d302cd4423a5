"""Run a library written by ``tvm-ollie compile`` with the Relax VM, and time it."""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from .errors import FrontendError, first_line


class LibraryError(FrontendError):
    """The library cannot be loaded or run here (missing file, no device for its kernels)."""


def load_library(path: str) -> "tvm.runtime.Module":
    """Load an exported Relax VM library, with one-line errors for the usual problems."""
    if not os.path.exists(path):
        raise LibraryError(f"no such library: {path}")
    try:
        lib = tvm.runtime.load_module(path)
    except Exception as err:  # the FFI raises RuntimeError or OSError here
        text = str(err)
        if "loader of that name is not registered" in text and "cuda" in text:
            raise LibraryError(
                f"{path} holds CUDA kernels and this TVM runtime cannot load them (no CUDA "
                "runtime on this machine)"
            ) from err
        if "Loader for" in text or any(
            sign in text for sign in ("invalid ELF header", "file too short", "not a dynamic")
        ):
            raise LibraryError(
                f"{path} is not a compiled library (expected a .so written by tvm-ollie compile)"
            ) from err
        raise LibraryError(f"cannot load {path}: {first_line(err)}") from err
    if lib.kind != "relax.VMExecutable":
        raise LibraryError(f"{path} is not a Relax VM library (kind {lib.kind!r})")
    return lib


def library_device_kinds(lib: "tvm.runtime.Module") -> List[str]:
    """Kinds of the device modules the library imports (e.g. ``["cuda"]``; CPU code: none)."""
    kinds = []
    stack = list(lib.imports)
    while stack:
        mod = stack.pop()
        if mod.kind not in ("llvm", "c", "static_library", "library"):
            kinds.append(mod.kind)
        stack.extend(mod.imports)
    return kinds


def pick_device(lib: "tvm.runtime.Module", device: Optional[str]) -> "tvm.runtime.Device":
    """``cpu``, ``cuda``, or (``None``) the device the library's kernels are for."""
    if device is None:
        device = "cuda" if "cuda" in library_device_kinds(lib) else "cpu"
    dev = tvm.cpu(0) if device == "cpu" else tvm.cuda(0)
    if not dev.exist:
        raise LibraryError(f"no {device} device on this machine")
    return dev


class ModelRunner:
    """The ``main`` function of a library on a device."""

    def __init__(self, lib: "tvm.runtime.Module", dev: "tvm.runtime.Device"):
        self.dev = dev
        try:
            self.vm = relax.VirtualMachine(lib, dev)
        except Exception as err:  # device allocators raise RuntimeError
            raise LibraryError(f"cannot start the Relax VM: {first_line(err)}") from err
        if not self._has_main():
            raise LibraryError("the library has no 'main' function")

    def _has_main(self) -> bool:
        try:
            self.vm["main"]
        except (AttributeError, KeyError, ValueError, RuntimeError):
            return False
        return True

    def param_names(self) -> List[str]:
        """Names of ``main``'s parameters, as recorded in the library."""
        # pylint: disable=protected-access
        arity = self.vm._get_function_arity("main")
        return [self.vm._get_function_param_name("main", i) for i in range(arity)]

    def run(self, arrays: Sequence[np.ndarray]) -> List[np.ndarray]:
        """Call ``main``; returns its outputs flattened (a tuple output gives several)."""
        args = [tvm.runtime.tensor(a, self.dev) for a in arrays]
        try:
            result = self.vm["main"](*args)
        except Exception as err:  # shape/dtype checks raise RuntimeError/ValueError
            raise LibraryError(f"running main failed: {first_line(err)}") from err
        return _flatten(result)

    def median_latency_ms(self, arrays: Sequence[np.ndarray], repeat: int) -> float:
        """Median of ``repeat`` timed calls of ``main`` (argument conversion excluded)."""
        args = [tvm.runtime.tensor(a, self.dev) for a in arrays]
        self.vm.set_input("main", *args)
        timer = self.vm.time_evaluator(
            "invoke_stateful", self.dev, number=1, repeat=repeat, min_repeat_ms=0
        )
        return float(timer("main").median) * 1e3


def _flatten(value: Any) -> List[np.ndarray]:
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        out = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [np.asarray(value)]
