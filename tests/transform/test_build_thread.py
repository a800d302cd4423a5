"""A TVM build in a thread of this process (transform/build_thread.py), and the whole-model
guard's library plan built there while the rewritten module is built here."""

import importlib
import logging

import pytest
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.codegen import cached_alloc
from tvm_ollie.compat import tvm
from tvm_ollie.compile_profile import profile_scope, stage
from tvm_ollie.pipeline import build
from tvm_ollie.transform.build_thread import ThreadBuild

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
