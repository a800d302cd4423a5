"""Faults injected through the decision core's interfaces: each leaves a correct module (the
original operator where the fault hit) and says why in the report."""

import logging
import os
import subprocess
import sys

import pytest
import tvm

import small_models as sm
from tvm_ollie.orchestrate import BLPResult, OrchestrateConfig
from tvm_ollie.orchestrate.pipeline import ollie_orchestration
from tvm_ollie.pipeline import build
from tvm_ollie.transform import OllieOptimize, optimize_module
from tvm_ollie.tune.metaschedule import Tuner

OPTS = dict(max_depth=1, search_time_s=2.0, calibration=sm.LLVM_CALIB)

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


def _assert_correct(new, mod, seed=3):
    args = sm.random_inputs(mod, seed=seed)
    sm.assert_close(sm.run(tvm.compile(new, target="llvm"), args),
                    sm.run(tvm.compile(mod, target="llvm"), args))


class FailingTuner(Tuner):
    """A MetaSchedule tuner whose tuning raises ``error`` (a crash or a time-out)."""

    def __init__(self, work_dir, error):
        super().__init__("llvm", str(work_dir))
        self.error = error
        self.calls = 0

    def tune(self, mod, trials, *args, **kwargs):  # pylint: disable=arguments-differ
        self.calls += 1
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("injected: tuning crashed"),
                                   TimeoutError("injected: tuning timed out")],
                         ids=["raises", "times_out"])
def test_tuning_fault_keeps_the_original(tmp_path, error, caplog):
    mod = sm.conv3x3()
    tuner = FailingTuner(tmp_path, error)
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        new, report = optimize_module(mod, "llvm", trials=1, work_dir=str(tmp_path),
                                      tuner=tuner, library=False, **OPTS)
    (d,) = report.decisions
    assert tuner.calls >= 1 and not d.rewritten
    assert d.reason == "the original operator failed to build or run"
    assert any(str(error) in r.getMessage() for r in caplog.records)
    tvm.ir.assert_structural_equal(new, mod)


def test_candidate_that_fails_to_build(tmp_path):
    """Every candidate's build fails (the timer's None) and the checker's build raises."""

    def timer(mod, label):
        return 1e-2 if label.endswith("|original") else None

    def checker(ref, cand):
        raise RuntimeError("injected: candidate failed to build")

    mod = sm.conv3x3()
    new, report = optimize_module(mod, "llvm", timer=timer, library=False, max_measured=1,
                                  **OPTS)
    (d,) = report.decisions
    assert not d.rewritten and "failed to build, tune or run" in d.reason, d.reason
    tvm.ir.assert_structural_equal(new, mod)
    new, report = optimize_module(mod, "llvm", checker=checker, **OPTS)
    (d,) = report.decisions
    assert not d.rewritten and "injected: candidate failed to build" in d.reason, d.reason
    tvm.ir.assert_structural_equal(new, mod)


def test_candidate_whose_verification_fails():
    """The cheapest candidate fails the numeric check; measured faster or forced, it is never
    applied."""

    def checker(ref, cand):
        return False, "injected: numerics differ"

    mod = sm.conv_stack()
    new, report = optimize_module(mod, "llvm", checker=checker,
                                  timer=lambda m, label: 1e-2 if "original" in label else 1e-4,
                                  **OPTS)
    assert report.decisions and not report.rewritten
    assert all("injected: numerics differ" in d.reason for d in report.decisions)
    tvm.ir.assert_structural_equal(new, mod)
    new, report = optimize_module(mod, "llvm", checker=checker,
                                  chooser=lambda sig, alts: alts[0] if alts else None, **OPTS)
    assert not report.rewritten
    assert all(d.reason.startswith("forced") and "rejected: injected" in d.reason
               for d in report.decisions), report.to_text()
    tvm.ir.assert_structural_equal(new, mod)


def test_forced_candidates_verified_and_correct():
    """The chooser forces the cheapest candidate past the cost model; it is verified, applied
    and correct (the differential fuzz in tests/fuzz forces each in turn)."""
    mod = sm.mlp()
    seen = {}

    def chooser(sig, alts):
        seen[sig] = [a.label for a in alts]
        return alts[-1] if alts else None

    new, report = optimize_module(mod, "llvm", chooser=chooser, **OPTS)
    assert report.rewritten and len(seen) == 2
    assert all(d.chosen == seen[d.signature][-1] and d.reason == "forced by the chooser"
               for d in report.decisions), report.to_text()
    _assert_correct(new, mod)
    # the same keyword through the pass object
    ollie = OllieOptimize(chooser=chooser, **OPTS)
    tvm.ir.assert_structural_equal(ollie(mod), new)
    assert [d.chosen for d in ollie.last_report.decisions] == \
        [d.chosen for d in report.decisions]


@pytest.mark.slow  # a second interpreter with its own derivation (about 40 s quiet)
def test_native_library_missing():
    """``TVM_OLLIE_DISABLE_NATIVE=1``: native kernels asked for, none available; the build
    completes on TVM kernels, correct, with the reason logged."""
    code = (
        "import logging, sys, tvm\n"
        "sys.path.insert(0, 'tests/transform')\n"
        "import small_models as sm\n"
        "from tvm_ollie import native\n"
        "from tvm_ollie.pipeline import build\n"
        "logging.basicConfig(level=logging.WARNING)\n"
        "assert not native.load()\n"
        "mod = sm.conv3x3()\n"
        "ex, report = build(mod, 'llvm', library=True, max_depth=1, search_time_s=2.0,\n"
        "                   calibration=sm.LLVM_CALIB,\n"
        "                   chooser=lambda sig, alts: alts[0] if alts else None)\n"
        "assert not any('[native]' in d.chosen for d in report.decisions)\n"
        "args = sm.random_inputs(mod)\n"
        "sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target='llvm'), args))\n"
        "print('rewritten', len(report.rewritten))\n"
    )
    env = dict(os.environ, TVM_OLLIE_DISABLE_NATIVE="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "disabled by TVM_OLLIE_DISABLE_NATIVE" in proc.stderr
    assert "rewritten" in proc.stdout


def test_corrupt_tuning_records_and_measurements(tmp_path, caplog):
    """A work dir whose MetaSchedule files and measurement cache hold garbage: the build
    repairs or ignores them, and is correct."""
    (tmp_path / "database_workload.json").write_text('["0x1f2e", {"garbage":\n')
    (tmp_path / "database_tuning_record.json").write_text("[0, [[[\x00\x01 not json\n")
    (tmp_path / "ollie_measurements.json").write_text('{"abc": 1.0, "de')
    mod = sm.conv3x3()
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        ex, report = build(mod, "llvm", work_dir=str(tmp_path), library=False,
                           chooser=lambda sig, alts: alts[0] if alts else None, **OPTS)
    assert report.rewritten
    args = sm.random_inputs(mod)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))
    assert any("database" in r.getMessage() or "corrupt" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def _no_solution(kind, calls):
    """A BLP solver that finds nothing: it times out with no incumbent, or raises."""

    def solver(problem, time_limit_s):
        calls.append(len(problem.costs))
        if kind == "raises":
            raise RuntimeError("injected: solver crashed")
        return BLPResult([], float("nan"), "time_limit_no_incumbent", float("nan"),
                         time_limit_s, len(problem.costs), 0, "injected: no solution in time")

    return solver


def test_orchestration_solver_finds_nothing(caplog):
    """The orchestration's binary program times out with no solution (or the solver raises)
    in an ``orchestrate=True`` build: the build completes with TVM's kernels one primitive
    each, outputs equal TVM's, and the report and the log say why."""
    mod = sm.mlp()
    new, _ = optimize_module(mod, "llvm", **OPTS)  # what build(orchestrate=True) does first
    args = sm.random_inputs(mod)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    normal = []
    tvm.compile(new, "llvm", relax_pipeline=ollie_orchestration("llvm", reports=normal))
    assert any(len(k.primitives) > 1 for p in normal[0].partitions for k in p.kernels)
    for kind, why in [("times_out", "injected: no solution in time"),
                      ("raises", "injected: solver crashed")]:
        calls, reports = [], []
        pipeline = ollie_orchestration("llvm", config=OrchestrateConfig(
            solver=_no_solution(kind, calls)), reports=reports)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
            ex = tvm.compile(new, "llvm", relax_pipeline=pipeline)
        sm.assert_close(sm.run(ex, args), ref)
        (report,) = reports
        assert calls and report.partitions
        for part in report.partitions:
            assert part.status.endswith("+singletons"), report.to_text()
            assert any(why in f for f in part.fallbacks), report.to_text()
            assert all(len(k.primitives) == 1 for k in part.kernels)
        assert why in report.to_text()
        assert any(why in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_orchestration_real_solver_with_zero_time_limit():
    """HiGHS itself given no time (``time_limit_s=0``): a partition it cannot solve in
    presolve is split, then kept as single kernels; the build is correct and says why."""
    mod = sm.conv_stack()
    reports = []
    pipeline = ollie_orchestration("llvm", config=OrchestrateConfig(time_limit_s=0.0),
                                   reports=reports)
    args = sm.random_inputs(mod)
    sm.assert_close(sm.run(tvm.compile(mod, "llvm", relax_pipeline=pipeline), args),
                    sm.run(tvm.compile(mod, target="llvm"), args))
    (report,) = reports
    text = report.to_text()
    assert "no solution" in text, text
    for part in report.partitions:
        # solved (in presolve, or an incumbent in time), or kept as singletons with the reason
        assert part.status in ("optimal", "time_limit") or part.fallbacks, text
