"""The search stops once searching on cannot pay: the depth exhausted, or its best candidate
within what a measurement resolves of the roofline lower bound (CostBound)."""

import pytest

from rulecheck import conv2d_nhwc, conv_transpose_gather
from tvm_ollie.derive import StopReason, derive
from tvm_ollie.derive.cost import EOP_COMPUTE_EFFICIENCY, expr_cost, least_work
from tvm_ollie.derive.useful import useful_flops
from tvm_ollie.derive.search import DEFAULT_TARGETS, CostBound
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var
from tvm_ollie.tune import analytic
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration
from tvm_ollie.tune.compare import Timing, beats

CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["llvm"]), "given")


def _matmul(m=8, k=8, n=8) -> Scope:
    i, j, r = Var("i"), Var("j"), Var("r")
    a, b = Tensor("A", (m, k)), Tensor("B", (k, n))
    return Scope([IterVar(i, 0, m), IterVar(j, 0, n)], [IterVar(r, 0, k)], a[i, r] * b[r, j])


def _seconds(prog):
    return analytic.program_seconds(prog, CALIB)


def test_slack_is_what_the_timing_margin_cannot_resolve():
    bound = CostBound(_seconds, lower_s=1.0, margin=0.03)
    assert bound.slack == pytest.approx(0.03 / 0.97)
    assert bound.reached(1.0 + bound.slack) and not bound.reached(1.0 + 1.01 * bound.slack)
    assert not CostBound(_seconds, lower_s=0.0, margin=0.03).reached(0.0)
    # at the edge, a program at the lower bound cannot beat the best by the margin
    best, other = Timing("best", [1.0 + bound.slack] * 9), Timing("other", [1.0] * 9)
    assert not beats(other, best, 0.03)


def test_near_bound_stops_at_the_first_candidate_that_reaches_it():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    full = derive(expr, max_depth=2, verify=False, max_candidates=None)
    assert full.stats.stop_reason is StopReason.MAX_DEPTH
    first = next(p for p in full.candidates if repr(p) == full.stats.found_log[0][2])
    res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_seconds, _seconds(first), 0.03))
    assert res.stats.stop_reason is StopReason.NEAR_BOUND
    assert res.stats.best_s <= _seconds(first) and res.stats.bound_s == _seconds(first)
    assert res.stats.states_visited < full.stats.states_visited
    assert "near_bound" in res.stats.summary()


def test_exhausted_matmul_stops_at_once():
    res = derive(_matmul(), max_depth=7, verify=False)
    assert res.stats.stop_reason is StopReason.EXHAUSTED and res.stats.states_visited == 1


def test_an_unreachable_bound_changes_nothing():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    plain = derive(expr, max_depth=2, verify=False, max_candidates=None)
    low = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_seconds, 1e-12, 0.03))
    assert low.stats.stop_reason is plain.stats.stop_reason is StopReason.MAX_DEPTH
    assert [repr(p) for p in low.candidates] == [repr(p) for p in plain.candidates]


def _brute_useful(n, h, c, f, r, p):
    """Products of an NHWC convolution that read data, counted one point at a time."""
    taps = sum(1 for y in range(h + 2 * p - r + 1) for dy in range(r) if 0 <= y + dy - p < h)
    return n * f * c * taps * taps


def test_least_work_counts_flops_only_for_a_plain_sum_of_products():
    flops, moved = least_work(_matmul(4, 5, 6))
    assert flops == 2 * 4 * 5 * 6 and moved == 4 * (4 * 5 + 5 * 6 + 4 * 6)
    # padded reads: a tightened boundary may skip the margins, so only the products that read
    # data bound it (2 flops each: the multiply and the add)
    padded = least_work(conv2d_nhwc(h=4, c=3, f=2))[0]
    assert padded == 2 * _brute_useful(1, 4, 3, 2, 3, 1)
    assert padded < expr_cost(conv2d_nhwc(h=4, c=3, f=2))[0]
    assert least_work(conv2d_nhwc(h=4, c=3, f=2, r=1, pad=0))[0] > 0


@pytest.mark.parametrize("h,r,p", [(4, 3, 1), (7, 3, 1), (5, 5, 2), (6, 3, 0), (8, 1, 0)])
def test_useful_flops_counts_the_products_that_read_data(h, r, p):
    assert useful_flops(conv2d_nhwc(h=h, c=3, f=2, r=r, pad=p)) == 2 * _brute_useful(
        1, h, 3, 2, r, p)


def test_useful_flops_of_a_transposed_convolution_skips_the_false_taps():
    expr = conv_transpose_gather(1, 3, 2, [5, 5], [4, 4], [2, 2], [1, 1], [1, 1], [0, 0])
    out = [(5 - 1) * 2 - 2 + 3 + 1] * 2
    # each output row y takes the taps dy with (y + 1 - dy) even and its source row in range
    taps = sum(1 for y in range(out[0]) for dy in range(4)
               if (y + 1 - dy) % 2 == 0 and 0 <= (y + 1 - dy) // 2 < 5)
    assert useful_flops(expr) == 2 * 3 * 2 * taps * taps
    # the library's scatter does every input point times its kernel slice: no fewer
    assert useful_flops(expr) <= 2 * (5 * 5 * 3) * (3 * 2 * 4 * 4) / 3


def test_useful_flops_is_none_outside_a_guarded_product():
    i, r = Var("i"), Var("r")
    a = Tensor("A", (4, 4))
    assert useful_flops(Scope([IterVar(i, 0, 4)], [IterVar(r, 0, 4)], a[i, r] + a[r, i])) \
        is None
    assert useful_flops(Scope([IterVar(i, 0, 4)], [], a[i, i] * a[i, i])) is None


#: The unbounded searches of the lower-bound tests, by the expression's text: a search does not
#: depend on the calibration the bound is then checked under, and two tests check the same
#: expressions (each search takes seconds on the 2-core machine).
_SEARCHED = {}


def _searched(expr):
    """``derive(expr, max_depth=3)`` unbounded and unverified, searched once per expression."""
    key = str(expr)
    if key not in _SEARCHED:
        _SEARCHED[key] = derive(expr, max_depth=3, verify=False, max_candidates=None)
    return _SEARCHED[key]


@pytest.mark.parametrize("expr", [
    _matmul(16, 32, 8), conv2d_nhwc(h=6, c=8, f=4, r=1, pad=0), conv2d_nhwc(h=4, c=4, f=4),
    conv2d_nhwc(h=7, c=4, f=8, r=3, stride=2),
    conv_transpose_gather(1, 4, 4, [4, 4], [4, 4], [2, 2], [1, 1], [1, 1], [0, 0]),
    conv_transpose_gather(1, 4, 2, [3, 3], [3, 3], [2, 2], [1, 1], [1, 1], [1, 1])])
def test_the_lower_bound_holds_for_every_candidate(expr):
    res = _searched(expr)
    lower = analytic.least_seconds(expr, CALIB)
    assert lower > 0
    for prog in res.candidates:
        for impl in ("tvm", "native"):
            assert analytic.program_seconds(prog, CALIB, impl) >= lower * (1 - 1e-9), prog


def test_a_known_original_near_the_bound_stops_after_the_first_level():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    plain = derive(expr, max_depth=2, verify=False, max_candidates=None,
                   bound=CostBound(_seconds, 1e-12, 0.03))
    known = derive(expr, max_depth=2, verify=False, max_candidates=None,
                   bound=CostBound(_seconds, 1.0, 0.03, known_s=1.0))
    assert plain.stats.stop_reason is StopReason.MAX_DEPTH
    assert known.stats.stop_reason is StopReason.NEAR_BOUND
    assert known.stats.max_depth_reached == 0
    assert 0 < len(known.candidates) < len(plain.candidates)
    # the known program counts like a candidate: above the slack, nothing stops
    assert not CostBound(_seconds, 1.0, 0.03, known_s=1.04).reached(None)
    assert CostBound(_seconds, 1.0, 0.03, known_s=1.03).reached(None)
    assert CostBound(_seconds, 1.0, 0.03, known_s=5.0).reached(1.0)


def _constant(_prog) -> float:
    """Every candidate as cheap as the first: only level 0 improves."""
    return 1.0


class _Cheaper:
    """Each new candidate 10 % cheaper than the one before: every level that finds one
    improves."""

    def __init__(self):
        self.next_s = 1.0

    def __call__(self, _prog) -> float:
        self.next_s *= 0.9
        return self.next_s


@pytest.mark.parametrize("patience", [0, 1, 2])
def test_patience_stops_after_that_many_barren_levels(patience):
    expr = conv2d_nhwc(h=4, c=4, f=4)
    res = derive(expr, max_depth=4, verify=False, max_candidates=None,
                 bound=CostBound(_constant, 1e-12, 0.03, patience))
    # level 0 improved (the first candidate); levels 1..patience expanded, then the stop
    assert res.stats.stop_reason is StopReason.STALE
    assert res.stats.max_depth_reached == patience
    assert "stale" in res.stats.summary()


def test_patience_keeps_searching_while_levels_improve():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    plain = derive(expr, max_depth=3, verify=False, max_candidates=None)
    res = derive(expr, max_depth=3, verify=False, max_candidates=None,
                 bound=CostBound(_Cheaper(), 0.0, 0.03, 1))
    assert res.stats.stop_reason is StopReason.MAX_DEPTH
    assert [repr(p) for p in res.candidates] == [repr(p) for p in plain.candidates]


def test_an_improvement_within_the_margin_is_no_improvement():
    """Candidates 1 % cheaper each (less than the 3 % margin) do not reset the patience."""
    expr = conv2d_nhwc(h=4, c=4, f=4)
    state = {"s": 1.0}

    def slightly(_prog):
        state["s"] *= 0.99
        return state["s"]

    res = derive(expr, max_depth=4, verify=False, max_candidates=None,
                 bound=CostBound(slightly, 1e-12, 0.03, 1))
    assert res.stats.stop_reason is StopReason.STALE and res.stats.max_depth_reached == 1


#: A calibration whose original kernel (the library's transposed convolution) is the fastest
#: kind, and whose memory is fast enough that the arithmetic decides: TVM's and the library's
#: GEMM at 5 %, the library's convolution at ``conv``.
def _skewed(conv: float, conv_transpose: float = 0.9) -> Calibration:
    eff = {k: 0.05 for k in ("matmul", "batch_matmul", "conv2d", "conv_transpose", "g2bmm",
                             "gbmm", "tir", "native_matmul", "native_g2bmm", "native_gbmm")}
    eff.update(eop=0.5, native_conv2d=conv, native_conv_transpose=conv_transpose)
    return Calibration("llvm", 1e11, 1e14, eff, "given")


_TRANSPOSED = conv_transpose_gather(1, 4, 4, [4, 4], [4, 4], [2, 2], [1, 1], [1, 1], [0, 0])
_ORIGINAL = "relax.nn.conv2d_transpose"


def test_the_bound_counts_only_the_kinds_a_derived_program_can_run_on():
    calib = _skewed(conv=0.05)
    assert "native_conv_transpose" not in analytic.derived_kinds()
    assert "conv_transpose" not in analytic.derived_kinds()
    assert analytic.derived_kinds(False, ("matmul",)) == ("matmul",)
    assert analytic.derived_kinds(True, ("batch_matmul",)) == (
        "batch_matmul", "matmul", "native_matmul")
    # the library's transposed convolution (0.9) no longer lowers the bound: the eOperators'
    # arithmetic (EOP_COMPUTE_EFFICIENCY) is the best a derived program reaches here
    assert analytic.derived_efficiency(calib) == pytest.approx(EOP_COMPUTE_EFFICIENCY)
    flops = least_work(_TRANSPOSED)[0]
    assert analytic.least_seconds(_TRANSPOSED, calib) == pytest.approx(
        flops / (1e11 * EOP_COMPUTE_EFFICIENCY))
    # a reachable fast kind does lower it
    assert analytic.least_seconds(_TRANSPOSED, _skewed(conv=0.9)) == pytest.approx(
        flops / (1e11 * 0.9))
    assert analytic.least_seconds(_TRANSPOSED, _skewed(conv=0.9), targets=("matmul",)) == \
        pytest.approx(flops / (1e11 * EOP_COMPUTE_EFFICIENCY))


def _bounded(calib: Calibration, targets, conv_transpose_s: float):
    def seconds(prog):
        return min(analytic.program_seconds(prog, calib, impl) for impl in ("tvm", "native"))

    lower = analytic.least_seconds(_TRANSPOSED, calib, targets=targets)
    return derive(_TRANSPOSED, targets=targets, max_depth=2, verify=False,
                  max_candidates=None,
                  bound=CostBound(seconds, lower, 0.15, known_s=conv_transpose_s))


def test_a_form_reaching_only_a_slow_gemm_is_pruned_by_a_faster_original():
    calib = _skewed(conv=0.9, conv_transpose=0.5)
    known = analytic.original_seconds(_TRANSPOSED, _ORIGINAL, calib, "native")
    # only the GEMMs reachable: no program can beat the library's transposed convolution
    gemm = _bounded(calib, ("matmul", "batch_matmul"), known)
    assert gemm.stats.stop_reason is StopReason.NEAR_BOUND
    assert gemm.stats.max_depth_reached == 0
    # the library convolution (0.9) reachable: a derived program might beat it, search on
    conv = _bounded(calib, DEFAULT_TARGETS, known)
    assert conv.stats.stop_reason is StopReason.MAX_DEPTH
    assert conv.stats.max_depth_reached == 2


@pytest.mark.parametrize("calib", [_skewed(conv=0.05), _skewed(conv=0.9)])
@pytest.mark.parametrize("expr", [
    _TRANSPOSED, conv_transpose_gather(1, 4, 2, [3, 3], [3, 3], [2, 2], [1, 1], [1, 1], [1, 1]),
    conv2d_nhwc(h=4, c=4, f=4)])
def test_the_lower_bound_holds_when_the_arithmetic_decides(calib, expr):
    """Memory 1000x faster than in CALIB: every candidate's arithmetic, in its operators and
    its eOperators, is what its estimate is made of."""
    res = _searched(expr)
    lower = analytic.least_seconds(expr, calib)
    assert res.candidates
    for prog in res.candidates:
        for impl in ("tvm", "native"):
            assert analytic.program_seconds(prog, calib, impl) >= lower * (1 - 1e-9), prog


def test_paid_back_compares_the_seconds_spent_with_the_gain_left_over_the_runs():
    bound = CostBound(_constant, lower_s=1e-5, margin=0.03, payback_runs=1000)
    # best 3e-5: 2e-5 s per run left to gain, 0.02 s over 1000 runs
    assert not bound.paid_back(3e-5, 0.019) and bound.paid_back(3e-5, 0.021)
    assert not bound.paid_back(None, 1e9)  # nothing found, nothing known: no stop
    known = CostBound(_constant, 1e-5, 0.03, known_s=2e-5, payback_runs=1000)
    assert known.paid_back(None, 0.011) and not known.paid_back(None, 0.009)
    assert known.paid_back(5e-5, 0.011)  # the lower of the candidate and the original
    assert not CostBound(_constant, 1e-5, 0.03).paid_back(3e-5, 1e9)  # no runs: no stop
    assert not CostBound(_constant, 0.0, 0.03, payback_runs=1).paid_back(3e-5, 1e9)


def test_a_search_whose_gain_cannot_repay_it_stops_paid_back():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    plain = derive(expr, max_depth=2, verify=False, max_candidates=None,
                   bound=CostBound(_constant, 1e-12, 0.03))
    # a gain of ~1 s per run over 1e-12 runs: a picosecond of search repays nothing more
    res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_constant, 1e-12, 0.03, payback_runs=1e-12))
    assert plain.stats.stop_reason is StopReason.MAX_DEPTH
    assert res.stats.stop_reason is StopReason.PAID_BACK and "paid_back" in res.stats.summary()
    assert res.stats.states_visited == 1  # the root found the first candidates: then the stop
    assert 0 < len(res.candidates) < len(plain.candidates)


def test_nothing_to_gain_still_returns_the_first_level():
    """An original estimated below the bound (nothing left to gain from the start): the
    search still returns the root's programs, and stops where ``near_bound`` stops it."""
    expr = conv2d_nhwc(h=4, c=4, f=4)
    near = derive(expr, max_depth=2, verify=False, max_candidates=None,
                  bound=CostBound(_constant, 1.0, 0.03, known_s=0.5))
    paid = derive(expr, max_depth=2, verify=False, max_candidates=None,
                  bound=CostBound(_constant, 1.0, 0.03, known_s=0.5, payback_runs=1e5))
    assert near.stats.stop_reason is paid.stats.stop_reason is StopReason.NEAR_BOUND
    assert paid.stats.states_visited == near.stats.states_visited == 1
    assert [repr(p) for p in paid.candidates] == [repr(p) for p in near.candidates] != []


def test_a_gain_that_repays_the_search_changes_nothing():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    plain = derive(expr, max_depth=2, verify=False, max_candidates=None,
                   bound=CostBound(_constant, 1e-12, 0.03))
    res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_constant, 1e-12, 0.03, payback_runs=1e9))
    assert res.stats.stop_reason is StopReason.MAX_DEPTH
    assert [repr(p) for p in res.candidates] == [repr(p) for p in plain.candidates]


def test_the_gain_is_at_most_the_measured_cap():
    """``gain_cap``: the gain over the runs is the lower of the estimated gain and the
    measured seconds; a cap above the estimated gain, or none, changes nothing."""
    capped = CostBound(_constant, 1e-5, 0.03, payback_runs=1000, gain_cap=lambda: 4e-6)
    # estimated gain 2e-5 s per run (0.02 s over 1000 runs), measured 4e-6 (0.004 s)
    assert not capped.paid_back(3e-5, 0.0039) and capped.paid_back(3e-5, 0.0041)
    above = CostBound(_constant, 1e-5, 0.03, payback_runs=1000, gain_cap=lambda: 1.0)
    assert not above.paid_back(3e-5, 0.019) and above.paid_back(3e-5, 0.021)
    failed = CostBound(_constant, 1e-5, 0.03, payback_runs=1000, gain_cap=lambda: None)
    assert not failed.paid_back(3e-5, 0.019) and failed.paid_back(3e-5, 0.021)
    assert not CostBound(_constant, 1e-5, 0.03, gain_cap=lambda: 0.0).paid_back(3e-5, 1e9)


def test_a_measured_cap_stops_a_search_its_estimates_would_run_on():
    """Estimated, every program has ~1 s a run to gain (a search of 1000 runs would go on);
    measured at a nanosecond, the original leaves nothing to repay: the search stops after
    its first state, with the root's programs, and measures once."""
    expr = conv2d_nhwc(h=4, c=4, f=4)
    calls = []

    def cap():
        calls.append(1)
        return 1e-9

    plain = derive(expr, max_depth=2, verify=False, max_candidates=None,
                   bound=CostBound(_constant, 1e-12, 0.03, payback_runs=1000))
    res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_constant, 1e-12, 0.03, payback_runs=1000, gain_cap=cap))
    assert plain.stats.stop_reason is StopReason.MAX_DEPTH
    assert res.stats.stop_reason is StopReason.PAID_BACK and res.stats.states_visited == 1
    assert 0 < len(res.candidates) < len(plain.candidates) and calls


def test_a_search_that_stops_at_its_first_state_never_measures():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_constant, 1.0, 0.03, known_s=0.5, payback_runs=1e5,
                                 gain_cap=lambda: pytest.fail("measured")))
    assert res.stats.stop_reason is StopReason.NEAR_BOUND


def test_a_measured_original_near_the_bound_stops_after_the_first_state():
    """``measured_s``: the original timed on its library kernel within the slack of the
    bound stops the search where its estimate (2x the bound) does not, with the root's
    programs, and is timed once; measured above the slack, or not at all, nothing changes."""
    expr = conv2d_nhwc(h=4, c=4, f=4)
    calls = []

    def _twice(_prog) -> float:  # every candidate estimated at twice the bound
        return 2.0

    def measured(seconds):
        def timer():
            calls.append(seconds)
            return seconds
        return timer

    plain = derive(expr, max_depth=2, verify=False, max_candidates=None,
                   bound=CostBound(_twice, 1.0, 0.15, known_s=2.0))
    near = derive(expr, max_depth=2, verify=False, max_candidates=None,
                  bound=CostBound(_twice, 1.0, 0.15, known_s=2.0,
                                  measured_s=measured(1.15)))
    assert plain.stats.stop_reason is StopReason.MAX_DEPTH
    assert near.stats.stop_reason is StopReason.NEAR_MEASURED and near.stats.states_visited == 1
    assert "near_measured" in near.stats.summary() and calls == [1.15]
    assert 0 < len(near.candidates) < len(plain.candidates)
    for far in (measured(1.2), lambda: None):  # slack 0.15 / 0.85 = 0.176
        res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                     bound=CostBound(_twice, 1.0, 0.15, known_s=2.0, measured_s=far))
        assert res.stats.stop_reason is StopReason.MAX_DEPTH
        assert [repr(p) for p in res.candidates] == [repr(p) for p in plain.candidates]


def test_the_estimates_stop_first_and_then_nothing_is_timed():
    expr = conv2d_nhwc(h=4, c=4, f=4)
    res = derive(expr, max_depth=2, verify=False, max_candidates=None,
                 bound=CostBound(_constant, 1.0, 0.03, known_s=0.5,
                                 measured_s=lambda: pytest.fail("measured")))
    assert res.stats.stop_reason is StopReason.NEAR_BOUND


def test_reached_measured_needs_a_positive_bound_and_a_time():
    assert CostBound(_constant, 1.0, 0.15, measured_s=lambda: 1.1).reached_measured()
    assert not CostBound(_constant, 1.0, 0.15, measured_s=lambda: 1.3).reached_measured()
    assert not CostBound(_constant, 0.0, 0.15, measured_s=lambda: 0.0).reached_measured()
    assert not CostBound(_constant, 1.0, 0.15, measured_s=lambda: None).reached_measured()
    assert not CostBound(_constant, 1.0, 0.15).reached_measured()


def test_the_payback_counts_from_the_measured_original_where_it_is_lower():
    """Estimated at 2e-5 over a bound of 1e-5, timed at 1.2e-5 (above the slack): the gain
    left is 2e-6 a run, 0.002 s over 1000 runs, not the estimate's 0.01 s."""
    timed = CostBound(_constant, 1e-5, 0.15, known_s=2e-5, payback_runs=1000,
                      measured_s=lambda: 1.2e-5)
    assert not timed.reached_measured()
    assert not timed.paid_back(None, 0.0019) and timed.paid_back(None, 0.0021)
    slower = CostBound(_constant, 1e-5, 0.15, known_s=2e-5, payback_runs=1000,
                       measured_s=lambda: 5e-5)
    assert not slower.paid_back(None, 0.0099) and slower.paid_back(None, 0.0101)
    failed = CostBound(_constant, 1e-5, 0.15, known_s=2e-5, payback_runs=1000,
                       measured_s=lambda: None)
    assert not failed.paid_back(None, 0.0099) and failed.paid_back(None, 0.0101)
