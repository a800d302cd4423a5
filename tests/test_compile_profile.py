"""The compile profile: stages attributed once (nested ones carved out), scopes joined."""

import threading

import pytest

from tvm_ollie import compile_profile as cp
from tvm_ollie.compile_profile import CompileProfile, current_profile, profile_scope, stage


class FakeClock:
    """perf_counter stand-in advanced by hand (the timer's arithmetic, not the machine's)."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(cp.time, "perf_counter", fake)
    return fake


def test_nested_stages_are_attributed_once(clock):
    with profile_scope() as prof:
        with stage("candidate builds"):
            clock.advance(1.0)
            with stage("tuning"):
                clock.advance(5.0)
            clock.advance(2.0)
        with stage("search"):
            clock.advance(3.0)
        clock.advance(0.5)
    assert prof.seconds == {"candidate builds": 3.0, "tuning": 5.0, "search": 3.0}
    assert prof.total_s == pytest.approx(11.5) and prof.other_s == pytest.approx(0.5)
    clock.advance(10.0)
    assert prof.total_s == pytest.approx(11.5)  # closed with its scope


def test_repeated_stages_accumulate_and_count(clock):
    with profile_scope() as prof:
        for _ in range(3):
            with stage("verify"):
                clock.advance(0.25)
    assert prof.seconds["verify"] == pytest.approx(0.75) and prof.counts["verify"] == 3
    text = prof.to_text()
    assert text.startswith("compile profile: verify 0.75 s (100%) x3")
    assert text.endswith("total 0.75 s")


def test_inner_scope_joins_the_outer_profile(clock):
    with profile_scope() as outer:
        with stage("import"):
            clock.advance(2.0)
        with profile_scope() as inner:  # (a build inside the CLI's scope)
            assert inner is outer
            with stage("tvm build"):
                clock.advance(1.0)
        assert current_profile() is outer
    assert current_profile() is None
    assert list(outer.to_dict()) == ["import", "tvm build", "other", "total"]


def test_stage_without_profile_does_nothing(clock):
    with stage("search"):
        clock.advance(1.0)
    assert current_profile() is None


def test_an_exception_still_charges_the_stage(clock):
    with profile_scope() as prof:
        with pytest.raises(RuntimeError):
            with stage("search"):
                clock.advance(1.5)
                raise RuntimeError("boom")
        with stage("verify"):
            clock.advance(1.0)
    assert prof.seconds == {"search": 1.5, "verify": 1.0}


def test_other_threads_do_not_write_into_the_profile(clock):
    with profile_scope() as prof:
        t = threading.Thread(target=lambda: stage("tuning").__enter__())
        t.start()
        t.join()
    assert prof.seconds == {}


def test_pipeline_order_then_others():
    prof = CompileProfile()
    for name in ("tvm build", "my stage", "search", "import"):
        prof.add(name, 1.0)
    assert prof.ordered() == ["import", "search", "tvm build", "my stage"]
