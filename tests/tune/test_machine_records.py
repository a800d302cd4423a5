"""The per-machine store (:mod:`tvm_ollie.tune.records`) and the calibration kept in it: read
back under the same machine key, measured again under another (machine, threads, target) or
with ``TVM_OLLIE_REMEASURE``; a corrupt entry or an unwritable directory never fails."""

import importlib
import os

import pytest

from tvm_ollie.derive import cache as dcache
from tvm_ollie.tune import machine
from tvm_ollie.tune.records import MachineStore

cal = importlib.import_module("tvm_ollie.tune.calibrate")  # (the package exports a function)


@pytest.fixture(name="measured")
def _measured(monkeypatch):
    """The CPU calibration's measurements, faked and counted."""
    runs = []

    def roof():
        runs.append("roof")
        return 1e11, 2e10

    monkeypatch.setattr(cal, "measure_cpu_roofline", roof)
    monkeypatch.setattr(cal, "measure_tvm_efficiency", lambda _t: {"matmul": 0.25})
    monkeypatch.setattr(cal, "measure_native_efficiency", lambda: {"native_matmul": 0.5})
    return runs


def test_machine_key_names_cpu_threads_target_and_versions(monkeypatch):
    monkeypatch.setenv("TVM_NUM_THREADS", "2")
    key = machine.machine_key("llvm -num-cores=2")
    for part in ("cpu=", "TVM_NUM_THREADS=2", "target=llvm -num-cores=2", "tvm=", "native=",
                 f"code={machine.code_version()}"):
        assert part in key, part
    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    assert machine.machine_key("llvm -num-cores=2") != key


def test_calibration_is_measured_once_per_machine(tmp_path, monkeypatch, measured):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    first = cal.calibrate("llvm", cache=True)
    again = cal.calibrate("llvm", cache=True)
    assert measured == ["roof"]
    assert (again.peak_flops, again.bandwidth, again.eff("matmul"),
            again.eff("native_matmul")) == (1e11, 2e10, 0.25, 0.5)
    assert again.efficiency == first.efficiency and "per-machine cache" in again.describe()
    cal.calibrate("llvm")  # without cache: measured, nothing read
    assert measured == ["roof", "roof"]


@pytest.mark.parametrize("change", ["threads", "cpu", "target", "remeasure"])
def test_calibration_misses_on_another_machine_key(tmp_path, monkeypatch, measured, change):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    cal.calibrate("llvm", cache=True)
    target = "llvm"
    if change == "threads":
        monkeypatch.setenv("TVM_NUM_THREADS", "7")
    elif change == "cpu":
        monkeypatch.setattr(machine, "cpu_identity", lambda: "another CPU")
    elif change == "target":
        target = {"kind": "llvm", "num-cores": 7}
    else:
        monkeypatch.setenv(machine.REMEASURE_ENV, "1")
    cal.calibrate(target, cache=True)
    assert measured == ["roof", "roof"]


def test_calibration_is_off_with_an_empty_cache_dir(monkeypatch, measured):
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", "")
    assert MachineStore.for_run("llvm", "calibration") is None
    cal.calibrate("llvm", cache=True)
    cal.calibrate("llvm", cache=True)
    assert measured == ["roof", "roof"]


def test_a_corrupt_calibration_is_ignored_with_one_warning(tmp_path, monkeypatch, measured,
                                                           stand_in_log):
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    cal.calibrate("llvm", cache=True)
    folder = tmp_path / "machine"
    (entry,) = os.listdir(folder)
    for broken in ('{"key": ', None):  # unreadable JSON; then a malformed value
        if broken is None:
            text = (folder / entry).read_text()
            broken = text.replace('"bandwidth": 20000000000.0', '"bandwidth": -1')
            assert broken != text
        (folder / entry).write_text(broken)
        assert cal.calibrate("llvm", cache=True).bandwidth == 2e10
    assert measured == ["roof"] * 3
    assert sum("corrupt" in line for line in stand_in_log.lines) == 1


def test_an_unwritable_cache_still_calibrates(tmp_path, monkeypatch, measured, stand_in_log):
    monkeypatch.setattr(dcache, "LOG", stand_in_log)
    monkeypatch.setattr(dcache, "_WARNED", set())
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(blocker))
    for _ in range(2):
        assert cal.calibrate("llvm", cache=True).peak_flops == 1e11
    assert measured == ["roof", "roof"]
    assert sum("not writable" in line for line in stand_in_log.lines) == 1


def test_store_values_by_machine(tmp_path):
    here = MachineStore("llvm", "decisions", dirs=[str(tmp_path)], machine="m1")
    here.put("k", {"x": 1})
    assert MachineStore("llvm", "decisions", dirs=[str(tmp_path)], machine="m1").get("k") \
        == {"x": 1}
    assert MachineStore("llvm", "decisions", dirs=[str(tmp_path)], machine="m2").get("k") is None
    assert MachineStore("llvm", "other", dirs=[str(tmp_path)], machine="m1").get("k") is None


def test_calibration_keeps_across_unrelated_code(tmp_path, monkeypatch, measured):
    """The calibration's key holds the sources it runs (:func:`~tvm_ollie.tune.machine.
    source_version`), not every source of the package: another change keeps it, a change
    of those sources measures again."""
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path))
    cal.calibrate("llvm", cache=True)
    monkeypatch.setattr(machine, "code_version", lambda: "elsewhere-changed")
    cal.calibrate("llvm", cache=True)
    assert measured == ["roof"]
    monkeypatch.setattr(cal, "source_version", lambda modules: "calibration-changed")
    cal.calibrate("llvm", cache=True)
    assert measured == ["roof", "roof"]


def test_source_version_follows_the_sources_given(tmp_path):
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text("A = 1\n")
    two.write_text("B = 1\n")
    mods = [type("M", (), {"__file__": str(p)}) for p in (one, two)]
    base = machine.source_version(mods)
    assert machine.source_version(list(reversed(mods))) == base
    two.write_text("B = 2\n")
    assert machine.source_version(mods) != base
    assert machine.machine_key("llvm", code="abc").endswith("code=abc")


@pytest.mark.parametrize("single", [True, False])
def test_roof_is_one_blas_thread_times_the_kernels_threads(monkeypatch, single):
    """With OpenBLAS found, the GEMM runs on one BLAS thread (restored after) and the roof is
    its rate times the kernels' threads; otherwise the GEMM on the BLAS's own threads."""
    threads = [4]
    calls = []

    def set_threads(n):
        calls.append(n)
        threads[0] = n

    monkeypatch.setattr(cal, "_openblas_thread_setter",
                        lambda: (set_threads, lambda: threads[0]) if single else None)
    monkeypatch.setattr(cal, "_best_time", lambda fn, repeat: (fn(), 1e-3)[1])
    clocks = []

    def spread(calls_, rounds, repeat, clock):
        clocks.append(clock)
        return {name: (fn(), 1e-3)[1] for name, fn in calls_.items()}

    monkeypatch.setattr(cal, "spread_best", spread)
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert cal.kernel_threads() == 3
    peak, bandwidth = cal.measure_cpu_roofline.__wrapped__(n=16, mib=1, repeat=1)
    rate = 2.0 * 16 ** 3 / 1e-3
    assert peak == pytest.approx(rate * 3 if single else rate) and bandwidth > 0
    assert calls == ([1, 4] if single else []) and threads == [4]
    # one BLAS thread: by its CPU clock (the GEMM runs on the calling thread); else the wall's
    assert clocks == [cal.time.thread_time if single else cal.time.perf_counter]


def test_the_real_blas_roof_restores_its_threads():
    """numpy's OpenBLAS (where it is the BLAS): one thread inside, its count back after."""
    found = cal._openblas_thread_setter()  # pylint: disable=protected-access
    if found is None:
        pytest.skip("numpy's BLAS here is not OpenBLAS")
    before = found[1]()
    with cal._one_blas_thread() as single:  # pylint: disable=protected-access
        assert single and found[1]() == 1
    assert found[1]() == before


def test_tvm_cases_built_in_one_module_are_timed_each():
    from tvm_ollie.compat import relax  # pylint: disable=import-outside-toplevel
    seconds = cal._tvm_seconds_of(  # pylint: disable=protected-access
        {"add": (lambda bb, a, b: relax.op.add(a, b), [(4, 4), (4, 4)]),
         "mm": (lambda bb, a, b: relax.op.matmul(a, b), [(8, 8), (8, 8)])}, "llvm", 1)
    assert set(seconds) == {"add", "mm"} and all(s > 0 for s in seconds.values())



def test_the_kernels_are_timed_together_on_one_thread_by_its_cpu_clock(monkeypatch):
    """The calibration's kernels: all in one spread timing (:mod:`.spread_timing`), on one
    thread (the threads restored after, also on an error), by the calling thread's CPU clock
    where TVM's loops run on the library's OpenMP threads, else by the wall clock."""
    threads = {"n": 2}
    monkeypatch.setattr(cal.native, "load", lambda: True)
    monkeypatch.setattr(cal.native, "get_num_threads", lambda: threads["n"])
    monkeypatch.setattr(cal.native, "set_num_threads", lambda n: threads.update(n=n))
    seen = []

    def spread(calls, clock=None):
        seen.append((sorted(calls), threads["n"], clock))
        return {name: 1e-3 for name in calls}

    monkeypatch.setattr(cal, "spread_best", spread)
    runtime = {"name": "openmp"}
    monkeypatch.setattr(cal.native, "get_parallel_runtime", lambda: runtime["name"])
    out = cal._spread_native({"b": lambda: None, "a": lambda: None})  # pylint: disable=W0212
    assert out == {"a": 1e-3, "b": 1e-3} and threads["n"] == 2
    runtime["name"] = "tvm"
    cal._spread_native({"a": lambda: None})  # pylint: disable=protected-access
    assert seen == [(["a", "b"], 1, cal.time.thread_time), (["a"], 1, cal.time.perf_counter)]

    def failing(calls, clock=None):
        raise RuntimeError("kernel failed")

    monkeypatch.setattr(cal, "spread_best", failing)
    with pytest.raises(RuntimeError):
        cal._spread_native({"a": lambda: None})  # pylint: disable=protected-access
    assert threads["n"] == 2


def test_the_native_efficiencies_are_each_kernels_flops_over_its_seconds(monkeypatch):
    """``measure_native_efficiency``: one spread timing of every case, its flops over its
    seconds over the roof (at most 1)."""
    monkeypatch.setattr(cal.native, "load", lambda: True)
    monkeypatch.setattr(cal, "measure_cpu_roofline", lambda: (1e11, 1e10))
    monkeypatch.setattr(cal, "_native_cases", lambda rng: {
        "native_matmul": (None, 5e7), "native_conv2d": (None, 2e8)})
    monkeypatch.setattr(cal, "_spread_native", lambda calls: {
        "native_matmul": 1e-3, "native_conv2d": 1e-3})
    eff = cal.measure_native_efficiency.__wrapped__()
    assert eff == pytest.approx({"native_matmul": 0.5, "native_conv2d": 1.0})
