"""The pass with the derivation cache: a second compile does no search, a model sharing a
signature reuses it, cached programs are still checked, a broken cache never fails a compile."""

import logging
import os

import pytest
import tvm
from tvm import relax

import small_models as sm
from tvm_ollie.derive import cache as dcache
from tvm_ollie.derive import search as dsearch
from tvm_ollie.transform import optimize_module

OPTS = dict(max_depth=2, search_time_s=4.0, calibration=sm.LLVM_CALIB, region_calls=1)

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


@pytest.fixture(autouse=True)
def _no_remembered_decisions(monkeypatch):
    """These tests are about the caches a decision is computed from: with the decisions
    remembered per machine (:mod:`tvm_ollie.transform.remembered`), a second compile would read
    the decision back before asking them. ``TVM_OLLIE_REMEASURE`` turns those reads off."""
    monkeypatch.setenv("TVM_OLLIE_REMEASURE", "1")


def _no_search(monkeypatch):
    """Make any derivation search fail the test."""

    def fail(*_args, **_kwargs):
        raise AssertionError("searched although the derivation was cached")

    monkeypatch.setattr(dsearch, "derive", fail)


def test_second_optimize_does_no_search(monkeypatch):
    mod = sm.conv3x3()
    _, first = optimize_module(mod, "llvm", **OPTS)
    assert first.derivations == {"cached": 0, "searched": 1}
    (d1,) = first.decisions
    assert d1.rewritten and first.search_s > 0
    _no_search(monkeypatch)
    _, second = optimize_module(mod, "llvm", **OPTS)
    assert second.derivations == {"cached": 1, "searched": 0} and second.search_s == 0
    (d2,) = second.decisions
    assert d2.chosen == d1.chosen and d2.candidates == d1.candidates
    text = second.to_text()
    assert "derivations: 1 cached, 0 searched" in text and "compile profile:" in text
    assert "search " not in second.compile_profile.seconds  # (no search stage entered)


def test_model_sharing_a_signature_reuses_it(monkeypatch):
    optimize_module(sm.conv3x3(), "llvm", **OPTS)
    _no_search(monkeypatch)
    other = sm._module([sm._var("inp", (1, 8, 8, 8)), sm._var("kern", (16, 8, 3, 3))],
                       lambda bb, x, w: relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
    new, report = optimize_module(other, "llvm", **OPTS)
    assert report.derivations["cached"] == 1 and not report.derivations["searched"]
    (d,) = report.decisions
    assert d.rewritten
    args = sm.random_inputs(other)
    sm.assert_close(sm.run(tvm.compile(new, "llvm"), args),
                    sm.run(tvm.compile(other, "llvm"), args))


def test_cached_programs_are_still_checked(monkeypatch):
    mod = sm.conv3x3()
    optimize_module(mod, "llvm", **OPTS)
    _no_search(monkeypatch)
    calls = []

    def reject(_ref, _cand):
        calls.append(1)
        return False, "forced failure"

    _, report = optimize_module(mod, "llvm", checker=reject, **OPTS)
    (d,) = report.decisions
    assert report.derivations["cached"] == 1
    assert calls and d.chosen == "original"


def test_turned_off_searches_every_time():
    from tvm_ollie.config import OllieConfig  # pylint: disable=import-outside-toplevel

    cfg = OllieConfig(target="llvm", derivation_cache=False, max_depth=2, search_time_s=4.0,
                      calibration=sm.LLVM_CALIB, region_calls=1)
    for _ in range(2):
        _, report = optimize_module(sm.conv3x3(), config=cfg)
        assert report.derivations == {"cached": 0, "searched": 1}


def test_empty_cache_variable_turns_the_user_cache_off(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", "")
    mod = sm.conv3x3()
    optimize_module(mod, "llvm", **OPTS)
    _, report = optimize_module(mod, "llvm", **OPTS)
    assert report.derivations == {"cached": 0, "searched": 1}
    # a work dir still keeps them
    optimize_module(mod, "llvm", work_dir=str(tmp_path), **OPTS)
    _, report = optimize_module(mod, "llvm", work_dir=str(tmp_path), **OPTS)
    assert report.derivations == {"cached": 1, "searched": 0}
    assert os.listdir(tmp_path / "derivations")


def test_unwritable_cache_never_fails_a_compile(monkeypatch, tmp_path, stand_in_log):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    mod = sm.conv3x3()
    for _ in range(2):
        _, report = optimize_module(mod, "llvm", **OPTS)
        (d,) = report.decisions
        assert d.rewritten and report.derivations == {"cached": 0, "searched": 1}
    for cache in ("derivation cache", "verification cache"):  # one warning for each
        assert sum(cache in line and "not writable" in line for line in stand_in_log.lines) == 1


@pytest.mark.slow
def test_build_profile_has_the_stages():
    from tvm_ollie.transform import build  # pylint: disable=import-outside-toplevel

    _, report = build(sm.conv3x3(), "llvm", **OPTS)
    stages = report.compile_profile.seconds
    assert {"regions", "lift", "search", "verify", "emit", "tvm build"} <= set(stages)
    assert sum(stages.values()) <= report.compile_profile.total_s + 1e-6
