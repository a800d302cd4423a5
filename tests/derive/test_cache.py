"""The derivation cache: keys, hits and misses, text form, concurrency, corruption, eviction."""

import json
import multiprocessing
import os
import stat
import threading

import numpy as np
import pytest

from tvm_ollie.derive import cache as dcache
from tvm_ollie.derive.cache import DerivationCache, rules_version, user_cache_dir
from tvm_ollie.derive.search import derive
from tvm_ollie.ir.interp import evaluate
from tvm_ollie.ir.nodes import input_tensors
from tvm_ollie.ir.parser import parse
from tvm_ollie.ir.printer import to_text

CONV = ("L<n:0:1, h:0:6, w:0:6, f:0:8> Σ<c:0:8, r:0:3, s:0:3> "
        "{ A<pad=[0, 1, 1, 0]>[n, h + r - 1, w + s - 1, c] * K[r, s, f, c] } "
        "where A: float32[1, 6, 6, 8]; K: float32[3, 3, 8, 8]")
LIMITS = dict(max_depth=2, targets=("matmul", "conv2d"), max_states=None)


@pytest.fixture(scope="module")
def found():
    """A real search result: the lifted-like conv and its programs."""
    expr = parse(CONV)
    res = derive(expr, max_depth=2, search_time_s=3.0, verify=False)
    progs = [p for p in res.candidates if not p.multi]
    assert progs
    return expr, progs


def _entries(folder):
    return sorted(f for f in os.listdir(folder) if f.endswith(".json"))


def test_hit_returns_the_same_programs(tmp_path, found):
    expr, progs = found
    cache = DerivationCache([str(tmp_path)])
    assert cache.get(expr, LIMITS) is None and cache.misses == 1
    assert cache.put(expr, LIMITS, progs, "exhausted", 10.0)
    hit = DerivationCache([str(tmp_path)]).get(expr, LIMITS)
    assert hit is not None and hit.stop == "exhausted" and hit.budget_s == 10.0
    assert [repr(p) for p in hit.programs] == [repr(p) for p in progs]
    for a, b in zip(progs, hit.programs):  # node for node (nodes are hash-consed)
        assert all(x.expr is y.expr and x.attrs == y.attrs for x, y in zip(a.stages, b.stages))
        assert a.original is b.original and a.derived is b.derived
        assert a.explain() == b.explain()


def test_printer_text_round_trips_the_programs(found):
    # the alternative form the brief asked to check: parse(print(e)) is e for these programs
    _, progs = found
    for prog in progs:
        for s in prog.stages:
            assert parse(to_text(s.expr)) is s.expr


def test_other_tensor_names_share_the_entry(tmp_path, found):
    expr, progs = found
    cache = DerivationCache([str(tmp_path)])
    cache.put(expr, LIMITS, progs)
    renamed = parse(CONV.replace("A", "x_in").replace("K", "w0"))
    hit = cache.get(renamed, LIMITS)
    assert hit is not None
    for prog in hit.programs:  # over this expression's names
        assert {t.name for t in input_tensors(prog.original)} == {"x_in", "w0"}
    rng = np.random.default_rng(0)
    feed = {"x_in": rng.standard_normal((1, 6, 6, 8)).astype("float32"),
            "w0": rng.standard_normal((3, 3, 8, 8)).astype("float32")}
    ref = evaluate(renamed, feed)
    for prog in hit.programs:
        np.testing.assert_allclose(prog.evaluate(feed), ref, rtol=1e-4, atol=1e-4)


def test_changed_rule_version_or_limits_miss(tmp_path, found):
    expr, progs = found
    DerivationCache([str(tmp_path)], version="rules-a").put(expr, LIMITS, progs)
    assert DerivationCache([str(tmp_path)], version="rules-a").get(expr, LIMITS) is not None
    assert DerivationCache([str(tmp_path)], version="rules-b").get(expr, LIMITS) is None
    other = dict(LIMITS, max_depth=3)
    assert DerivationCache([str(tmp_path)], version="rules-a").get(expr, other) is None
    shapes = parse(CONV.replace("f:0:8", "f:0:4").replace("3, 3, 8, 8", "3, 3, 4, 8"))
    assert DerivationCache([str(tmp_path)], version="rules-a").get(shapes, LIMITS) is None


def test_rules_version_follows_the_source():
    version = rules_version()
    assert version == rules_version() and len(version) == 16


def test_concurrent_writers_leave_one_whole_entry(tmp_path, found):
    expr, progs = found
    errors = []

    def write():
        try:
            for _ in range(5):
                DerivationCache([str(tmp_path)]).put(expr, LIMITS, progs)
        except Exception as err:  # pylint: disable=broad-except
            errors.append(err)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(_entries(tmp_path)) == 1 and not [f for f in os.listdir(tmp_path)
                                                 if f.startswith(".tmp-")]
    assert DerivationCache([str(tmp_path)]).get(expr, LIMITS) is not None


def _put_in_process(folder):
    expr = parse(CONV)
    res = derive(expr, max_depth=2, search_time_s=3.0, verify=False)
    for _ in range(3):
        DerivationCache([folder]).put(expr, LIMITS, [p for p in res.candidates if not p.multi])


@pytest.mark.slow
def test_concurrent_processes(tmp_path, found):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_put_in_process, args=(str(tmp_path),)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(_entries(tmp_path)) == 1
    assert DerivationCache([str(tmp_path)]).get(found[0], LIMITS) is not None


@pytest.mark.parametrize("damage", ["truncate", "garbage", "bad node"])
def test_corrupt_entry_warns_once_and_is_rebuilt(tmp_path, found, damage, monkeypatch,
                                                 stand_in_log):
    expr, progs = found
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    cache = DerivationCache([str(tmp_path)])
    cache.put(expr, LIMITS, progs)
    (name,) = _entries(tmp_path)
    path = tmp_path / name
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00\xff not json")
    else:
        entry = json.loads(text)
        entry["nodes"][0][0] = "Nope"
        path.write_text(json.dumps(entry))
    assert cache.get(expr, LIMITS) is None
    assert cache.get(expr, LIMITS) is None  # (removed: a plain miss now, no second warning)
    assert sum("corrupt" in line for line in stand_in_log.lines) == 1
    assert cache.put(expr, LIMITS, progs)  # the next search writes it again
    assert cache.get(expr, LIMITS) is not None


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="root writes into read-only directories")
def test_unwritable_directory_is_skipped(tmp_path, found, monkeypatch, stand_in_log):
    expr, progs = found
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        cache = DerivationCache([str(ro)])
        assert not cache.put(expr, LIMITS, progs)
        assert cache.get(expr, LIMITS) is None
        assert any("not writable" in line for line in stand_in_log.lines)
    finally:
        ro.chmod(stat.S_IRWXU)


def test_directory_under_a_file_is_skipped(tmp_path, found, monkeypatch, stand_in_log):
    # (unwritable for root too: a directory cannot be made under a regular file)
    expr, progs = found
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    blocker = tmp_path / "file"
    blocker.write_text("")
    good = tmp_path / "good"
    cache = DerivationCache([str(blocker / "cache"), str(good)])
    assert cache.put(expr, LIMITS, progs)  # the writable one still gets it
    assert _entries(good) and cache.get(expr, LIMITS) is not None
    assert sum("not writable" in line for line in stand_in_log.lines) == 1


def test_least_recently_used_entries_are_evicted(tmp_path, found):
    expr, progs = found
    cache = DerivationCache([str(tmp_path)])
    cache.put(expr, LIMITS, progs)
    size = os.path.getsize(tmp_path / _entries(tmp_path)[0])
    os.utime(tmp_path / _entries(tmp_path)[0], (1, 1))  # the first entry: the least recent
    small = DerivationCache([str(tmp_path)], max_bytes=int(size * 2.5))
    for depth in (3, 4):
        small.put(expr, dict(LIMITS, max_depth=depth), progs)
    assert len(_entries(tmp_path)) == 2
    assert small.get(expr, LIMITS) is None  # the oldest went first
    assert small.get(expr, dict(LIMITS, max_depth=4)) is not None


def test_user_directory_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    assert user_cache_dir() == os.path.join(str(tmp_path), "derivations")
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", "")
    assert user_cache_dir() is None
    assert DerivationCache.for_run(None).dirs == []
    assert DerivationCache.for_run(str(tmp_path)).dirs == [str(tmp_path / "derivations")]
    monkeypatch.delenv("TVM_OLLIE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == str(tmp_path / "xdg" / "tvm_ollie" / "derivations")
