"""Keep the benchmark's thread settings (set by run_bench and the CLI) inside each test."""

import pytest

from tvm_ollie.bench.env import PASSIVE_WAIT


@pytest.fixture(autouse=True)
def _restore_thread_environment(monkeypatch):
    for key in ("TVM_NUM_THREADS", *PASSIVE_WAIT):
        # delenv records the current value (if any) and restores it after the test.
        monkeypatch.delenv(key, raising=False)
    yield


class FakeClock:
    """A clock that only the timed calls advance (the machine's load cannot move it)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture(name="fake_clock")
def _fake_clock(monkeypatch):
    """A :class:`FakeClock` standing in for the ``time`` module of ``bench.timing``."""
    from tvm_ollie.bench import timing  # pylint: disable=import-outside-toplevel

    clock = FakeClock()
    monkeypatch.setattr(timing, "time", clock)
    return clock
