"""The evidence kept with a timed verdict, and the doubts that make a reader time it again."""

from tvm_ollie.tune.compare import compare, from_seconds
from tvm_ollie.tune.evidence import (MAX_TIMINGS, SPREAD, doubts, evidence, loaded_now,
                                     relative_spread, resolvable)


def _compare(samples, prefer=("original", "rewritten"), margin=0.03):
    """The protocol (15 rounds, first quartile) on fixed samples: a fake timer."""
    feeds = {name: iter(values) for name, values in samples.items()}
    samplers = {name: (lambda it=it: next(it)) for name, it in feeds.items()}
    return compare(samplers, list(prefer), margin, min_rounds=15, max_rounds=15,
                   quantile=0.25)


QUIET = {"original": [2e-3 * (1 + 0.01 * (i % 3)) for i in range(15)],
         "rewritten": [1e-3 * (1 + 0.01 * (i % 4)) for i in range(15)]}


def test_a_quiet_separated_verdict_has_no_doubt():
    res = _compare(QUIET)
    assert res.winner == "rewritten" and res.separated
    ev = evidence(res, 0.4, 0.9, cpus=2)
    assert ev["timed"] and ev["load"] == [0.4, 0.9] and max(ev["spread"].values()) < 0.05
    assert doubts(res, ev) == []


def test_no_evidence_and_load_above_the_cores_are_doubts():
    res = _compare(QUIET)
    assert [d.split(":")[0] for d in doubts(res, None)] == ["unrecorded"]
    assert [d.split(":")[0] for d in doubts(res, evidence(res, 0.5, 6.0, cpus=2))] == ["loaded"]
    given = from_seconds({"original": 2e-3, "rewritten": 1e-3}, ["original", "rewritten"])
    assert doubts(given, evidence(given, 9.0, 9.0, cpus=2)) == []  # a test timer vouches


def test_one_outlier_raises_no_doubt_and_does_not_flip_the_verdict():
    noisy = dict(QUIET, rewritten=list(QUIET["rewritten"]))
    noisy["rewritten"][7] = 0.05  # one sample 50x slower (a descheduled thread)
    res = _compare(noisy)
    assert res.winner == "rewritten" and res.separated
    assert doubts(res, evidence(res, 0.5, 0.5, cpus=2)) == []


#: Rounds slowed by load, the two plans within their noise: not separated
CLOSE = {"original": [1.0e-3 * (1 + 0.5 * (i % 3)) for i in range(15)],
         "rewritten": [1.1e-3 * (1 + 0.5 * ((i + 1) % 3)) for i in range(15)]}


def test_rounds_slowed_by_load_are_noisy_when_the_noise_could_decide():
    res = _compare(CLOSE)
    assert not res.separated and relative_spread(res.timings["original"].samples) > SPREAD
    assert [d.split(":")[0] for d in doubts(res, evidence(res, 0.5, 0.5, cpus=2))] == ["noisy"]


def test_a_winner_separated_in_spite_of_the_noise_has_no_doubt():
    slowed = dict(QUIET, original=[2e-3 * (1 + (i % 3)) for i in range(15)])
    res = _compare(slowed)
    assert res.separated and relative_spread(res.timings["original"].samples) > SPREAD
    assert doubts(res, evidence(res, 0.5, 0.5, cpus=2)) == []


def test_near_tie_goes_to_the_preference_and_is_reused():
    near = {"original": [1.00e-3 + 1e-6 * (i % 5) for i in range(15)],
            "rewritten": [0.99e-3 + 1e-6 * (i % 5) for i in range(15)]}
    res = _compare(near)
    assert not res.separated and res.fastest == "rewritten" and res.winner == "original"
    assert doubts(res, evidence(res, 0.5, 0.5, cpus=2)) == []  # within SPREAD: alike


def test_a_tie_that_kept_a_much_slower_plan_is_doubted():
    res = from_seconds({"original": 1.3e-3, "rewritten": 1.0e-3}, ["original", "rewritten"],
                       margin=0.5)  # a margin wider than the gap: not separated
    assert not res.separated and res.winner == "original"
    assert [d.split(":")[0] for d in doubts(res, evidence(res, 0.5, 0.5, cpus=2))] == ["tie"]


def _names(found):
    return [d.split(":")[0] for d in found]


def test_a_loaded_verdict_is_timed_again_only_once_the_machine_is_quiet():
    res = _compare(QUIET)
    loaded = evidence(res, 0.5, 6.0, cpus=2)
    assert _names(resolvable(res, loaded, load_now=5.0, cpus=2)) == []  # loaded now too
    assert _names(resolvable(res, loaded, load_now=1.5, cpus=2)) == ["loaded"]
    assert _names(resolvable(res, None, load_now=5.0, cpus=2)) == ["unrecorded"]
    assert loaded_now(2.1, cpus=2) and not loaded_now(2.0, cpus=2) and not loaded_now(None)


def test_noisy_rounds_get_one_more_timing_on_a_quiet_machine_not_more():
    res = _compare(CLOSE)
    first = evidence(res, 0.5, 0.5, cpus=2)
    assert first["timings"] == 1 and _names(resolvable(res, first, 0.5, cpus=2)) == ["noisy"]
    second = evidence(res, 0.5, 0.5, cpus=2, previous=first)
    assert second["timings"] == MAX_TIMINGS == 2
    assert resolvable(res, second, 0.5, cpus=2) == []
    assert _names(doubts(res, second)) == ["noisy"]  # still a doubt, reported with the verdict
