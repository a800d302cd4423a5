"""A TVM build in a thread of this process (transform/build_thread.py), and the whole-model
guard's library plan built there while the rewritten module is built here."""

import importlib
import logging
import threading

import numpy as np
import pytest
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.codegen import cached_alloc
from tvm_ollie.compat import tvm
from tvm_ollie.compile_profile import profile_scope, stage
from tvm_ollie.pipeline import build
from tvm_ollie.transform import batched, decide
from tvm_ollie.transform.alternatives import Candidates
from tvm_ollie.transform.batched import UnitBuild
from tvm_ollie.transform.build_thread import ThreadBuild
from tvm_ollie.transform.units import unit_module
from tvm_ollie.tune.measure import random_args

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)
pipeline_build = importlib.import_module("tvm_ollie.pipeline.build")  # (the module: the
# package's ``build`` is the function)


def test_the_thread_builds_in_the_callers_context_and_charges_no_stage():
    seen = {}

    def fake_build():
        seen["switch"] = cached_alloc.enabled()
        with stage("tvm build"):  # (charged nowhere: the thread has no profile)
            pass
        return "built"

    with profile_scope() as prof, cached_alloc.cached_alloc_scope(False):
        done = ThreadBuild(fake_build, jit=False)
        assert done.result() == "built" and done.done() and done.error is None
    assert seen["switch"] is False  # the caller's switch, not the default (on)
    assert "tvm build" not in prof.seconds


def test_the_thread_builds_under_the_callers_pass_context():
    seen = {}

    def fake_build():
        seen["opt_level"] = tvm.transform.PassContext.current().opt_level
        return "built"

    with tvm.transform.PassContext(opt_level=1):
        assert ThreadBuild(fake_build, jit=False).result() == "built"
    assert seen["opt_level"] == 1  # (a new thread's own context has the default, 2)


def test_a_failing_build_gives_none_and_keeps_its_error():
    def failing():
        raise RuntimeError("no kernel")

    done = ThreadBuild(failing, jit=False)
    assert done.result() is None
    assert isinstance(done.error, RuntimeError)


def test_the_thread_builds_and_loads_what_tvm_builds_here():
    mod = sm.conv_stack()
    ex = ThreadBuild(lambda: tvm.compile(mod, target="llvm")).result()
    args = sm.random_inputs(mod, seed=4)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


@pytest.mark.skipif(not native.available(), reason="no native library")
def test_the_guard_builds_the_library_plan_in_a_thread(monkeypatch):
    """The library plan built in a thread while the rewritten module is built here (two
    cores), not with one core: the same decisions and verdict either way, and the kept plan
    computes what TVM's build computes."""
    timer = lambda runs: {n: {"rewritten": 2e-3, "original": 3e-3, "library": 1e-3}[n]
                          for n in runs}
    opts = dict(max_depth=2, search_time_s=1.0, calibration=sm.LLVM_CALIB, model_guard=True)
    mod = sm.conv_stack()
    started = []

    class Spy(ThreadBuild):
        def __init__(self, *args, **kwargs):
            started.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pipeline_build, "ThreadBuild", Spy)
    monkeypatch.setattr(pipeline_build, "usable_cpus", lambda: 1)
    _, alone = build(mod, "llvm", plan_timer=timer, **opts)
    assert not started  # one core: built here, after the rewritten module
    monkeypatch.setattr(pipeline_build, "usable_cpus", lambda: 2)
    ex, threaded = build(mod, "llvm", plan_timer=timer, **opts)
    assert len(started) == 1 and started[0].done() and started[0].error is None
    assert threaded.model_guard.winner == "library" == alone.model_guard.winner
    assert [d.chosen for d in threaded.decisions] == [d.chosen for d in alone.decisions]
    args = sm.random_inputs(mod, seed=3)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


def _unit_modules():
    """A conv2d 3x3 call's original and three derived programs, as isolated modules."""
    call = sm.conv3x3()["main"].body.blocks[0].bindings[0].value
    alts = Candidates(library=False, derive=True, max_depth=2)(call, 2.0).alternatives[:4]
    return {a.label: unit_module(call, a.program, None, a.impl) for a in alts}


def test_a_decisions_build_in_two_threads_computes_what_one_build_does():
    """The merged build's parts built at once (one here, one in a thread): two builds, the
    parts dealt as for a pool, and every function computes what the one merged build's
    does."""
    modules = _unit_modules()
    serial, threaded = UnitBuild(modules, "llvm"), UnitBuild(modules, "llvm", threads=2)
    keys = list(modules)
    assert threaded.parts() == [keys[0::2], keys[1::2]]
    args = random_args(modules[keys[0]]["main"], seed=2)
    for key in keys:
        np.testing.assert_allclose(_outputs(threaded.function(key), args),
                                   _outputs(serial.function(key), args), rtol=1e-5, atol=1e-5)
    assert threaded.builds == 2 and serial.builds == 1 and not threaded.failed


def test_a_part_that_fails_in_its_thread_is_built_here(monkeypatch):
    modules = _unit_modules()
    calls = []
    real = batched.compile_module

    def flaky(mod, target):  # the thread's build fails once, the build here succeeds
        calls.append(threading.current_thread() is threading.main_thread())
        if not calls[-1]:
            raise RuntimeError("no LLVM today")
        return real(mod, target)

    monkeypatch.setattr(batched, "compile_module", flaky)
    build = UnitBuild(modules, "llvm", threads=2)
    assert build.function(list(modules)[1]) is not None and not build.failed
    assert sorted(calls) == [False, True, True] and build.builds == 2


def test_the_decider_builds_in_threads_only_with_a_second_core(monkeypatch):
    modules = _unit_modules()
    dec = decide.Decider("llvm", calibration=sm.LLVM_CALIB, library=False)
    monkeypatch.setattr(decide, "usable_cpus", lambda: 2)
    assert dec._merged(modules).threads == 2  # pylint: disable=protected-access
    monkeypatch.setattr(decide, "usable_cpus", lambda: 1)
    assert dec._merged(modules).threads == 1  # pylint: disable=protected-access


def _outputs(built, args):
    ex, name = built
    out = relax.VirtualMachine(ex, tvm.cpu())[name](*[tvm.runtime.tensor(a) for a in args])
    return out.numpy()
