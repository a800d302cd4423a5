"""The timed decisions' evidence kept per machine (:class:`~tvm_ollie.tune.records.MachineStore`
behind :class:`~tvm_ollie.transform.measuring.DecisionRecords`): a build in a fresh work dir on
the same machine takes the same decisions and times nothing; another thread count, or
``TVM_OLLIE_REMEASURE``, times again; a caller's timer and the tuned timing keep nothing."""

import importlib

import pytest
import tvm_ffi

import small_models as sm
from tvm_ollie.config import OllieConfig
from tvm_ollie.transform import optimize_module
from tvm_ollie.transform.costing import CallableTiming, TunedTiming, UntunedTiming
from tvm_ollie.transform.decide import shared_records
from tvm_ollie.tune.machine import REMEASURE_ENV

measuring = importlib.import_module("tvm_ollie.transform.measuring")

#: conv1x1 under the fixed calibration: its matmul form is shortlisted, so the untuned check
#: times it against the original
OPTS = dict(max_depth=2, search_time_s=1.0, calibration=sm.LLVM_CALIB, library=False,
            check_untuned=True, trials=0)


@pytest.fixture(name="timed")
def _timed(monkeypatch):
    """The decisions timed (each appends its alternatives' labels)."""
    seen = []
    real = measuring.compare

    def compare(samplers, *args, **kwargs):
        seen.append(sorted(samplers))
        return real(samplers, *args, **kwargs)

    monkeypatch.setattr(measuring, "compare", compare)
    return seen


@pytest.fixture(name="steady")
def _steady(monkeypatch):
    """The decisions timed, each alternative taking a fixed time (its place in the samplers,
    1 ms apart): a re-timed decision chooses as the first did, whatever the machine's noise."""
    seen = []
    real = measuring.compare

    def compare(samplers, *args, **kwargs):
        seen.append(sorted(samplers))
        fixed = {name: (lambda s=1e-3 * (1 + i): s) for i, name in enumerate(samplers)}
        return real(fixed, *args, **kwargs)

    monkeypatch.setattr(measuring, "compare", compare)
    return seen


def _decisions(report):
    return [(d.chosen, d.after_s) for d in report.decisions]


def test_a_fresh_work_dir_reads_the_evidence_back(tmp_path, timed):
    _, first = optimize_module(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "a"), **OPTS)
    assert len(timed) == 1
    _, again = optimize_module(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "b"), **OPTS)
    assert len(timed) == 1 and _decisions(again) == _decisions(first)
    _, none = optimize_module(sm.conv1x1(), "llvm", **OPTS)  # no work dir at all
    assert len(timed) == 1 and _decisions(none) == _decisions(first)


@pytest.mark.parametrize("change", ["threads", "remeasure", "cache off"])
def test_another_thread_count_or_a_remeasure_times_again(tmp_path, monkeypatch, timed, change):
    optimize_module(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "a"), **OPTS)
    opts = dict(OPTS)
    if change == "threads":
        monkeypatch.setenv("TVM_NUM_THREADS", "5")
    elif change == "remeasure":
        monkeypatch.setenv(REMEASURE_ENV, "1")
    else:
        opts["derivation_cache"] = False
    optimize_module(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "b"), **opts)
    assert len(timed) == 2


def test_only_this_machines_untuned_timing_is_shared(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    cfg = OllieConfig()
    assert shared_records(UntunedTiming("llvm"), "llvm", cfg) is not None
    assert shared_records(UntunedTiming("llvm"), "llvm", cfg.replace(derivation_cache=False)) \
        is None
    assert shared_records(CallableTiming(lambda _m, _l: 1.0), "llvm", cfg) is None
    assert shared_records(TunedTiming("llvm", None, 4, None), "llvm", cfg) is None
    assert shared_records(None, "llvm", cfg) is None


def test_a_corrupt_record_is_ignored_with_one_warning(tmp_path, monkeypatch, steady,
                                                      stand_in_log):
    dcache = importlib.import_module("tvm_ollie.derive.cache")
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path / "cache"))
    _, first = optimize_module(sm.conv1x1(), "llvm", **OPTS)
    entries = list((tmp_path / "cache" / "machine").iterdir())
    assert len(entries) == 2  # the decision's evidence, the decision
    for _ in range(2):  # (the second time, the entries written again are read back)
        for entry in entries:
            entry.write_text('{"key": ')
        _, again = optimize_module(sm.conv1x1(), "llvm", **OPTS)
        assert [d.chosen for d in again.decisions] == [d.chosen for d in first.decisions]
    assert len(steady) == 3
    warned = [line for line in stand_in_log.lines if "corrupt" in line]
    assert len(warned) == len(entries) == len(set(warned))  # one each


def test_an_unwritable_cache_still_compiles(tmp_path, monkeypatch, timed, stand_in_log):
    dcache = importlib.import_module("tvm_ollie.derive.cache")
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(blocker))
    for _ in range(2):
        _, report = optimize_module(sm.conv1x1(), "llvm", **OPTS)
        assert report.decisions[0].chosen
    assert len(timed) == 2
    warned = [line for line in stand_in_log.lines if "not writable" in line]
    assert len(warned) == len(set(warned)) and any("machine" in line for line in warned)


def test_a_remembered_decision_skips_search_checks_and_timing(tmp_path, monkeypatch, timed):
    """The whole decision read back: nothing derived, checked or timed, the same module."""
    checking = importlib.import_module("tvm_ollie.transform.checking")
    first_mod, first = optimize_module(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "a"),
                                       **OPTS)

    def fail(*_args, **_kwargs):
        raise AssertionError("searched, checked or timed again")

    monkeypatch.setattr(checking, "numeric_evidence", fail)
    monkeypatch.setattr("tvm_ollie.transform.alternatives.derive", fail)
    monkeypatch.setattr("tvm_ollie.transform.decide.DerivationCache.get", fail)
    again_mod, again = optimize_module(sm.conv1x1(), "llvm", work_dir=str(tmp_path / "b"),
                                       **OPTS)
    assert len(timed) == 1 and again.derivations["decided before"] == 1
    assert [(d.chosen, d.reason, d.after_s, d.names) for d in again.decisions] == \
        [(d.chosen, d.reason, d.after_s, d.names) for d in first.decisions]
    assert again.decisions[0].rewritten
    assert tvm_ffi.structural_equal(again_mod, first_mod)
    assert "1 signatures decided before" in again.to_text()


def test_a_given_checker_or_timer_decides_again(monkeypatch):
    taken = _count_decisions(monkeypatch)
    optimize_module(sm.conv1x1(), "llvm", **OPTS)
    optimize_module(sm.conv1x1(), "llvm", timer=lambda _m, _l: 1e-3, **OPTS)
    _, report = optimize_module(sm.conv1x1(), "llvm",
                                checker=lambda _r, _c: (False, "rejected"), **OPTS)
    assert len(taken) == 3 and "decided before" not in report.derivations
    assert not report.decisions[0].rewritten


def _count_decisions(monkeypatch) -> list:
    """The decisions taken (not read back): one entry each (every decision starts with
    ``_prepare``, whether the pass prepared it ahead or decided it at once)."""
    decide = importlib.import_module("tvm_ollie.transform.decide")
    taken = []
    real = decide.Decider._prepare  # pylint: disable=protected-access

    def counted(self, *args):
        taken.append(1)
        return real(self, *args)

    monkeypatch.setattr(decide.Decider, "_prepare", counted)
    return taken


@pytest.mark.parametrize("change", [dict(max_measured=2), dict(max_depth=1),
                                    dict(calibration="other"), dict(search_time_s=2.0)])
def test_another_option_or_calibration_decides_again(monkeypatch, change):
    taken = _count_decisions(monkeypatch)
    optimize_module(sm.conv1x1(), "llvm", **OPTS)
    optimize_module(sm.conv1x1(), "llvm", **OPTS)
    assert taken == [1]
    if change.get("calibration") == "other":
        change = dict(calibration=sm.LLVM_CALIB.with_roof(5e10, 2e10))
    optimize_module(sm.conv1x1(), "llvm", **dict(OPTS, **change))
    assert taken == [1, 1]
