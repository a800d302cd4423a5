"""Keep the benchmark's thread settings (set by run_bench and the CLI) inside each test."""

import pytest

from tvm_ollie.bench.env import PASSIVE_WAIT


@pytest.fixture(autouse=True)
def _restore_thread_environment(monkeypatch):
    for key in ("TVM_NUM_THREADS", *PASSIVE_WAIT):
        # delenv records the current value (if any) and restores it after the test.
        monkeypatch.delenv(key, raising=False)
    yield
