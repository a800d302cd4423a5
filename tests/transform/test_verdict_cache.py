"""The verification cache: a PASS under an identical key skips the check, anything else checks
again; a broken cache never fails a compile."""

import logging
import os

import pytest

import small_models as sm
from tvm_ollie.derive import cache as dcache
from tvm_ollie.transform import checking, optimize_module
from tvm_ollie.transform.alternatives import Candidates
from tvm_ollie.transform.checking import Checker, VerdictCache

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


@pytest.fixture(autouse=True)
def _no_remembered_decisions(monkeypatch):
    """These tests are about the caches a decision is computed from: with the decisions
    remembered per machine (:mod:`tvm_ollie.transform.remembered`), a second compile would read
    the decision back before asking them. ``TVM_OLLIE_REMEASURE`` turns those reads off."""
    monkeypatch.setenv("TVM_OLLIE_REMEASURE", "1")

OPTS = dict(max_depth=2, search_time_s=4.0, calibration=sm.LLVM_CALIB, region_calls=1,
            library=False)


@pytest.fixture(scope="module", name="conv")
def _conv():
    """A conv2d 3x3 call and one derived alternative of it (a matmul form)."""
    call = sm.conv3x3()["main"].body.blocks[0].bindings[0].value
    found = Candidates(library=False, derive=True, max_depth=2)(call, 2.0)
    alt = next(a for a in found.alternatives if a.program is not None)
    return call, alt


@pytest.fixture(name="counted")
def _counted(monkeypatch):
    """The numeric checks run (each appends to the list)."""
    runs = []
    real = checking.numeric_evidence

    def counting(ref, cand, *shared):  # (shared: a decision's merged build, batched.py)
        runs.append(1)
        return real(ref, cand, *shared)

    monkeypatch.setattr(checking, "numeric_evidence", counting)
    return runs


def _cache(folder, target="llvm", version="v1", library="lib1"):
    return VerdictCache([str(folder)], target, version=version, library=library)


def test_pass_is_reused_under_the_same_key(tmp_path, conv, counted):
    call, alt = conv
    first = _cache(tmp_path)
    assert Checker(cache=first).check(call, alt) == (True, "")
    assert counted == [1] and first.stores == 1
    again = _cache(tmp_path)
    assert Checker(cache=again).check(call, alt) == (True, "")
    assert counted == [1] and again.hits == 1


@pytest.mark.parametrize("changed", [dict(library="lib2"), dict(target="cuda"),
                                     dict(version="v2")])
def test_changed_library_target_or_checker_misses(tmp_path, conv, counted, changed):
    call, alt = conv
    Checker(cache=_cache(tmp_path)).check(call, alt)
    other = _cache(tmp_path, **changed)
    assert Checker(cache=other).check(call, alt) == (True, "")
    assert counted == [1, 1] and other.hits == 0


def test_fail_verdict_never_skips_the_check(tmp_path, conv, counted):
    call, alt = conv
    cache = _cache(tmp_path)
    checker = Checker(cache=cache)
    keyed = checker._key(call, alt, checking.unit_module(call),  # pylint: disable=W0212
                         checking.unit_module(call, alt.program, None, alt.impl))
    cache.put(keyed, False, "stored failure", {})
    assert checker.check(call, alt) == (True, "")  # checked again, and it holds
    assert counted == [1] and cache.hits == 0


def test_a_custom_comparison_is_never_cached(tmp_path, conv):
    call, alt = conv
    Checker(cache=_cache(tmp_path)).check(call, alt)
    calls = []

    def differs(_ref, _cand):
        calls.append(1)
        return False, "differs by the fake"

    checker = Checker(differs, cache=_cache(tmp_path))
    assert checker.cache is None
    assert checker.check(call, alt) == (False, "differs by the fake") and calls == [1]


def test_corrupt_entry_is_ignored_with_one_warning(tmp_path, conv, counted, monkeypatch,
                                                    stand_in_log):
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    call, alt = conv
    Checker(cache=_cache(tmp_path)).check(call, alt)
    (entry,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    for _ in range(2):  # (each check writes the entry again)
        with open(tmp_path / entry, "w", encoding="utf-8") as fh:
            fh.write('{"key": ')
        assert Checker(cache=_cache(tmp_path)).check(call, alt) == (True, "")
    assert counted == [1, 1, 1]
    assert sum("corrupt" in line for line in stand_in_log.lines) == 1


def test_unwritable_directory_still_checks(tmp_path, conv, monkeypatch, stand_in_log):
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    call, alt = conv
    for _ in range(2):
        assert Checker(cache=_cache(blocker / "verdicts")).check(call, alt) == (True, "")
    assert sum("not writable" in line for line in stand_in_log.lines) == 1


def test_second_compile_neither_searches_nor_verifies(tmp_path, monkeypatch):
    mod = sm.conv3x3()
    _, first = optimize_module(mod, "llvm", work_dir=str(tmp_path), **OPTS)
    assert os.listdir(tmp_path / "verdicts")

    def fail(*_args, **_kwargs):
        raise AssertionError("checked or searched again")

    monkeypatch.setattr(checking, "numeric_evidence", fail)
    monkeypatch.setattr(checking, "check_exact", fail)
    monkeypatch.setattr("tvm_ollie.transform.alternatives.derive", fail)
    _, second = optimize_module(mod, "llvm", work_dir=str(tmp_path), **OPTS)
    assert second.derivations == {"cached": 1, "searched": 0}
    assert [d.chosen for d in second.decisions] == [d.chosen for d in first.decisions]
    assert second.decisions[0].rewritten
