"""build()'s whole-model guard: the rewritten module timed whole against TVM's build of the
original, the faster kept (ties: the original), every decision reverted when the original is
kept. A fake ``plan_timer`` stands for the timing."""

import pytest
import tvm
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.codegen.builder import single_function_module as _module, tensor_var
from tvm_ollie.config import ConfigError, OllieConfig
from tvm_ollie.frontend.explain import guard_line
from tvm_ollie.pipeline import build
from tvm_ollie.pipeline.build import MODEL_PREFERENCE, _revert, model_guard_on
from tvm_ollie.pipeline.guard import GUARD_MARGIN, GuardReport, PlanOutcome
from tvm_ollie.pipeline.joint_plans import GUARD_TIMING
from tvm_ollie.tune.compare import Timing, judge
from tvm_ollie.transform.report import OpDecision, OptimizeReport, RegionDecision

#: conv1x1 is rewritten (a matmul) at once under the fixed calibration, without the library
OPTS = dict(max_depth=2, search_time_s=1.0, calibration=sm.LLVM_CALIB, library=False,
            model_guard=True)


def _timer(seconds):
    """A plan timer reporting ``seconds[plan]``; records the plans it was given."""
    def timer(runs):
        timer.seen.append(sorted(runs))
        return {name: seconds[name] for name in runs}

    timer.seen = []
    return timer


def _check_equals_tvm(ex, mod):
    args = sm.random_inputs(mod, seed=3)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


def test_a_faster_rewrite_is_kept():
    timer = _timer({"rewritten": 1e-3, "original": 2e-3})
    ex, report = build(sm.conv1x1(), "llvm", plan_timer=timer, **OPTS)
    assert timer.seen == [["original", "rewritten"]]
    assert report.model_guard.winner == "rewritten" and report.model_guard.kept_s == 1e-3
    (d,) = report.decisions
    assert d.rewritten and "whole-model guard" not in d.reason
    assert "conv2d" not in ex.as_text()
    assert "model guard" in report.compile_profile.seconds
    assert "kept rewritten" in report.to_text()
    assert guard_line(report).startswith("whole-model guard: kept rewritten (rewritten 1.000 ms")


def test_a_faster_original_is_kept_and_every_decision_reverted():
    timer = _timer({"rewritten": 2e-3, "original": 1e-3})
    mod = sm.conv1x1()
    ex, report = build(mod, "llvm", plan_timer=timer, **OPTS)
    assert report.model_guard.winner == "original"
    (d,) = report.decisions
    assert not d.rewritten and d.after_s == d.before_s and not d.explain
    assert d.reason.startswith("whole-model guard: the rewritten module took 2.000ms, the "
                               "original 1.000ms (separated)"), d.reason
    assert "conv2d" in ex.as_text()  # TVM's build of the module as given
    _check_equals_tvm(ex, mod)


def test_the_guard_times_both_builds_with_the_protocol_by_default():
    """No fake timer: the two executables are timed in alternating rounds; whichever is kept,
    the report agrees with it and the model computes what TVM's build computes."""
    mod = sm.conv1x1()
    ex, report = build(mod, "llvm", **OPTS)
    guard = report.model_guard
    assert guard.comparison is not None and guard.comparison.rounds >= 7
    assert set(guard.times()) == {"rewritten", "original"}
    assert report.decisions[0].rewritten == (guard.winner == "rewritten")
    assert guard.kept_s == guard.times()[guard.winner]
    _check_equals_tvm(ex, mod)


def test_the_verdict_is_kept_in_the_work_dir_and_read_back(tmp_path):
    """A second build of the same model with the same work dir times nothing: it reads the
    first build's comparison back and keeps the same build."""
    first = _timer({"rewritten": 2e-3, "original": 1e-3})
    _, report = build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    assert first.seen and report.model_guard.winner == "original"
    assert "whole model" in (tmp_path / "ollie_decisions.json").read_text()

    def timer(_runs):
        raise AssertionError("the verdict is recorded")

    _, again = build(sm.conv1x1(), "llvm", plan_timer=timer, work_dir=str(tmp_path), **OPTS)
    assert again.model_guard.winner == "original" and not again.decisions[0].rewritten
    assert again.model_guard.times() == report.model_guard.times()
    assert any("read back" in note for note in again.model_guard.notes)


def test_a_tie_keeps_the_original():
    assert MODEL_PREFERENCE[0] == "original"
    _, report = build(sm.conv1x1(), "llvm", plan_timer=_timer({"rewritten": 1e-3,
                                                               "original": 1e-3}), **OPTS)
    assert report.model_guard.winner == "original"
    assert "a tie keeps the original" in report.decisions[0].reason


def test_a_rewrite_that_computes_something_else_is_never_kept(monkeypatch):
    """The rewritten module's outputs are checked against the original's before timing."""
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["optimize_module"])
    real = build_mod.optimize_module

    def off_by_one(mod, **kw):
        _, report = real(mod, **kw)
        wrong = _module([tensor_var("x", (1, 16, 6, 6)), tensor_var("w", (8, 16, 1, 1))],
                        lambda bb, x, w: relax.op.add(relax.op.nn.conv2d(x, w),
                                                      relax.const(1.0, "float32")))
        return wrong, report

    monkeypatch.setattr(build_mod, "optimize_module", off_by_one)
    timer = _timer({"rewritten": 1e-3, "original": 2e-3})
    mod = sm.conv1x1()
    ex, report = build(mod, "llvm", plan_timer=timer, **OPTS)
    assert timer.seen == []  # one plan left: nothing to time
    assert report.model_guard.winner == "original"
    assert "outputs differ from original's" in report.decisions[0].reason
    _check_equals_tvm(ex, mod)


def test_the_guard_is_off_by_config_and_by_default_with_a_calibration():
    def timer(_runs):
        raise AssertionError("the guard is off")

    for off in (dict(OPTS, model_guard=False), dict(OPTS, model_guard=None)):
        _, report = build(sm.conv1x1(), "llvm", plan_timer=timer, **off)
        assert report.rewritten and report.model_guard is None
        assert "model guard" not in report.compile_profile.seconds
    assert guard_line(report) == ""


def test_no_rewrite_builds_nothing_more():
    def timer(_runs):
        raise AssertionError("nothing was rewritten")

    _, report = build(sm.conv1x1(), "llvm", plan_timer=timer,
                      **dict(OPTS, targets=("relax.matmul",)))
    assert not report.decisions and report.model_guard is None
    assert "model guard" not in report.compile_profile.seconds


def test_where_the_guard_runs():
    assert model_guard_on(OllieConfig(target=tvm.target.Target("llvm")))
    assert not model_guard_on(OllieConfig(target=tvm.target.Target("llvm"),
                                          calibration=sm.LLVM_CALIB))
    assert model_guard_on(OllieConfig(target=tvm.target.Target("llvm"),
                                      calibration=sm.LLVM_CALIB, model_guard=True))
    assert not model_guard_on(OllieConfig(target=tvm.target.Target("llvm"), rpc=object(),
                                          model_guard=True))
    if not tvm.cuda(0).exist:
        assert not model_guard_on(OllieConfig(target=tvm.target.Target("cuda"),
                                              model_guard=True))
    assert OllieConfig.from_dict({"ollie.model_guard": False}).model_guard is False
    with pytest.raises(ConfigError, match="model_guard"):
        OllieConfig(model_guard=1)


def test_compile_flag_turns_the_guard_off_and_the_summary_names_the_kept_build(
        monkeypatch, tmp_path, capsys):
    from tvm_ollie import cli  # pylint: disable=import-outside-toplevel

    seen = []

    class Executable:  # pylint: disable=too-few-public-methods
        def export_library(self, path):
            with open(path, "wb") as f:
                f.write(b"lib")

    def fake_build(_mod, config=None):
        seen.append(config.model_guard)
        guard = GuardReport([PlanOutcome("rewritten", 2e-3), PlanOutcome("original", 1e-3)],
                            winner="original")
        return Executable(), OptimizeReport(target="llvm", model_guard=guard)

    monkeypatch.setattr(cli, "_load", lambda _args: sm.conv1x1())
    monkeypatch.setattr(cli, "build", fake_build)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["compile", "m.json", "-o", "m.so"]) == 0
    assert "whole-model guard: kept original (rewritten 2.000 ms, original 1.000 ms)" in \
        capsys.readouterr().out
    assert cli.main(["compile", "m.json", "-o", "m.so", "--no-model-guard"]) == 0
    assert seen == [None, False]


def test_reverting_covers_regions_and_folded_epilogues():
    report = OptimizeReport(
        decisions=[OpDecision("main", "y", "relax.nn.conv2d", "sig", chosen="matmul[...]",
                              explain="rules", before_s=2.0, after_s=1.0)],
        regions=[RegionDecision("main", "r", "conv2d, add", "e", chosen="matmul[...]",
                                before_s=3.0, after_s=1.5)],
        epilogues={"conv": 1})
    _revert(report, "why")
    assert not report.rewritten and not any(r.rewritten for r in report.regions)
    assert [(u.after_s, u.reason, u.explain) for u in report.decisions + report.regions] == \
        [(2.0, "why", ""), (3.0, "why", "")]
    assert report.epilogues == {}


def _fake_protocol(seconds, seen):
    """Stands for the guard's default timing protocol (:func:`~.guard.alternating`)."""
    def alternating(runs, **_kw):
        seen.append(sorted(runs))
        return {name: seconds[name] for name in runs}

    return alternating


@pytest.mark.parametrize("winner", ["rewritten", "original"])
def test_the_verdict_is_kept_per_machine_and_the_loser_not_built_again(tmp_path, monkeypatch,
                                                                       winner):
    """A build in a fresh work dir on the same machine (the per-user cache kept) reads the
    guard's verdict back and builds only the module it kept."""
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["alternating"])
    seen = []
    seconds = {"rewritten": 1e-3, "original": 2e-3}
    if winner == "original":
        seconds = {"rewritten": 2e-3, "original": 1e-3}
    monkeypatch.setattr(build_mod, "alternating", _fake_protocol(seconds, seen))
    mod = sm.conv1x1()
    _, first = build(mod, "llvm", work_dir=str(tmp_path / "a"), **OPTS)
    assert seen == [["original", "rewritten"]] and first.model_guard.winner == winner

    def refused(*_args, **_kwargs):
        raise AssertionError("the guard built and timed again")

    built = []
    real = build_mod._compile_final  # pylint: disable=protected-access

    def compile_final(module, *args):
        built.append("original" if module is mod else "rewritten")
        return real(module, *args)

    monkeypatch.setattr(build_mod, "guard_plans", refused)
    monkeypatch.setattr(build_mod, "_compile_final", compile_final)
    ex, again = build(mod, "llvm", work_dir=str(tmp_path / "b"), **OPTS)
    assert built == [winner] and again.model_guard.winner == winner
    assert again.model_guard.times() == first.model_guard.times()
    assert any("per-machine cache" in note for note in again.model_guard.notes)
    assert again.decisions[0].rewritten == (winner == "rewritten")
    assert [d.reason for d in again.decisions] == [d.reason for d in first.decisions]
    _check_equals_tvm(ex, mod)


def test_a_test_timer_or_an_empty_cache_dir_keeps_nothing_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path / "cache"))
    build(sm.conv1x1(), "llvm", plan_timer=_timer({"rewritten": 1e-3, "original": 2e-3}),
          **OPTS)
    stored = [p.read_text() for p in (tmp_path / "cache" / "machine").iterdir()]
    assert stored and not any('\\"what\\": \\"model guard\\"' in text for text in stored)
    assert all('\\"what\\": \\"unit decisions\\"' in text for text in stored)
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", "")
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["alternating"])
    seen = []
    monkeypatch.setattr(build_mod, "alternating",
                        _fake_protocol({"rewritten": 1e-3, "original": 2e-3}, seen))
    for _ in range(2):
        build(sm.conv1x1(), "llvm", **OPTS)
    assert len(seen) == 2


# ---------------------------------------------------------------------------------------------
# The library plan (OllieConfig.library_plan): every operator on the native library, blocked
# layouts, timed whole beside the rewritten module and the original.

#: conv_stack with the library on: under the fixed calibration the pass derives programs for
#: some of its convolutions, so the library plan differs from the rewritten module
LIB_OPTS = dict(OPTS, library=None)
needs_library = pytest.mark.skipif(not native.available(), reason="no native library")


@needs_library
def test_a_faster_library_plan_is_kept_and_reported():
    timer = _timer({"rewritten": 2e-3, "original": 3e-3, "library": 1e-3})
    mod = sm.conv_stack()
    ex, report = build(mod, "llvm", plan_timer=timer, **LIB_OPTS)
    assert timer.seen == [["library", "original", "rewritten"]]
    assert report.model_guard.winner == "library"
    assert all(d.impl == "native" and d.reason.endswith("the library plan kept")
               for d in report.decisions), [(d.chosen, d.reason) for d in report.decisions]
    assert report.layouts is not None and report.layouts.chains
    assert "tvm_ollie.cpu.conv2d" in ex.as_text()
    _check_equals_tvm(ex, mod)


@needs_library
@pytest.mark.parametrize("seconds,winner", [
    ({"rewritten": 2e-3, "original": 1e-3, "library": 1e-3}, "original"),  # a tie: simplest
    ({"rewritten": 1e-3, "original": 2e-3, "library": 2e-3}, "rewritten"),
])
def test_the_library_plan_loses_to_a_plan_separated_faster_or_tied_with_the_original(
        seconds, winner):
    _, report = build(sm.conv_stack(), "llvm", plan_timer=_timer(seconds), **LIB_OPTS)
    assert report.model_guard.winner == winner
    assert not any("library plan kept" in d.reason for d in report.decisions)


@needs_library
def test_a_tie_of_the_library_plan_and_the_rewritten_module_keeps_the_library_plan():
    """MODEL_PREFERENCE: the library plan, fixed by a rule, before the rewritten module, the
    outcome of every unit's timed decision (the same in every build where they tie)."""
    timer = _timer({"rewritten": 1e-3, "original": 2e-3, "library": 1e-3})
    _, report = build(sm.conv_stack(), "llvm", plan_timer=timer, **LIB_OPTS)
    assert report.model_guard.winner == "library" and not report.model_guard.comparison.separated
    assert all(d.reason.endswith("a tie keeps the library plan); the library plan kept")
               for d in report.rewritten), [d.reason for d in report.decisions]
    assert MODEL_PREFERENCE.index("library") < MODEL_PREFERENCE.index("rewritten")


@needs_library
@pytest.mark.parametrize("off", [dict(library_plan=False), dict(library=False),
                                 dict(chooser=lambda _sig, _alts: None)])
def test_no_library_plan_when_off_or_the_caller_decides(off):
    timer = _timer({"rewritten": 1e-3, "original": 2e-3, "library": 1e-4})
    build(sm.conv_stack(), "llvm", plan_timer=timer, **dict(LIB_OPTS, **off))
    assert all("library" not in plans for plans in timer.seen), timer.seen


@needs_library
def test_a_kept_library_plan_is_read_back_per_machine_and_built_alone(tmp_path, monkeypatch):
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["alternating"])
    seen = []
    monkeypatch.setattr(build_mod, "alternating", _fake_protocol(
        {"rewritten": 2e-3, "original": 3e-3, "library": 1e-3}, seen))
    mod = sm.conv_stack()
    _, first = build(mod, "llvm", work_dir=str(tmp_path / "a"), **LIB_OPTS)
    assert seen == [["library", "original", "rewritten"]] and first.model_guard.winner == "library"

    def refused(*_args, **_kwargs):
        raise AssertionError("the guard built and timed again")

    built = []
    real = build_mod._compile_final  # pylint: disable=protected-access

    def compile_final(module, *args):
        built.append(module)
        return real(module, *args)

    monkeypatch.setattr(build_mod, "guard_plans", refused)
    monkeypatch.setattr(build_mod, "_compile_final", compile_final)
    ex, again = build(mod, "llvm", work_dir=str(tmp_path / "b"), **LIB_OPTS)
    assert len(built) == 1 and again.model_guard.winner == "library"
    assert [d.reason for d in again.decisions] == [d.reason for d in first.decisions]
    assert any("per-machine cache" in note for note in again.model_guard.notes)
    _check_equals_tvm(ex, mod)


#: The whole-model guard's samples (ms) of Longformer quick's second of three fresh builds
#: (weights as parameters, load 5, /tmp/stab/p1, 2026-12-03 17:05 UTC): the rewritten module
#: and the library plan tied, and the tie kept this build's own rewritten module; the three
#: builds wrote three rewritten modules and one library plan.
LONGFORMER_GUARD = {
    "rewritten": [131.602, 24.009, 11.271, 69.659, 2.332, 1.854, 10.861, 10.476, 9.977, 14.671,
                  15.217, 2.369, 25.389, 2.11, 9.867],
    "library": [162.604, 2.424, 35.09, 50.486, 35.644, 11.03, 2.682, 2.508, 42.677, 11.229,
                70.681, 56.308, 27.307, 2.606, 97.787],
    "original": [255.942, 220.755, 193.512, 63.96, 63.713, 73.42, 34.308, 205.652, 58.748,
                 75.495, 175.688, 93.515, 69.761, 99.895, 35.278],
}


def test_the_recorded_longformer_tie_now_keeps_the_library_plan():
    """Reproduction from a recorded work dir: the same samples, judged as the guard judges
    them (the first quartile, GUARD_MARGIN), keep the library plan under MODEL_PREFERENCE and
    the build's own rewritten module under the old order."""
    timings = {n: Timing(n, [s * 1e-3 for s in xs], quantile=GUARD_TIMING["quantile"])
               for n, xs in LONGFORMER_GUARD.items()}
    winner, _, separated, tied, _ = judge(timings, MODEL_PREFERENCE, GUARD_MARGIN)
    assert not separated and set(tied) == {"rewritten", "library"} and winner == "library"
    old = judge(timings, ("original", "rewritten", "library"), GUARD_MARGIN)
    assert old[0] == "rewritten"
