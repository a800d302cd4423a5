"""The search finds exactly the forms it found before its engine was made faster.

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

import hashlib
import json
import sys
from pathlib import Path
from typing import Dict, Optional

import pytest

from tvm_ollie.bench.search_bench import CASES
from tvm_ollie.derive.search import derive

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
