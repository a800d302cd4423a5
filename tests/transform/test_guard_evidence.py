"""The whole-model guard's recorded verdict: reused when its evidence holds or when timing it
now could not do better (a verdict timed under load, read back while the machine is still
loaded), and then only the plan it kept is built; timed again when recorded without its
conditions, timed under load and the machine quiet now, noisy once, for changed plans, a
corrupt record file, or when asked (``TVM_OLLIE_REMEASURE``). A fake plan timer (the protocol
on fixed samples) and a fake load probe stand for the machine."""

import json

import pytest
import tvm

import small_models as sm
from tvm_ollie.frontend.explain import guard_line
from tvm_ollie.pipeline import build
from tvm_ollie.tune.compare import compare

#: as tests/transform/test_model_guard.py: conv1x1 is rewritten at once
OPTS = dict(max_depth=2, search_time_s=1.0, calibration=sm.LLVM_CALIB, library=False,
            model_guard=True)


def _protocol_timer(samples):
    """A plan timer: the guard's protocol (15 rounds, first quartile) on ``samples[plan]``;
    counts its calls."""

    def timer(runs):
        timer.calls += 1
        feeds = {name: iter(samples[name]) for name in runs}
        return compare({n: (lambda it=it: next(it)) for n, it in feeds.items()},
                       ["original", "rewritten"], 0.03, min_rounds=15, max_rounds=15,
                       quantile=0.25)

    timer.calls = 0
    return timer


QUIET = {"rewritten": [1e-3 * (1 + 0.01 * (i % 4)) for i in range(15)],
         "original": [2e-3 * (1 + 0.01 * (i % 3)) for i in range(15)]}
#: Candy's case: the original timed faster under load, the rounds all over the place
LOADED = {"rewritten": [(40e-3 if i % 2 else 8e-3) for i in range(15)],
          "original": [(22e-3 if i % 3 else 4e-3) for i in range(15)]}


@pytest.fixture(name="load")
def _load(monkeypatch):
    """The load average the guard sees: ``load.value``."""
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["machine_load"])

    class Load:
        value = 0.5

    monkeypatch.setattr(build_mod, "machine_load", lambda: Load.value)
    return Load


def test_a_verdict_timed_under_load_is_timed_again(tmp_path, load):
    load.value = 6.0
    first = _protocol_timer(LOADED)
    _, report = build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    assert first.calls == 1 and report.model_guard.winner == "original"
    load.value = 0.5
    quiet = _protocol_timer(QUIET)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=quiet, work_dir=str(tmp_path), **OPTS)
    assert quiet.calls == 1 and again.model_guard.winner == "rewritten"
    assert any("timed again" in n and "loaded" in n for n in again.model_guard.notes)
    third = _protocol_timer(LOADED)  # the quiet verdict is kept: nothing timed
    _, kept = build(sm.conv1x1(), "llvm", plan_timer=third, work_dir=str(tmp_path), **OPTS)
    assert third.calls == 0 and kept.model_guard.winner == "rewritten"
    assert any("read back" in n for n in kept.model_guard.notes)


def test_noisy_rounds_are_timed_again_even_on_a_quiet_machine(tmp_path, load):
    load.value = 0.5
    first = _protocol_timer(LOADED)
    build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    second = _protocol_timer(QUIET)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 1 and again.model_guard.winner == "rewritten"
    assert any("noisy" in n for n in again.model_guard.notes)


def test_one_outlier_does_not_flip_or_retime_the_verdict(tmp_path, load):
    load.value = 0.5
    outlier = dict(QUIET, rewritten=list(QUIET["rewritten"]))
    outlier["rewritten"][5] = 0.1
    first = _protocol_timer(outlier)
    _, report = build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    assert report.model_guard.winner == "rewritten"
    second = _protocol_timer(LOADED)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 0 and again.model_guard.winner == "rewritten"


def test_a_near_tie_keeps_the_original_and_is_reused(tmp_path, load):
    load.value = 0.5
    near = {"original": [1.00e-3 + 1e-6 * (i % 5) for i in range(15)],
            "rewritten": [0.99e-3 + 1e-6 * (i % 5) for i in range(15)]}
    first = _protocol_timer(near)
    _, report = build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    guard = report.model_guard
    assert guard.winner == "original" and not guard.comparison.separated
    assert "a tie keeps the original" in report.decisions[0].reason
    second = _protocol_timer(QUIET)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 0 and again.model_guard.winner == "original"


def test_a_verdict_recorded_without_evidence_is_timed_again(tmp_path, load):
    load.value = 0.5
    first = _protocol_timer(QUIET)
    build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    records = tmp_path / "ollie_decisions.json"
    data = json.loads(records.read_text())
    for entry in (data.get("entries", data) if isinstance(data, dict) else {}).values():
        if isinstance(entry, dict):
            entry.pop("evidence", None)
    records.write_text(json.dumps(data))
    assert "evidence" not in records.read_text()
    second = _protocol_timer(QUIET)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 1
    assert any("unrecorded" in n for n in again.model_guard.notes)


def test_the_per_machine_cache_does_not_skip_builds_on_a_loaded_verdict(tmp_path, monkeypatch,
                                                                        load):
    """A verdict kept per machine lets a later build skip the losing plan's build only when it
    was timed without doubt; one timed under load makes the next build compare again."""
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["alternating"])
    timer = _protocol_timer(QUIET)
    monkeypatch.setattr(build_mod, "alternating", lambda runs, **_kw: timer(runs))
    load.value = 6.0
    _, first = build(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "a"), **OPTS)
    assert timer.calls == 1 and first.model_guard.winner == "rewritten"
    load.value = 0.5
    _, again = build(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "b"), **OPTS)
    assert timer.calls == 2  # not read back from the per-machine cache
    _, third = build(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "c"), **OPTS)
    assert timer.calls == 2 and third.model_guard.winner == "rewritten"
    assert any("per-machine cache" in n for n in third.model_guard.notes)


def _refuse_guard_and_count_builds(monkeypatch, mod):
    """The guard's plans must not be built or timed; returns the list of modules built
    (``"original"`` or ``"rewritten"``)."""
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["guard_plans"])

    def refused(*_args, **_kwargs):
        raise AssertionError("the guard built and timed again")

    built = []
    real = build_mod._compile_final  # pylint: disable=protected-access

    def compile_final(module, *args):
        built.append("original" if module is mod else "rewritten")
        return real(module, *args)

    monkeypatch.setattr(build_mod, "guard_plans", refused)
    monkeypatch.setattr(build_mod, "_compile_final", compile_final)
    return built


def test_a_loaded_verdict_is_read_back_while_loaded_and_only_the_kept_plan_built(
        tmp_path, monkeypatch, load):
    load.value = 6.0
    first = _protocol_timer(QUIET)
    mod = sm.conv1x1()
    _, report = build(mod, "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    assert first.calls == 1 and report.model_guard.winner == "rewritten"
    built = _refuse_guard_and_count_builds(monkeypatch, mod)
    again_timer = _protocol_timer(LOADED)
    _, again = build(mod, "llvm", plan_timer=again_timer, work_dir=str(tmp_path), **OPTS)
    assert again_timer.calls == 0 and built == ["rewritten"]
    assert again.model_guard.winner == "rewritten"
    assert again.model_guard.times() == report.model_guard.times()
    notes = " ".join(again.model_guard.notes)
    assert "read back from work_dir/ollie_decisions.json" in notes
    assert "reused with its doubts (loaded" in notes and "original not built" in notes
    assert guard_line(again).endswith("; verdict read back from work_dir/ollie_decisions.json)")


def test_a_forced_retiming_times_a_recorded_verdict_again(tmp_path, monkeypatch, load):
    load.value = 0.5
    first = _protocol_timer(QUIET)
    build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    monkeypatch.setenv("TVM_OLLIE_REMEASURE", "model guard")
    second = _protocol_timer(LOADED)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 1 and again.model_guard.winner == "original"
    monkeypatch.delenv("TVM_OLLIE_REMEASURE")
    third = _protocol_timer(QUIET)  # the new verdict replaced the old one (it is noisy:
    load.value = 6.0                # kept while the machine is loaded)
    _, kept = build(sm.conv1x1(), "llvm", plan_timer=third, work_dir=str(tmp_path), **OPTS)
    assert third.calls == 0 and kept.model_guard.winner == "original"


def test_a_changed_plan_is_timed_again(tmp_path, monkeypatch, load):
    load.value = 0.5
    first = _protocol_timer(QUIET)
    build(sm.conv1x1(), "llvm", plan_timer=first, work_dir=str(tmp_path), **OPTS)
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["optimize_module"])
    real = build_mod.optimize_module

    def changed(mod, **kwargs):  # the same decisions, one more (unused) function
        new_mod, report = real(mod, **kwargs)
        extra = sm.conv1x1()["main"].with_attr("global_symbol", "unused")
        return tvm.IRModule({**{gv: f for gv, f in new_mod.functions.items()},
                             tvm.ir.GlobalVar("unused"): extra}), report

    monkeypatch.setattr(build_mod, "optimize_module", changed)
    second = _protocol_timer(QUIET)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 1 and again.model_guard.winner == "rewritten"
    assert not any("read back" in n for n in again.model_guard.notes)


def test_a_corrupt_record_file_is_ignored_with_one_warning(tmp_path, load, stand_in_log,
                                                           monkeypatch):
    workdir = __import__("tvm_ollie.tune.workdir", fromlist=["LOG"])
    monkeypatch.setattr(workdir, "LOG", stand_in_log)
    load.value = 0.5
    build(sm.conv1x1(), "llvm", plan_timer=_protocol_timer(QUIET), work_dir=str(tmp_path),
          **OPTS)
    (tmp_path / "ollie_decisions.json").write_text('{"cut short": ')
    second = _protocol_timer(QUIET)
    _, again = build(sm.conv1x1(), "llvm", plan_timer=second, work_dir=str(tmp_path), **OPTS)
    assert second.calls == 1 and again.model_guard.winner == "rewritten"
    assert sum("ollie_decisions.json" in line for line in stand_in_log.lines) == 1
    assert json.loads((tmp_path / "ollie_decisions.json").read_text())  # written whole again


def test_an_unwritable_cache_keeps_the_verdict_in_the_work_dir(tmp_path, monkeypatch, load):
    build_mod = __import__("tvm_ollie.pipeline.build", fromlist=["alternating"])
    timer = _protocol_timer(QUIET)
    monkeypatch.setattr(build_mod, "alternating", lambda runs, **_kw: timer(runs))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(blocker))
    load.value = 0.5
    _, first = build(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "w"), **OPTS)
    _, again = build(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "w"), **OPTS)
    assert timer.calls == 1 and again.model_guard.winner == first.model_guard.winner
    assert any("read back from work_dir" in n for n in again.model_guard.notes)
