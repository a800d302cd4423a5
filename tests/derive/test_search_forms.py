"""The search finds exactly the forms it found before its engine was made faster, and what
made it faster stays so.

The search's speed-ups (identity hashing of interned nodes, walks that skip index arithmetic,
node caches without reference cycles, the cyclic collector paused while searching) must not
change what it explores or finds. Each case of the search benchmark
(:mod:`tvm_ollie.bench.search_bench`; the quick shapes whole, the EinNet shapes up to a number
of states) is searched, and everything the search reports that depends on the exploration is
compared with ``data/search_forms.json``: the states visited, pruned and generated, the depth
reached, the stop reason, the guided steps, and a digest of every candidate found, in order,
with its depth and text (``found_log``) and of the returned programs with their stages.

The reference was recorded with the engine before those changes (commit ``b23ae4b``). A change
of the rules or of the search's order changes it legitimately: then record it again, with
``python tests/derive/test_search_forms.py --record``, and say why in the commit.
"""

from __future__ import annotations

import gc
import hashlib
import json
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from tvm_ollie.bench.search_bench import CASES
from tvm_ollie.derive.canon import canonicalize
from tvm_ollie.derive.focus import scopes_of
from tvm_ollie.derive.rules.base import body_accesses
from tvm_ollie.derive.search import collector_paused, derive
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var, iter_nodes
from tvm_ollie.ir.simplify import simplify

DATA = Path(__file__).parent / "data" / "search_forms.json"

#: (case, quick shapes, states limit): every bench case, whole where that takes a few seconds,
#: else its first states (in the EinNet shapes too: their order and pruning differ).
RUNS = [("conv3x3", True, 120), ("conv5x5", True, 80), ("convtranspose", True, None),
        ("convtranspose-lifted", True, None), ("g2bmm", True, None),
        ("conv3x3", False, 120), ("conv5x5", False, 50), ("convtranspose", False, 120),
        ("convtranspose-lifted", False, 120), ("g2bmm", False, None)]


def _key(name: str, quick: bool, states: Optional[int]) -> str:
    return f"{name}/{'quick' if quick else 'full'}/{states or 'all'}"


def snapshot(name: str, quick: bool, states: Optional[int]) -> Dict[str, object]:
    """What a depth-7 search of the case explored and found (see the module docstring)."""
    case = CASES[name]
    res = derive(case.build(quick), targets=case.targets, max_depth=7, max_states=states,
                 verify=False, max_candidates=None)
    st = res.stats
    found = [(d, r) for _, d, r in st.found_log]
    programs = [repr(p) + "|" + ";".join(str(s.expr) for s in p.stages) for p in res.candidates]
    digest = hashlib.sha256(json.dumps([found, programs]).encode()).hexdigest()
    return {"visited": st.states_visited, "pruned": st.states_pruned,
            "pruned_raw": st.states_pruned_raw, "generated": st.states_generated,
            "depth": st.max_depth_reached, "stop": st.stop_reason.value,
            "guided": st.guided_steps, "candidates": len(found), "digest": digest}


@pytest.mark.parametrize("name,quick,states", RUNS, ids=[_key(*r) for r in RUNS])
def test_search_finds_the_recorded_forms(name, quick, states):
    expected = json.loads(DATA.read_text())[_key(name, quick, states)]
    assert snapshot(name, quick, states) == expected


def _record() -> None:
    DATA.write_text(json.dumps({_key(*r): snapshot(*r) for r in RUNS}, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--record"]:
        _record()
    else:
        print(__doc__)


# -- what makes it faster, kept so --------------------------------------------------------------


def _fresh_conv():
    """A 3x3 convolution whose nodes no other test built (fresh tensor names): fresh caches."""
    vn, vh, vw, vf, vc, vr, vs = (Var(x) for x in "nhwfcrs")
    a = Tensor("A_forms_fresh", (1, 4, 4, 8), pad=((0, 0), (1, 1), (1, 1), (0, 0)))
    k = Tensor("K_forms_fresh", (3, 3, 8, 8))
    return Scope([IterVar(vn, 0, 1), IterVar(vh, 0, 4), IterVar(vw, 0, 4), IterVar(vf, 0, 8)],
                 [IterVar(vc, 0, 8), IterVar(vr, 0, 3), IterVar(vs, 0, 3)],
                 a[vn, vh + vr - 1, vw + vs - 1, vc] * k[vr, vs, vf, vc])


def _holds(value, node) -> bool:
    if value is node:
        return True
    if isinstance(value, (tuple, list, frozenset, set)):
        return any(v is node for v in value)
    return False


def test_node_caches_do_not_hold_their_own_node():
    """A node holding itself in its cache is a reference cycle: dropped, it stays in memory
    until the cyclic collector finds it (what made the collector a third of a search)."""
    expr = _fresh_conv()
    canon = canonicalize(expr)
    derive(expr, targets=("matmul",), max_depth=2, max_states=20, verify=False)
    for root in (expr, canon):
        scopes_of(root)
        body_accesses(root.body)
        simplify(root)
        for node in iter_nodes(root):
            for key, value in node._cache.items():
                assert not _holds(value, node), (key, str(node))
    assert scopes_of(expr)[0] is expr and simplify(canon) is canon
    assert body_accesses(expr.body.a) == (expr.body.a,)


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_restores_the_collector(enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with collector_paused() as check:
            assert not gc.isenabled()
            check()
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_collector_paused_collects_past_its_allocations():
    with collector_paused(allocations=1000) as check:
        junk = [[] for _ in range(5000)]
        assert gc.get_count()[0] > 1000
        check()
        assert gc.get_count()[0] < 1000
        del junk


def test_a_search_leaves_the_collector_on():
    assert gc.isenabled()
    derive(_fresh_conv(), targets=("matmul",), max_depth=1, verify=False)
    assert gc.isenabled()
