"""The CPU another runtime's idle workers burn after its call: the per-thread counters, the
window arithmetic (a fake clock of CPU time) and the table."""

import threading

import pytest

from tvm_ollie.bench import spin_after as sa


def test_a_live_thread_that_ran_is_counted_and_the_caller_is_not():
    me = threading.get_native_id()
    done, release = threading.Event(), threading.Event()

    def work():
        sum(range(200_000))
        done.set()
        release.wait()  # alive and blocked while it is read

    before = sa.threads_cpu_ns(me)
    thread = threading.Thread(target=work)
    thread.start()
    done.wait()
    after = sa.threads_cpu_ns(me)
    release.set()
    thread.join()
    assert after > before
    spent = sa.threads_cpu_ns(0) - sa.threads_cpu_ns(me)  # skip=0 skips no thread
    assert spent >= 0


def test_window_is_measured_after_two_calls(monkeypatch):
    """Each window: the call twice, then the others' CPU across the sleep; the median."""
    events, cpu = [], iter([0, 3_000_000, 10_000_000, 11_000_000, 20_000_000, 25_000_000])
    monkeypatch.setattr(sa, "threads_cpu_ns", lambda skip: next(cpu))
    monkeypatch.setattr(sa.time, "sleep", lambda s: events.append(("sleep", s)))
    median = sa.spin_after(lambda: events.append("call"), window_s=0.05, repeats=3)
    assert median == pytest.approx(3.0)  # windows of 3, 1 and 5 ms
    assert events == ["call", "call", ("sleep", 0.05)] * 3


def test_spin_table_has_a_row_per_runtime():
    rows = {"defaults": {"spin_ms": {"ours": 8.5, "ORT (spinning)": 40.0}},
            "passive": {"spin_ms": {"ours": 0.0}}, "failed": {"status": "error"}}
    table = sa.spin_table(rows)
    assert "| ours | 8.50 | 0.00 | - |" in table
    assert "| ORT (spinning) | 40.00 | - | - |" in table
    assert len(table.strip().splitlines()) == 4
