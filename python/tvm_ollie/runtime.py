"""Loading a compiled module without the compiler side of tvm-ollie.

A library built by ``tvm.compile`` (or ``tvm-ollie compile``) from a module that tvm-ollie
rewrote may call the native kernels (``tvm_ollie.cpu.matmul`` ...) through
``call_dps_packed``; those global functions exist only once the native library is loaded.
:func:`load_module` loads it first, then the compiled library::

    from tvm_ollie.runtime import load_module
    lib = load_module("model.so")
    vm = tvm.relax.VirtualMachine(lib, tvm.cpu())

Note: ``import tvm_ollie.runtime`` runs ``tvm_ollie/__init__.py`` (Python imports parent
packages first), which imports the pass modules too; nothing in this module needs them.
"""

from __future__ import annotations

import os
from typing import Union

from . import native, native_cuda
from .compat import tvm

__all__ = ["load_module"]


def load_module(path: Union[str, "os.PathLike[str]"]):
    """Load the native kernels (if available), then a compiled library.

    The native library is loaded best-effort: a module that does not call its kernels loads
    and runs without it (``tvm_ollie.native.unavailable_reason()`` says why it is missing).

    Parameters
    ----------
    path : str or PathLike
        A library written by ``Executable.export_library``.

    Returns
    -------
    tvm.runtime.Module
        The loaded module (wrap it in ``tvm.relax.VirtualMachine`` to run it).
    """

    path = os.fspath(path)
    native.load()
    native_cuda.load()  # the CUDA kernels, where the library was built (needs no GPU to load)
    return tvm.runtime.load_module(path)
