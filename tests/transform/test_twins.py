"""Twins: an alternative that is the same module as an earlier one of its decision is neither
built, checked nor timed (:mod:`tvm_ollie.transform.twins`), and the decision is the one the
copies would have given."""

import logging

import pytest

import small_models as sm
from tvm_ollie import native
from tvm_ollie.transform import decide
from tvm_ollie.transform.alternatives import Candidates
from tvm_ollie.transform.decide import Decider
from tvm_ollie.transform.twins import twins
from tvm_ollie.transform.units import unit_module

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


def test_a_twin_is_a_later_copy_of_an_earlier_module():
    original, copy, other = sm.conv3x3(), sm.conv3x3(), sm.conv1x1()
    assert twins({"original": original, "other": other, "copy": copy}) == {"copy": "original"}
    assert twins({"copy": copy, "original": original}) == {"original": "copy"}  # the first kept
    assert twins({"original": original, "other": other}) == {}
    assert twins({}) == {}


@pytest.mark.parametrize("library", [False, True])
def test_the_depth_0_program_is_a_twin_of_the_original(library):
    """EinNet's level 0 is the operator itself: on TVM it is the original's module, on the
    library the original's library call."""
    if library and not native.load():
        pytest.skip("the native library is not built here")
    call = _call(sm.conv3x3())
    found = Candidates(library, True, 1)(call, 2.0)
    modules = decide.Decider.unit_modules(call, found.alternatives)
    same = twins(modules)
    assert "original" not in same and same, sorted(modules)
    assert set(same.values()) <= {"original", "original [native]"}
    for twin, first in same.items():
        assert twin.startswith("conv2d[") and twin.endswith("[native]") == (first != "original")


class _TwinsFirst:
    """Estimates that shortlist the twins first among the programs (as the measured
    calibration does for a convolution whose library kernel is the cheapest estimate)."""

    measured = False

    def __init__(self, copies):
        self.copies = copies

    def seconds(self, _unit, alt):
        if alt.program is None:
            return 1e-3 if alt.impl == "tvm" else 1e-5
        return 1e-5 if alt.label in self.copies else 2e-5


def _decide(monkeypatch, found, library: bool, guard: bool):
    """The untuned decision of a 3x3 convolution under a fake timer that gives every module
    its time by what it computes (a twin the time of the module it copies): the labels
    timed and the decision."""
    call = _call(sm.conv3x3())
    timed = []
    copies = {}

    def timer(_module, label):
        label = label.rsplit("|", 1)[-1]  # (``<signature>|<alternative>``)
        timed.append(label)
        first = copies.get(label, label)
        return {"original": 4e-5, "original [native]": 2e-5}.get(first, 3e-5)

    copies.update(twins(decide.Decider.unit_modules(call, found.alternatives)))
    if not guard:
        monkeypatch.setattr(decide, "twins", lambda modules: {})
    decider = Decider("llvm", calibration=sm.LLVM_CALIB, library=library, max_depth=2,
                      timer=timer, derivation_cache=False, max_measured=3,
                      estimator=_TwinsFirst(copies))
    decider.candidates = lambda unit, budget_s: found  # (one search for both decisions)
    choice = decider.decide(call, 2.0)
    return set(timed), copies, choice


def test_a_measured_decision_never_times_a_twin_and_decides_the_same(monkeypatch):
    """The depth-0 programs (the original on TVM's kernel and on the library's), estimated
    first among the programs, are timed without the guard; with it, never, and the decision
    is the same."""
    if not native.load():
        pytest.skip("the native library is not built here")
    found = Candidates(True, True, 2)(_call(sm.conv3x3()), 2.0)
    without, copies, plain = _decide(monkeypatch, found, True, guard=False)
    monkeypatch.undo()
    timed, _, choice = _decide(monkeypatch, found, True, guard=True)
    assert plain.measured and choice.measured, (plain.reason, choice.reason)
    dropped = [label for label in without if label in copies]
    assert dropped, (sorted(without), copies, plain.reason)
    assert not timed & set(copies) and timed == without - set(dropped)
    assert choice.chosen == plain.chosen
    assert "not built, checked or timed (the same module as" in choice.reason
    assert all(label in choice.reason for label in dropped)
