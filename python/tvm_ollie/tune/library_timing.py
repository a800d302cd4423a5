"""A Relax call timed on its native library kernel, called directly (no TVM build).

The derivation search of a unit stops once what it could still gain cannot repay its seconds
(:class:`~tvm_ollie.derive.search.CostBound`'s ``paid_back``). The gain comes from analytic
estimates, and on small operators those are several times the measured times (DCGAN's
transposed convolutions: library kernels measured at 7-39 us, the search's best programs
estimated at 52-130 us over roofline bounds of 9-23 us), so the searches ran to their shares.
A program cannot save more than the whole time of the best implementation already at hand;
the original on its library kernel is one, and it can be timed in a few milliseconds without
building anything: the kernel is a tvm-ffi global taking ``(attrs, *operands, out)``
(:func:`~tvm_ollie.codegen.library.emit_call`). :func:`library_seconds` is that time, the
search's ``gain_cap``.

The kernel runs on one thread here. On the loaded 2-core machine a two-thread call waited for
its second thread until the scheduler's tick: DCGAN's 1x64x4x4 transposed convolution took
8-24 ms at best of 5-200 calls, a kernel of 10-40 us in the model. One thread waits for nobody,
and is no faster than the model's threads wherever they help; where a kernel is so small that
its threads only add their fork and join (a few microseconds), the model's call is that much
slower than the cap, and the search may stop that many microseconds of gain early (0.1-0.5 s
of search at 100 000 runs).

Each call is timed by the calling thread's CPU clock (:func:`time.thread_time`): a kernel on
one thread runs on the calling thread, so those are the call's own seconds, not those another
process held the core (cold13, docs/compile-time.md: a 1-3 ms call's wall time at load 4-7 took
in others' slices), the unit the calibration measures the roof and the efficiencies in
(:mod:`.calibrate`), which lets the search compare this time with its roofline bound
(:func:`~tvm_ollie.transform.alternatives.measured_original`).

Only on the CPU: a CUDA kernel's call returns before the device finishes, and the decisions
time the CUDA kernels through TVM's builds anyway.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator, List, Optional, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..codegen import library as lib
from ..compat import relax, tvm

__all__ = ["call_operands", "library_seconds"]

LOG = logging.getLogger("tvm_ollie.tune")

#: Timed calls after the first (which builds and caches the library's primitive), at least;
#: the fastest counts: the machine only ever slows a call down.
REPEAT = 5
#: Calls go on until this many seconds have passed (at most :data:`MAX_CALLS`): a longer
#: window catches a call the machine did not slow down. A slowed time only makes the cap
#: higher (the search stops later), never lower.
WINDOW_S = 0.02
MAX_CALLS = 200


def _shape(expr) -> Optional[Tuple[int, ...]]:
    """The static shape of a float32 tensor-typed ``expr``, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or str(ty.dtype) != "float32":
        return None
    try:
        return tuple(int(s) for s in ty.shape)
    except (TypeError, ValueError):
        return None


def call_operands(call: "relax.Call") -> Optional[Tuple[List[Tuple[int, ...]], Tuple[int, ...]]]:
    """The shapes of the two operands and of the result of ``call`` (all static float32
    tensors), else None."""
    shapes = [_shape(a) for a in call.args[:2]] + [_shape(call)]
    if len(shapes) != 3 or any(s is None for s in shapes):
        return None
    return shapes[:2], shapes[2]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The native kernels on one thread inside the block (module docstring), as before after."""
    before = native.get_num_threads()
    native.set_num_threads(1)
    try:
        yield
    finally:
        native.set_num_threads(before)


def library_seconds(call: "relax.Call", repeat: int = REPEAT, window_s: float = WINDOW_S,
                    seed: int = 0) -> Optional[float]:
    """The fastest call of ``call``'s native kernel on random operands, in the calling
    thread's CPU seconds on one thread (module docstring; after one untimed call: at least
    ``repeat`` calls, more until ``window_s`` seconds have passed, at most
    :data:`MAX_CALLS`); None when the call has no library form on the CPU, a shape is not
    static, or the kernel fails."""
    if lib.current_device() != "cpu":
        return None
    form = lib.call_form(call)
    shapes = call_operands(call)
    if form is None or shapes is None:
        return None
    func = tvm_ffi.get_global_func(form.func, allow_missing=True)
    if func is None:
        return None
    rng = np.random.default_rng(seed)
    operands, out_shape = shapes
    try:
        with _one_thread():
            return _fastest(func, form.text(), operands, out_shape, repeat, window_s, rng)
    except Exception as err:  # pylint: disable=broad-except
        LOG.info("ollie: timing %s on its library kernel failed: %s", form.func, err)
        return None


def _fastest(func, text: str, operands, out_shape, repeat: int, window_s: float,
             rng, clock=time.thread_time) -> float:
    """The fastest call of ``func`` on random operands by ``clock`` (:func:`library_seconds`;
    the window by the wall clock)."""
    args = [tvm.runtime.tensor(rng.standard_normal(s, dtype=np.float32)) for s in operands]
    out = tvm.runtime.tensor(np.zeros(out_shape, dtype=np.float32))
    func(text, *args, out)
    best, begin = float("inf"), time.perf_counter()
    for k in range(MAX_CALLS):
        if k >= max(1, repeat) and time.perf_counter() - begin >= window_s:
            break
        t0 = clock()
        func(text, *args, out)
        best = min(best, clock() - t0)
    return best
