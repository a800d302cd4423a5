"""The decisions' merged builds in worker processes: a pool build computes what the build in
the compiling process computes, a part the pool fails is built here, the decider asks for the
pool only where a module has enough units."""

import importlib
import logging

import numpy as np
import pytest
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.compat import tvm
from tvm_ollie.pipeline import build
from tvm_ollie.config import ConfigError, OllieConfig
from tvm_ollie.transform import batched, build_pool, decide
from tvm_ollie.transform.alternatives import Candidates
from tvm_ollie.transform.batched import UnitBuild
from tvm_ollie.codegen.cached_alloc import cached_alloc_scope
from tvm_ollie.transform.build_pool import MIN_UNITS, BuildPool
from tvm_ollie.transform.checking import Checker
from tvm_ollie.transform.costing import UntunedTiming
from tvm_ollie.transform.decide import Decider
from tvm_ollie.transform.units import unit_module
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration
from tvm_ollie.tune.measure import random_args

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)
pipeline_build = importlib.import_module("tvm_ollie.pipeline.build")  # (the module: the
# package's ``build`` is the function)

CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["llvm"]), "given")


@pytest.fixture(scope="module", name="conv")
def _conv():
    """A conv2d 3x3 call and its modules: the original and three derived programs."""
    call = sm.conv3x3()["main"].body.blocks[0].bindings[0].value
    alts = Candidates(library=False, derive=True, max_depth=2)(call, 2.0).alternatives[:4]
    return call, alts, {a.label: unit_module(call, a.program, None, a.impl) for a in alts}


@pytest.fixture(scope="module", name="pool")
def _pool():
    pool = BuildPool(2)
    yield pool
    pool.close()


def _outputs(built, args):
    ex, name = built
    out = relax.VirtualMachine(ex, tvm.cpu())[name](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()


class _FakePool:
    """A pool whose workers fail the parts ``failing`` names (by position) and build the
    others here."""

    workers = 2

    def __init__(self, failing=()):
        self.failing, self.asked = set(failing), []

    def build(self, modules, target):
        self.asked.append(len(modules))
        return [None if i in self.failing else batched.compile_module(m, target)
                for i, m in enumerate(modules)]


def test_a_pool_build_computes_what_the_serial_build_computes(conv, pool):
    call, alts, modules = conv
    serial, pooled = UnitBuild(modules, "llvm"), UnitBuild(modules, "llvm", pool)
    args = random_args(modules[alts[0].label]["main"], seed=5)
    for label in modules:
        np.testing.assert_array_equal(_outputs(pooled.function(label), args),
                                      _outputs(serial.function(label), args))
    assert pooled.builds == 2 and serial.builds == 1 and not pooled.failed
    assert pool.built >= 2 and not pool.failed
    # the checker's verdicts and the timing's samples from the pool's libraries
    assert [Checker().check(call, a, pooled) for a in alts[1:]] == \
        [Checker().check(call, a, serial) for a in alts[1:]]
    timing = UntunedTiming("llvm")
    timing.use_build(call, pooled)
    assert all(timing.sampler(call, a)() > 0 for a in alts)


def test_the_modules_are_dealt_into_one_part_per_worker(conv):
    _, _, modules = conv
    keys = list(modules)
    assert UnitBuild(modules, "llvm").parts() == [keys]
    assert UnitBuild(modules, "llvm", _FakePool()).parts() == [keys[0::2], keys[1::2]]
    two = {k: modules[k] for k in keys[:1]}
    assert UnitBuild(two, "llvm", _FakePool()).parts() == [keys[:1]]  # never an empty part


def test_a_part_the_pool_fails_is_built_here(conv, monkeypatch):
    call, alts, modules = conv
    fake = _FakePool(failing={1})
    built_here = []
    real = batched.compile_module
    monkeypatch.setattr(batched, "compile_module",
                        lambda mod, target: built_here.append(mod) or real(mod, target))
    build = UnitBuild(modules, "llvm", fake)
    assert Checker().check(call, alts[1], build) == (True, "")
    assert fake.asked == [2] and len(built_here) == 2  # the fake's good part, then the failed
    assert not build.failed and build.builds == 3


def test_a_part_that_fails_everywhere_builds_every_module_alone(conv, monkeypatch):
    call, alts, modules = conv
    monkeypatch.setattr(batched, "compile_module",
                        lambda mod, target: (_ for _ in ()).throw(RuntimeError("injected")))
    build = UnitBuild(modules, "llvm", _FakePool(failing={0, 1}))
    assert build.function(alts[1].label) is None and build.failed
    assert Checker().check(call, alts[1], build) == (True, "")  # built alone


@pytest.mark.parametrize("wanted, units, asks", [
    (None, MIN_UNITS - 1, False), (None, MIN_UNITS, True), (False, 100, False),
    (True, 1, True), (True, 0, False)])
def test_the_decider_asks_for_the_pool_by_its_units(monkeypatch, wanted, units, asks):
    fake = _FakePool()
    monkeypatch.setattr(decide, "shared_pool", lambda: fake)
    decider = Decider("llvm", OllieConfig(calibration=CALIB, build_pool=wanted,
                                          derivation_cache=False))
    decider.plan_builds(units)
    assert (decider.pool is fake) == asks


class _Shortlisted:
    """Estimates that shortlist every alternative (the original's twin aside, which is
    never built: ``transform.twins``, the decision has programs to build)."""

    measured = False

    @staticmethod
    def seconds(_unit, alt):
        return 1e-3 if alt.is_baseline else 1e-4


def test_the_decisions_build_in_the_pool(monkeypatch):
    """A module's decision built in the pool decides what it decides built here."""
    fake = _FakePool()
    monkeypatch.setattr(decide, "shared_pool", lambda: fake)
    chosen, asked = [], []
    for wanted in (False, True):
        decider = Decider("llvm", OllieConfig(calibration=CALIB, build_pool=wanted,
                                              derivation_cache=False, max_depth=2),
                          timer=lambda mod, label: 1e-3 if "tvm" in label else 1e-4,
                          estimator=_Shortlisted())
        decider.plan_builds(1)
        call = sm.conv3x3()["main"].body.blocks[0].bindings[0].value
        chosen.append(decider.decide(call, 1.0).label)
        asked.append(len(fake.asked))
    assert chosen[0] == chosen[1] and asked[0] == 0 and asked[1] > 0


def test_no_pool_on_one_cpu(monkeypatch):
    monkeypatch.setattr(build_pool, "usable_cpus", lambda: 1)
    monkeypatch.setattr(build_pool, "_SHARED", [])
    assert build_pool.shared_pool() is None
    assert build_pool._SHARED == [None]  # (not asked again)


def test_the_option_is_validated():
    assert OllieConfig(build_pool=True).build_pool is True
    with pytest.raises(ConfigError, match="build_pool"):
        OllieConfig(build_pool=2)



@pytest.mark.skipif(not native.available(), reason="no native library")
def test_the_guard_builds_the_library_plan_in_the_pool(pool, monkeypatch):
    """The whole-model guard's library plan built in a worker while the rewritten module is
    built here: the same verdict, and the kept plan computes what TVM's build computes."""
    timer = lambda runs: {n: {"rewritten": 2e-3, "original": 3e-3, "library": 1e-3}[n]
                          for n in runs}
    # the default config (cached allocations on): the switch travels with the request
    opts = dict(max_depth=2, search_time_s=1.0, calibration=sm.LLVM_CALIB, model_guard=True)
    mod = sm.conv_stack()
    _, serial = build(mod, "llvm", plan_timer=timer, **opts)
    monkeypatch.setattr(pipeline_build, "running_pool", lambda: pool)
    before = pool.built
    ex, pooled = build(mod, "llvm", plan_timer=timer, **opts)
    assert pool.built == before + 1 and pooled.model_guard.winner == "library" == \
        serial.model_guard.winner
    assert [d.chosen for d in pooled.decisions] == [d.chosen for d in serial.decisions]
    args = sm.random_inputs(mod, seed=3)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


@pytest.mark.skipif(not native.available(), reason="no native library")
@pytest.mark.parametrize("switch", [True, False])
def test_a_worker_builds_under_the_callers_cached_alloc_switch(pool, switch):
    """A worker shares no context with the caller: the cached allocations' switch where the
    build was asked for goes with the request, so the worker lifts the planned allocations
    (``main_cached_alloc``) exactly when the caller would, and the library computes what TVM's
    build computes."""
    native.load()
    mod = sm.conv_stack()
    with cached_alloc_scope(switch):
        ex = pool.submit(mod, "llvm").result()
    assert ex is not None
    vm = relax.VirtualMachine(ex, tvm.cpu())
    assert vm.module.implements_function("main_cached_alloc") == switch
    args = sm.random_inputs(mod, seed=5)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))
