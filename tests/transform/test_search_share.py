"""The module's search time shared by estimated time: a large operator gets more, every one
gets the floor, and what a search leaves unspent flows on."""

import pytest
from tvm import relax

import small_models as sm
from tvm_ollie.codegen.builder import single_function_module as _module
from tvm_ollie.codegen.builder import tensor_var as _var
from tvm_ollie.transform.alternatives import Candidates
from tvm_ollie.transform.choosing import MARGIN
from tvm_ollie.transform.optimize import _SearchShare


def _run(share, order, used):
    """Shares in ``order``, each search spending ``used(sig, share)`` on a fake clock."""
    clock, out = 0.0, {}
    for sig in order:
        out[sig] = share.next(sig, clock)
        clock += used(sig, out[sig])
    return out, clock


def test_large_operator_gets_more_and_the_floor_holds():
    share = _SearchShare(20.0, {"big": 1e-3, "small": 1e-6, "tiny": 0.0}, floor_s=1.0)
    out, spent = _run(share, ["small", "big", "tiny"], lambda _s, t: t)
    assert out["small"] == pytest.approx(1.0 + 17.0 * 1e-6 / (1e-3 + 1e-6))
    assert out["big"] > 15.0 > out["small"] >= 1.0
    assert out["tiny"] == pytest.approx(1.0)
    assert spent == pytest.approx(20.0)


def test_unspent_time_flows_on():
    weights = {"a": 1.0, "b": 1.0, "c": 2.0}
    full, _ = _run(_SearchShare(12.0, weights, floor_s=0.5), "abc", lambda _s, t: t)
    early, _ = _run(_SearchShare(12.0, weights, floor_s=0.5), "abc",
                    lambda s, t: 0.1 if s == "a" else t)
    assert early["a"] == full["a"]
    assert early["b"] > full["b"] and early["c"] > full["c"]
    assert early["b"] + early["c"] + 0.1 == pytest.approx(12.0)


def test_no_weights_split_equally_and_overspent_time_leaves_the_floor():
    out, _ = _run(_SearchShare(9.0, {"a": 0.0, "b": 0.0, "c": 0.0}, floor_s=0.5), "abc",
                  lambda _s, t: t)
    assert out == pytest.approx({"a": 3.0, "b": 3.0, "c": 3.0})
    late = _SearchShare(9.0, {"a": 1.0, "b": 1.0}, floor_s=0.5)
    assert late.next("a", 30.0) == 0.5 and late.next("b", 30.0) == 0.5
    assert _SearchShare(4.0, {}, floor_s=0.5).next("unknown", 0.0) == pytest.approx(4.0)


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


def test_the_pass_search_says_why_it_stopped():
    """A memory-bound convolution ends at its roofline bound at once (without the bound, it
    runs until nothing is left); a 3x3 convolution explores to the asked depth."""
    wide = _module([_var("x", (1, 2, 32, 32)), _var("w", (2, 2, 1, 1))],
                   lambda bb, x, w: relax.op.nn.conv2d(x, w))
    bounded = Candidates(False, True, max_depth=2, calibration=sm.LLVM_CALIB, margin=MARGIN)
    found = bounded(_call(wide), 10.0)
    assert found.note.endswith("stop=near_bound") and found.candidates >= 1
    plain = Candidates(False, True, max_depth=1)
    assert plain(_call(wide), 10.0).note.endswith("stop=exhausted")
    assert plain(_call(sm.conv3x3()), 10.0).note.endswith("stop=max_depth")
