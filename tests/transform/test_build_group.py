"""Several decisions' merged builds built as one module (:class:`~tvm_ollie.transform.batched.
BuildGroup`, :meth:`~tvm_ollie.transform.decide.Decider.prepare`): each alternative is still
checked and timed as its own function, a failing build takes no other decision down, and the
decisions are those of the decisions made one after the other."""

import logging

import numpy as np
import pytest
from tvm import relax

import small_models as sm
from tvm_ollie.compat import tvm
from tvm_ollie.transform import batched, optimize
from tvm_ollie.transform.alternatives import Candidates
from tvm_ollie.transform.batched import BuildGroup, UnitBuild
from tvm_ollie.transform.checking import Checker
from tvm_ollie.transform.costing import UntunedTiming
from tvm_ollie.transform.decide import Decider
from tvm_ollie.transform.optimize import optimize_module
from tvm_ollie.transform.units import unit_module
from tvm_ollie.tune.measure import compile_module, random_args

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


@pytest.fixture(scope="module", name="two")
def _two():
    """Two convolutions of different signatures, each with a few alternatives."""
    out = []
    for mod in (sm.conv3x3(), sm.conv1x1()):
        call = _call(mod)
        found = Candidates(library=False, derive=True, max_depth=2)(call, 2.0)
        out.append((call, found.alternatives[:3]))
    return out


def _unit_build(call, alts):
    return UnitBuild({a.label: unit_module(call, a.program, None, a.impl) for a in alts},
                     "llvm")


def _output(ex, name, args):
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm[name](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _counting(monkeypatch):
    builds = []
    real = batched.compile_module
    monkeypatch.setattr(batched, "compile_module",
                        lambda mod, target: builds.append(mod) or real(mod, target))
    return builds


def test_a_group_builds_its_decisions_once_each_alternative_its_own_function(two, monkeypatch):
    builds = _counting(monkeypatch)
    members = [_unit_build(call, alts) for call, alts in two]
    group = BuildGroup()
    for b in members:
        group.add(b)
    first = members[1].function(two[1][1][1].label)  # the first asked builds them all
    assert len(builds) == 1 and group.built == members[::-1] and first is not None
    names = set()
    for (call, alts), b in zip(two, members):
        args = random_args(unit_module(call)["main"], seed=1)
        for a in alts:
            ex, name = b.function(a.label)
            assert ex is first[0] and name not in names
            names.add(name)
            alone = compile_module(unit_module(call, a.program, None, a.impl), "llvm")
            np.testing.assert_array_equal(_output(ex, name, args), _output(alone, "main", args))
    assert len(builds) == 1 and len(names) == sum(len(alts) for _, alts in two)


def test_a_candidate_timed_from_a_group_is_timed_as_its_own_function(two, monkeypatch):
    members = [_unit_build(call, alts) for call, alts in two]
    group = BuildGroup()
    for b in members:
        group.add(b)
    sampled = []
    monkeypatch.setattr(UntunedTiming, "sample_built", lambda self, ex, function, module:
                        sampled.append((function, module)) or (lambda: 1.0))
    timing = UntunedTiming("llvm")
    call, alts = two[0]
    timing.use_build(call, members[0])
    for a in alts:
        assert timing.sampler(call, a)() == 1.0
    timing.use_build(None, None)
    assert [f for f, _ in sampled] == [members[0].function(a.label)[1] for a in alts]
    assert len(set(f for f, _ in sampled)) == len(alts)
    for (_, module), a in zip(sampled, alts):
        assert module.same_as(members[0].modules[a.label])


def test_a_failing_build_in_a_group_takes_no_other_decision_down(two, monkeypatch):
    """The group's build fails (one decision's module TVM cannot build): every decision then
    builds its own, and the other decisions' checks hold."""
    real = batched.compile_module
    builds = []

    def fails_with_the_bad_one(mod, target):
        builds.append(len(mod.functions))
        if any(f.attrs is not None and "test_bad" in f.attrs for f in mod.functions.values()):
            raise RuntimeError("injected: cannot build")
        return real(mod, target)

    monkeypatch.setattr(batched, "compile_module", fails_with_the_bad_one)
    (call0, alts0), (call1, _) = two
    good = _unit_build(call0, alts0)
    bad_mod = unit_module(call1)
    bad_mod = tvm.IRModule({gv: (f.with_attr("test_bad", 1) if gv.name_hint == "main" else f)
                            for gv, f in bad_mod.functions.items()})
    bad = UnitBuild({"original": unit_module(call1), "bad": bad_mod}, "llvm")
    group = BuildGroup()
    group.add(bad)
    group.add(good)
    assert Checker().check(call0, alts0[1], good) == (True, "")
    assert not good.failed and good.builds == 1 and group.built == []
    assert builds[0] > builds[1]  # the group's build first, then the good decision's own
    assert bad.function("bad") is None and bad.failed  # its own merged build failed too
    assert len(builds) == 3 and bad.group is None and good.group is None


class _ByWork:
    """A timer that gives every module its time by the kernels it calls (deterministic)."""

    def __call__(self, module, label):
        return 1e-6 * (1 + len(module.functions)) + 1e-9 * len(label)


def _decisions(report):
    return sorted((d.signature, d.chosen, d.measured) for d in report.decisions)


def test_the_pass_builds_its_call_decisions_together_with_the_same_decisions(monkeypatch):
    builds = _counting(monkeypatch)
    opts = dict(library=False, max_depth=2, search_time_s=4.0, calibration=sm.LLVM_CALIB,
                derivation_cache=False, check_untuned=True, min_share=0.0, max_measured=2)
    _, alone = optimize_module(sm.conv_stack(), "llvm", timer=_ByWork(), build_together=False,
                               **opts)
    n_alone = len(builds)
    builds.clear()
    _, together = optimize_module(sm.conv_stack(), "llvm", timer=_ByWork(), **opts)
    assert _decisions(together) == _decisions(alone)
    measured = [d for d in together.decisions if d.measured]
    assert len(measured) >= 2, together.decisions
    assert n_alone >= 2 and len(builds) == 1


def test_prepare_then_decide_is_decide():
    call = _call(sm.conv3x3())
    opts = dict(calibration=sm.LLVM_CALIB, library=False, max_depth=2, check_untuned=True,
                derivation_cache=False, max_measured=2, timer=_ByWork())
    direct = Decider("llvm", **opts).decide(call, 2.0)
    decider = Decider("llvm", **opts)
    build = decider.prepare(call, 2.0)
    assert build is not None and build.builds == 0  # nothing built yet
    assert decider.prepare(call, 2.0) is None  # (prepared once)
    later = decider.decide(call)
    assert (later.chosen, later.reason) == (direct.chosen, direct.reason)
    assert decider.decide(call) is later and build.builds == 1


class _Decided:
    """A decision of the fake units below (what :func:`_decide_units` reads of one)."""

    kind, function, var_name, signature, reason, contents = "call", "main", "v", "s", "", ""

    def __init__(self, rewritten):
        self.rewritten, self.chosen = rewritten, "x" if rewritten else "original"

    def for_unit(self, **_):
        return self


@pytest.mark.parametrize("rewritten, runs", [
    ((), [["a", "b"], ["c", "d"]]),  # b and c overlap: c starts the next run
    (("b",), [["a", "b"], ["d"]]),  # b rewritten: c is skipped, never prepared
])
def test_a_run_ends_at_the_first_unit_overlapping_it(monkeypatch, rewritten, runs):
    replaced = {"a": {1}, "b": {2}, "c": {2, 3}, "d": {4}}
    monkeypatch.setattr(optimize, "_identity", lambda u: (u, {"signature": u}))
    monkeypatch.setattr(optimize, "_replaced", lambda u: replaced[u])
    prepared, chosen = [], []

    def choose(unit, sig):
        chosen.append(unit)
        return _Decided(unit in rewritten)

    decided = optimize._decide_units(list("abcd"), choose, False,
                                     lambda run: prepared.append([u for u, _ in run]))
    assert prepared == runs
    assert chosen == [u for run in runs for u in run] == [u for u, _ in decided]
