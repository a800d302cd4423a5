"""A TVM build in a thread of this process, beside this process's own build.

A cold build ends with two independent TVM builds: the rewritten module's and the whole-model
guard's library plan (``pipeline.build``), each the pipeline's passes, LLVM's code generation
and, on first use, the JIT of the executable's kernels (docs/compile-time.md, "cold14": LLVM's
code generation and the JIT took 36-48 % of the cold builds profiled there, all on one of the
machine's two cores). Both are known before either is built and nothing is timed until both
are, so the second can be built on the other core while this thread builds the first: most of
a build is C++ (TVM's passes, LLVM), which the FFI runs without the GIL.

Why the thread's build is the build this thread would have made: it runs the same function on
the same module and target, in a copy of the caller's context (the config scope, the cached
allocations' switch: :mod:`contextvars`), with no compile profile (two threads charging one
profile's stages would mix their clocks; the caller charges its wait instead), and under the
caller's TVM pass context (TVM keeps it per thread: it is entered again in the thread). The build pool's worker processes
(:mod:`.build_pool`) do the same across processes, at the cost of starting them (seconds
under load: docs/compile-time.md, "cold9", "cold11").
"""

from __future__ import annotations

import contextvars
import threading
from typing import Callable, Optional

from ..compat import relax, tvm
from ..compile_profile import suspended

__all__ = ["ThreadBuild"]


class ThreadBuild:
    """``build()`` started at once in a thread, its kernels JIT-compiled there too.

    Parameters
    ----------
    build : callable
        ``build() -> Executable``: the build, made in a copy of the caller's context.
    jit : bool
        Also load the executable's kernels in the thread (a Relax VM on the CPU: LLVM's JIT of
        the whole library, which the first VM made anywhere would otherwise pay).
    """

    def __init__(self, build: Callable[[], "tvm.runtime.Executable"], jit: bool = True):
        self._build = build
        self._jit = jit
        self._ex: Optional["tvm.runtime.Executable"] = None
        self._error: Optional[BaseException] = None
        self._pass_context = tvm.transform.PassContext.current()
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,),
                                        name="tvm-ollie-build", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            with suspended(), self._pass_context:
                ex = self._build()
                if self._jit:
                    relax.VirtualMachine(ex, tvm.cpu())
            self._ex = ex
        except BaseException as err:  # pylint: disable=broad-except
            self._error = err  # (raised again in the caller's thread by result())

    def done(self) -> bool:
        """Whether the build has ended (built or failed)."""
        return not self._thread.is_alive()

    @property
    def error(self) -> Optional[BaseException]:
        """What the build raised (None: built, or not ended yet)."""
        return self._error

    def result(self) -> Optional["tvm.runtime.Executable"]:
        """The executable, once built (waits); None when the build failed (the caller builds
        it again in its own thread, where the error is raised and reported as before)."""
        self._thread.join()
        return self._ex
