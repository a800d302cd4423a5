"""MetaSchedule's worker pools kept for the whole test run (a test-suite hook, not product code).

MetaSchedule's ``LocalBuilder`` starts a new ``PopenPoolExecutor`` (up to two worker processes)
in its constructor's sanity check and again on every ``build()`` call, and every
``LocalRunner`` starts one of its own. Each worker imports TVM (and torch, which ``tvm_ffi``
imports): about 8 CPU seconds, for builds and runs of tiny kernels that take milliseconds. The
tests that tune therefore spent nearly all their time starting workers
(``tune/test_tune.py::test_tiny_tuning_and_database_reuse``: 130 of its 140 s, cProfile).

:func:`keep_pools` makes the two modules' ``PopenPoolExecutor`` hand out kept pools whose
``shutdown`` keeps the workers: every builder and runner of the run shares them. The same
functions run in the same kind of worker (a timed-out worker is still killed and restarted by
the pool); only the number of processes started changes. RPC runners keep their own pools (the
RPC tests end servers on purpose).
"""

import contextlib
from typing import Dict, Iterator, Tuple


class _KeptPool:
    """A ``PopenPoolExecutor`` whose ``shutdown`` keeps its workers for the next user."""

    def __init__(self, pool):
        self._pool = pool

    def __getattr__(self, name):
        return getattr(self._pool, name)

    def shutdown(self, wait=True):  # pylint: disable=unused-argument
        """Kept: the real pool is shut down when the test run ends."""


@contextlib.contextmanager
def keep_pools() -> Iterator[Dict[Tuple, object]]:
    """Within the block, MetaSchedule's local builders and runners share kept worker pools
    (one per timeout, initializer and output streams: the builders' and the runners' at the
    timeouts they ask for), of one worker each (the tests build and run tiny kernels; a second
    worker would cost its import for little); on exit the pools are shut down."""
    # pylint: disable=import-outside-toplevel
    from tvm.s_tir.meta_schedule.builder import local_builder
    from tvm.s_tir.meta_schedule.runner import local_runner
    from tvm.support.popen_pool import PopenPoolExecutor

    pools: Dict[Tuple, object] = {}

    def kept(max_workers=None, timeout=None, **kwargs):
        key = (timeout,) + tuple(sorted(kwargs.items()))
        try:
            hash(key)
        except TypeError:  # an argument that is not hashable: an ordinary pool
            return PopenPoolExecutor(max_workers=max_workers, timeout=timeout, **kwargs)
        if key not in pools:
            pools[key] = PopenPoolExecutor(max_workers=1, timeout=timeout, **kwargs)
        return _KeptPool(pools[key])

    with _patched(local_builder, kept), _patched(local_runner, kept):
        try:
            yield pools
        finally:
            for pool in pools.values():
                pool.shutdown(wait=False)


@contextlib.contextmanager
def _patched(module, factory):
    original = module.PopenPoolExecutor
    module.PopenPoolExecutor = factory
    try:
        yield
    finally:
        module.PopenPoolExecutor = original
