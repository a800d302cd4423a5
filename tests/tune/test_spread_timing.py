"""The fastest call of each kernel, timed in turns over rounds (tune.spread_timing), on a
fake clock."""

import pytest

from tvm_ollie.tune.spread_timing import spread_best


class FakeMachine:
    """Kernels whose calls take scripted seconds on a fake clock: ``slow`` names the
    (kernel, round) pairs that another process slowed down 20x."""

    def __init__(self, seconds, slow=()):
        self.now = 0.0
        self.seconds = dict(seconds)
        self.slow = set(slow)
        self.log = []  # (kernel, round) of every call, in order
        self.round = 0
        self.pauses = []

    def clock(self):
        return self.now

    def sleep(self, pause):
        self.pauses.append(pause)
        self.round += 1
        self.now += pause

    def call(self, name):
        def run():
            self.log.append((name, self.round))
            factor = 20.0 if (name, self.round) in self.slow else 1.0
            self.now += self.seconds[name] * factor
        return run


def test_each_kernel_keeps_its_fastest_call_over_the_rounds():
    """A kernel slowed in every round but one still gets its own time; so does one slowed
    in none: the rounds give each several stretches of the machine."""
    machine = FakeMachine({"gemm": 1e-3, "conv": 3e-3},
                          slow=[("gemm", r) for r in range(4)] + [("conv", 2)])
    best = spread_best({k: machine.call(k) for k in ("gemm", "conv")}, rounds=5, repeat=2,
                       pause_s=0.01, clock=machine.clock, sleep=machine.sleep)
    assert best == pytest.approx({"gemm": 1e-3, "conv": 3e-3})


def test_a_kernel_slowed_in_every_round_shows_it():
    machine = FakeMachine({"gemm": 1e-3}, slow=[("gemm", r) for r in range(3)])
    best = spread_best({"gemm": machine.call("gemm")}, rounds=3, repeat=2, pause_s=0.01,
                       clock=machine.clock, sleep=machine.sleep)
    assert best["gemm"] == pytest.approx(20e-3)


def test_the_kernels_take_turns_within_each_round_after_one_untimed_call_each():
    machine = FakeMachine({"a": 1e-3, "b": 2e-3})
    spread_best({"a": machine.call("a"), "b": machine.call("b")}, rounds=3, repeat=2,
                pause_s=0.005, clock=machine.clock, sleep=machine.sleep)
    warm, timed = machine.log[:2], machine.log[2:]
    assert warm == [("a", 0), ("b", 0)]
    assert timed == [(k, r) for r in range(3) for k in ("a", "a", "b", "b")]
    assert machine.pauses == [0.005, 0.005]  # between rounds, not after the last


def test_the_untimed_first_call_does_not_count():
    """A library kernel's first call builds its primitive: 100x slower, not the statistic."""
    machine = FakeMachine({"conv": 1e-3})
    first = []

    def conv():
        machine.now += 0.1 if not first else 1e-3
        first.append(1)

    best = spread_best({"conv": conv}, rounds=1, repeat=1, clock=machine.clock,
                       sleep=machine.sleep)
    assert best["conv"] == pytest.approx(1e-3) and len(first) == 2
