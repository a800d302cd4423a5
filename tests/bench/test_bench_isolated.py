"""The isolated mode: each system in a worker process of its own, the workers taking turns."""

import json
import os
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tvm_ollie.bench import __main__ as cli  # noqa: E402
from tvm_ollie.bench.harness import run_bench  # noqa: E402
from tvm_ollie.bench.systems import Prepared, register_system  # noqa: E402
from tvm_ollie.bench.timing import measure_rounds, rotation  # noqa: E402
from tvm_ollie.bench.worker import (  # noqa: E402
    Worker, WorkerFailed, cpu_seconds, running_threads, wait_idle)  # noqa: E402

_CALLS = {"n": 0}


@register_system("test_iso_pid")
def _pid(spec, ctx):
    """Eager PyTorch, reporting the process it was prepared in."""
    module, inputs = spec.module, spec.example_inputs

    def run():
        with torch.inference_mode():
            return module(*inputs)

    return Prepared(run, compile_s=0.25, info={"pid": os.getpid()})


@register_system("test_iso_crash")
def _crash(spec, ctx):
    """A system whose process dies while preparing (as a crash in native code would)."""
    os._exit(3)


@register_system("test_iso_breaks")
def _breaks(spec, ctx):
    """Correct on the first call, then raises: fails while it is timed."""
    module, inputs = spec.module, spec.example_inputs

    def run():
        _CALLS["n"] += 1
        if _CALLS["n"] > 2:
            raise RuntimeError("broke after two calls")
        with torch.inference_mode():
            return module(*inputs)

    return Prepared(run, info={"pid": os.getpid()})


def _factory(fail_after=None, crash=False):
    """A worker's factory without a model: outputs say which process ran them."""
    if crash:
        os._exit(4)
    calls = {"n": 0}

    def run():
        calls["n"] += 1
        if fail_after is not None and calls["n"] > fail_after:
            raise RuntimeError("broke")
        return [np.full(2, float(os.getpid()))]

    return {"status": "built", "pid": os.getpid()}, run, run()


def _sleeper(seconds):
    """A worker's factory whose calls take ``seconds``."""

    def run():
        time.sleep(seconds)
        return [np.zeros(1)]

    return {"status": "built"}, run, run()


def test_a_worker_reports_its_calibrated_call_and_a_slow_one_is_timed_once():
    workers = {"fast": Worker("fast", _sleeper, {"seconds": 0.0}),
               "slow": Worker("slow", _sleeper, {"seconds": 0.06})}
    try:
        for worker in workers.values():
            worker.ready()
        samples = measure_rounds(workers, budget_s=0.0, min_rounds=2, slow_call_s=0.05)
        assert workers["slow"].call_s >= 0.06 and workers["fast"].call_s < 0.05
        assert samples["slow"].once and samples["slow"].seconds == [workers["slow"].call_s]
        assert not samples["fast"].once and len(samples["fast"].seconds) == 2
    finally:
        for worker in workers.values():
            worker.close()


def test_workers_are_timed_in_turns_and_failures_come_back():
    workers = {"ok": Worker("ok", _factory, {}), "breaks": Worker("breaks", _factory,
                                                                  {"fail_after": 3})}
    crashed = Worker("crash", _factory, {"crash": True})
    try:
        with pytest.raises(WorkerFailed, match="exited with code 4"):
            crashed.ready()
        pids = set()
        for worker in workers.values():
            result, outputs = worker.ready()
            assert result["pid"] == outputs[0][0] != os.getpid()
            pids.add(result["pid"])
        assert len(pids) == 2
        failures, settled = {}, []

        def settle(previous):
            settled.append(previous)
            if previous is not None:
                assert workers[previous].settle() < 1.0

        samples = measure_rounds(workers, budget_s=0.0, min_rounds=3, min_sample_s=0.0,
                                 settle=settle, failures=failures)  # fmt: skip
        # calibrate is the second call, so the first sample (third call) still works
        assert list(samples) == ["ok"] and len(samples["ok"].seconds) == 3
        assert "RuntimeError: broke" in failures["breaks"]
        assert settled[:3] == [None, "ok", "breaks"]
    finally:
        for worker in [*workers.values(), crashed]:
            worker.close()
    assert not any(w.process.is_alive() for w in [*workers.values(), crashed])


@pytest.mark.slow
def test_isolated_mode_merges_workers_and_survives_failing_ones(tmp_path):
    systems = ["torch", "test_iso_pid", "test_iso_crash", "test_iso_breaks"]
    results = run_bench(models=["infogan"], quick=True, systems=systems, reference="torch",
                        out_dir=str(tmp_path), time_budget_s=0.02, min_rounds=3, plot=False,
                        log=lambda _: None)  # fmt: skip
    assert results["config"]["mode"] == "isolated"
    entry = results["models"]["infogan"]["systems"]
    assert entry["torch"]["status"] == "ok" and entry["test_iso_pid"]["status"] == "ok"
    # prepared elsewhere: in a worker, not in this process nor in the other system's worker
    assert entry["test_iso_pid"]["pid"] != os.getpid()
    assert entry["test_iso_pid"]["compile_s"] == 0.25  # build times come back from the worker
    assert entry["test_iso_pid"]["rel_err"] == 0.0  # outputs shipped back and checked here
    assert entry["test_iso_pid"]["rounds"] == entry["torch"]["rounds"] >= 3
    assert entry["test_iso_pid"]["ratio_to_ref"] > 0
    assert entry["test_iso_crash"]["status"] == "error"
    assert "exited with code 3" in entry["test_iso_crash"]["reason"]
    assert entry["test_iso_breaks"]["status"] == "error"
    assert "RuntimeError: broke after two calls" in entry["test_iso_breaks"]["reason"]
    assert "median_s" not in entry["test_iso_breaks"]
    assert _CALLS["n"] == 0  # every call happened in a worker
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        assert json.load(f)["config"]["mode"] == "isolated"
    assert "isolated mode" in (tmp_path / "results.md").read_text()


class _FakeWorker:
    """Records when it runs; each sample advances the shared clock by its latency."""

    def __init__(self, name, latency, clock, log, fail_at=None):
        self.name, self.latency, self.clock, self.log = name, latency, clock, log
        self.fail_at, self.samples = fail_at, 0

    def calibrate(self, min_sample_s):
        self.clock.sleep(self.latency)
        return 1

    def sample(self, number):
        self.samples += 1
        if self.fail_at is not None and self.samples >= self.fail_at:
            raise RuntimeError("worker died")
        self.log.append(self.name)
        self.clock.sleep(self.latency * number)
        return self.latency


def test_rounds_rotate_one_worker_at_a_time(fake_clock):
    clock = fake_clock
    log, settled = [], []
    workers = {name: _FakeWorker(name, lat, clock, log)
               for name, lat in (("a", 0.001), ("b", 0.002), ("c", 0.003))}  # fmt: skip
    workers["d"] = _FakeWorker("d", 0.001, clock, log, fail_at=2)
    failures = {}
    samples = measure_rounds(workers, budget_s=1.0, min_rounds=4, max_rounds=4,
                             min_sample_s=0.0, settle=settled.append,
                             failures=failures)  # fmt: skip
    # d fails on its second sample (round 1) and is dropped; the others keep rotating
    assert log == ["a", "b", "c", "d", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert settled[0] is None and settled[1:4] == ["a", "b", "c"]  # waits on the one before
    assert set(samples) == {"a", "b", "c"} and "worker died" in failures["d"]
    assert [len(s.seconds) for s in samples.values()] == [4, 4, 4]
    assert samples["c"].median == 0.003
    assert rotation(["a", "b", "c"], 4) == ["b", "c", "a"] and rotation([], 2) == []


def test_wait_idle_returns_for_an_idle_process():
    assert cpu_seconds(os.getpid()) > 0
    assert wait_idle(os.getpid(), max_wait_s=0.05) < 1.0  # this test's process: under 50 ms
    assert cpu_seconds(2**22 + 12345) is None  # no such process
    assert running_threads(2**22 + 12345) is None


def _spin(stop: threading.Event) -> None:
    while not stop.is_set():
        pass


def test_wait_idle_waits_for_a_spinning_thread():
    """A thread that spins counts as running however short the window (its CPU time would
    read as unchanged between two scheduler ticks); the wait ends once it stops."""
    me = threading.get_native_id()
    stop = threading.Event()
    thread = threading.Thread(target=_spin, args=(stop,), daemon=True)
    thread.start()
    try:
        time.sleep(0.01)
        assert running_threads(os.getpid(), exclude=[me]) >= 1
        assert wait_idle(os.getpid(), max_wait_s=0.05) >= 0.05  # still spinning: the full wait
        threading.Timer(0.05, stop.set).start()
        waited = wait_idle(os.getpid(), max_wait_s=5.0)
        assert 0.03 <= waited < 5.0
    finally:
        stop.set()
        thread.join()
    assert running_threads(os.getpid(), exclude=[me]) == 0


def test_cli_mode_option():
    parser = cli.build_parser()
    assert parser.parse_args([]).mode == "isolated"
    assert parser.parse_args(["--mode", "interleaved"]).mode == "interleaved"
    with pytest.raises(SystemExit):
        parser.parse_args(["--mode", "bogus"])
    with pytest.raises(ValueError):
        run_bench(models=["infogan"], systems=["torch"], mode="bogus")
