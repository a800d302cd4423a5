"""Alternatives that are the same module as another of their decision (twins).

A derived program of depth 0 is the unit's own operator as a target operator: EinNet's search
starts from the expression itself, so ``conv2d[1x21x8x8 * 21x21x3x3 p1,1,1,1]`` on the native
library is the original call on its library kernel, and ``matmul[16x32 @ 32x8]`` on TVM's
kernels is the original matmul. Emitted, each is the same Relax module as the original's (the
same ``call_dps_packed`` of the same library kernel, or the same operator that TVM legalizes),
so building, checking and timing it again measures the same code twice. Worse, a measured
decision cannot separate two copies of one kernel: the two tie and the rounds run to their
maximum (15 instead of 5) before the tie-break keeps the original, which is preferred over
every program anyway (:func:`~.choosing.preference`). On cold builds of GCN, Segformer, CSRNet,
Longformer and DCGAN (quick, 2026-12-04) 98 of 176 timed decisions had such a twin of the
original on its library kernel, and 60 of those ran 15 rounds.

The rule, on the isolated modules of a decision (:func:`~.units.unit_module`; the original
first, then the alternatives in the order the choose stage takes them)::

    twin(a)  iff  structural_equal(module(a), module(b)) for some b before a

A twin is neither built, checked nor timed; the alternative it equals is. Why the decision
cannot change: the twins run the same kernels on the same operands, so their timings differ
only by the machine's noise, and the one kept is preferred in every tie (it comes first: the
original, then its native kernel, then programs by estimate); a twin could only have won by a
noise separation of two copies of one kernel. Nothing takes its slot among the
``max_measured`` programs: the decision times what it would have timed, less the copies.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import tvm_ffi

__all__ = ["twins"]


def twins(modules: Dict[str, "tvm.IRModule"]) -> Dict[str, str]:
    """``{label: label of the earlier equal module}`` for every module of ``modules`` (in
    order, the original first) structurally equal to an earlier one (module docstring)."""
    found: Dict[str, str] = {}
    buckets: Dict[int, List[Tuple[str, "tvm.IRModule"]]] = {}
    for label, mod in modules.items():
        try:
            key = int(tvm_ffi.structural_hash(mod))
        except Exception:  # pylint: disable=broad-except
            continue  # (not hashable: never a twin)
        same = next((first for first, other in buckets.get(key, [])
                     if tvm_ffi.structural_equal(mod, other)), None)
        if same is not None:
            found[label] = same
        else:
            buckets.setdefault(key, []).append((label, mod))
    return found
