"""Finding and loading one of the package's shared libraries, once per process.

The CPU kernel library (:mod:`tvm_ollie.native`) and the CUDA one (:mod:`tvm_ollie.native_cuda`)
are found the same way (an environment variable, beside the package, ``tvm_ollie/lib`` in
site-packages) and loaded the same way (once, under a lock, never raising: a library that is
missing or broken makes the package fall back to TVM's kernels). Only what each loads before its
library, and the checks after, differ: that is the ``load`` function a :class:`LibraryLoader`
is given.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import site
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Callable, List, Optional

__all__ = ["LibraryLoader", "LoadState", "candidate_paths", "disabled", "find_dist_file"]


def candidate_paths(name: str, env: str) -> List[Path]:
    """Where the library ``name`` may be, in order: the environment variable ``env``, beside
    this package (a regular install), and ``tvm_ollie/lib`` in every site-packages directory (an
    editable install, where the package stays in the source tree)."""
    out: List[Path] = []
    given = os.environ.get(env)
    if given:
        out.append(Path(given))
    out.append(Path(__file__).resolve().parent / "lib" / name)
    dirs: List[str] = []
    for key in ("platlib", "purelib"):
        try:
            dirs.append(sysconfig.get_paths()[key])
        except KeyError:
            pass
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # some virtualenv layouts
        pass
    dirs.extend(p for p in sys.path if p.endswith("site-packages"))
    seen = set()
    for d in dirs:
        p = Path(d) / "tvm_ollie" / "lib" / name
        if str(p) not in seen:
            seen.add(str(p))
            out.append(p)
    return out


def find_dist_file(dist_name: str, basename: str) -> Optional[str]:
    """A file of an installed distribution, by base name (data-scheme files included)."""
    try:
        dist = md.distribution(dist_name)
    except md.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name == basename:
            path = os.path.abspath(str(dist.locate_file(f)))
            if os.path.exists(path):
                return path
    return None


class LoadState:
    """What a load attempt left: why it failed (``reason``) or the library's path.

    The ``load`` function of a :class:`LibraryLoader` fills ``reason`` when it returns False
    and ``path`` when it returns True.
    """

    def __init__(self) -> None:
        self.reason = "not loaded yet"
        self.path: Optional[str] = None


class LibraryLoader:
    """Loads one library once per process (thread-safe) and answers for it afterwards.

    Parameters
    ----------
    what : str
        The library in messages ("tvm-ollie native library").
    load : callable
        ``load(state) -> bool``: finds and opens the library, True when its functions are
        registered; may raise (the exception becomes the reason).
    logger : logging.Logger, optional
        Where one warning goes when the load fails (not when it was disabled on purpose);
        None: no warning (a library loaded on demand reports through :meth:`reason`).
    """

    def __init__(self, what: str, load: Callable[[LoadState], bool],
                 logger: Optional[logging.Logger] = None) -> None:
        self.what = what
        self._load = load
        self._logger = logger
        self._lock = threading.Lock()
        self._done = False
        self._ok = False
        self.state = LoadState()

    def load(self) -> bool:
        """Load the library on the first call; whether it is available. Never raises."""
        with self._lock:
            if self._done:
                return self._ok
            try:
                self._ok = bool(self._load(self.state))
            except Exception as err:  # pylint: disable=broad-except  (never break the import)
                self._ok = False
                self.state.reason = f"{type(err).__name__}: {err}"
            if self._ok:
                self.state.reason = ""
            self._done = True
            if not self._ok and self._logger and not self.state.reason.startswith("disabled"):
                self._logger.warning("%s unavailable: %s", self.what, self.state.reason)
            return self._ok

    def reason(self) -> str:
        """Why the library is not available ("" when it is)."""
        self.load()
        return self.state.reason

    def path(self) -> Optional[str]:
        """The loaded library's path, or None."""
        self.load()
        return self.state.path

    def func(self, name: str):
        """The global function ``name``; raises RuntimeError when the library is unavailable."""
        if not self.load():
            raise RuntimeError(f"{self.what} unavailable: {self.state.reason}")
        # lazy: tvm_ffi loads libtvm_ffi.so; this module imports no TVM until a library loads
        import tvm_ffi  # pylint: disable=import-outside-toplevel

        return tvm_ffi.get_global_func(name)

    def provides(self, name: str) -> bool:
        """Whether the loaded library registers the global function ``name``."""
        if not self.load():
            return False
        # lazy: tvm_ffi loads libtvm_ffi.so; this module imports no TVM until a library loads
        import tvm_ffi  # pylint: disable=import-outside-toplevel

        return tvm_ffi.get_global_func(name, allow_missing=True) is not None


def disabled(state: LoadState) -> bool:
    """Whether ``TVM_OLLIE_DISABLE_NATIVE`` switches the package's libraries off (then
    ``state.reason`` says so)."""
    if os.environ.get("TVM_OLLIE_DISABLE_NATIVE", "") not in ("", "0"):
        state.reason = "disabled by TVM_OLLIE_DISABLE_NATIVE"
        return True
    return False
