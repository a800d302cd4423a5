"""The cyclic garbage collector paused while the derivation engine builds its expressions.

A search (and reading or writing its result in the derivation cache) allocates millions of
small objects that stay alive: the interned nodes and the analyses cached on them. Every
automatic collection walks the young ones again and the full ones the whole heap: 30-35 % of a
search's CPU time, and most of a derivation-cache write (measured: docs/compile-time.md, "The
search's per-state cost"). The engine leaves almost no cyclic garbage (nodes never hold
themselves in their caches; recursive walks unbind their closures), so with the collector
paused memory grows by what stays alive anyway.
"""

from __future__ import annotations

import contextlib
import gc

__all__ = ["GC_ALLOCATIONS", "collector_paused"]

#: While paused, the collector runs only once this many container objects were allocated
#: (net) since the last collection.
GC_ALLOCATIONS = 4_000_000


@contextlib.contextmanager
def collector_paused(allocations: int = GC_ALLOCATIONS):
    """Python's cyclic garbage collector paused (restored on exit); yields a ``check()`` to
    call now and then, which collects once ``allocations`` container objects accumulated
    (what bounds the garbage). Nothing the engine computes depends on when garbage is freed.
    Leave the block after dropping the search's states (its frontier, its seen sets): what is
    still alive then is walked once, by the young collection on exit.
    """
    was = gc.isenabled()
    gc.disable()

    def check() -> None:
        if gc.get_count()[0] > allocations:
            gc.collect(1)  # the young generations: what the search allocated since

    try:
        yield check
    finally:
        if was:
            # what survived is young: one collection of the young generations moves it on at
            # once (the automatic ones would each walk it again: gen0, gen1, then all)
            if gc.get_count()[0] > gc.get_threshold()[0]:
                gc.collect(1)
            gc.enable()
