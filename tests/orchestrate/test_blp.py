"""The binary program's optimum equals brute force; fallbacks and limits."""

from hypothesis import given, settings
from hypothesis import strategies as st

from tvm_ollie.orchestrate.blp import BLPProblem, brute_force, solve_blp


@st.composite
def problems(draw):
    """Random DAG of values 0..V-1 (value v may read values < v); each candidate computes a
    random set of values from their predecessors, exports a random non-empty subset."""
    n_values = draw(st.integers(2, 6))
    reads = [draw(st.sets(st.integers(0, v - 1), max_size=2)) if v else set()
             for v in range(n_values)]
    available = {v for v in range(n_values) if not reads[v] and draw(st.booleans())}
    n_cands = draw(st.integers(1, 9))
    costs, produces, needs = [], [], []
    for _ in range(n_cands):
        inside = draw(st.sets(st.integers(0, n_values - 1), min_size=1, max_size=3))
        out = draw(st.sets(st.sampled_from(sorted(inside)), min_size=1))
        need = set().union(*(reads[v] for v in inside)) - inside
        costs.append(draw(st.integers(1, 20)) / 4.0)
        produces.append(frozenset(out))
        needs.append(frozenset(need))
    required = draw(st.sets(st.integers(0, n_values - 1), min_size=1, max_size=3))
    return BLPProblem(costs, produces, needs, set(required), available)


@settings(max_examples=40)
@given(problems())
def test_blp_matches_brute_force(problem):
    best = brute_force(problem)
    res = solve_blp(problem, time_limit_s=5.0)
    if best is None:
        assert res.status == "infeasible"
        return
    assert res.status == "optimal"
    assert problem.feasible(res.chosen)
    assert abs(res.objective - best) < 1e-6
    assert abs(sum(problem.costs[i] for i in res.chosen) - best) < 1e-6


def test_recomputation_is_allowed():
    # value 0 feeds 1 and 2; the cheapest cover recomputes 0 inside both fused kernels
    problem = BLPProblem(
        costs=[1.0, 1.0, 1.0, 1.2, 1.2],
        produces=[frozenset({0}), frozenset({1}), frozenset({2}), frozenset({1}),
                  frozenset({2})],
        needs=[frozenset(), frozenset({0}), frozenset({0}), frozenset(), frozenset()],
        required={1, 2}, available=set())
    res = solve_blp(problem)
    assert res.status == "optimal" and sorted(res.chosen) == [3, 4]
    assert res.n_vars == 5 and res.n_constraints == 4


def test_infeasible_and_cuts():
    problem = BLPProblem([1.0], [frozenset({0})], [frozenset()], {1}, set())
    res = solve_blp(problem)
    assert res.status == "infeasible" and not res.ok
    problem = BLPProblem([1.0, 3.0], [frozenset({0}), frozenset({0})],
                         [frozenset(), frozenset()], {0}, set(),
                         extra_cuts=[frozenset({0})])
    res = solve_blp(problem)
    assert res.chosen == [1] and res.objective == 3.0
