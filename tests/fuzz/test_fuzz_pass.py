"""Differential fuzzing of the pass: random operators built by TVM and by the ollie build with
every alternative forced in turn (:mod:`differential`), outputs compared.

The default run is bounded (one hand-written and two generated examples per operator family,
two forced alternatives each); ``-m slow`` runs ``OLLIE_FUZZ_EXAMPLES`` examples (default 2000)
forcing ``OLLIE_FUZZ_ALTS`` alternatives each (default: all) of the ``OLLIE_FUZZ_FAMILY``
operators (``conv``, ``conv2d``, ``conv_transpose``, ``matmul``; default all), logs one JSON
line per case to ``OLLIE_FUZZ_LOG`` and fails at the end with every failure found.
``OLLIE_FUZZ_SEED`` seeds hypothesis (parallel runs draw different cases);
``OLLIE_FUZZ_PICK=random`` makes the first build of a case force a random alternative of each
unit instead of the cheapest: with ``OLLIE_FUZZ_ALTS=1`` that is one ollie build per case
(thousands of cases in an hour or two), every alternative still reached over many cases.
"""

import json
import logging
import os
import zlib
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, example, given, seed, settings

import differential as D
import op_strategies as S

logging.getLogger("tvm_ollie").setLevel(logging.CRITICAL)

#: alternatives forced per case in the default run (the cheapest first, then spread out)
BOUNDED_ALTS = 1
BOUNDED = settings(max_examples=2, deadline=None, phases=[Phase.explicit, Phase.generate],
                   suppress_health_check=list(HealthCheck))


def _record(stats: Counter, res) -> None:
    if res.skipped:
        event("skipped: TVM cannot build it")
        stats["skipped"] += 1
        return
    stats["cases"] += 1
    stats.update(res.counts())
    for kind in res.counts():
        event(f"outcome: {kind}")


#: one hand-written case per family (known to have alternatives), then generated ones
EXPLICIT = {
    "conv": S.fixed_case("conv2d", (1, 4, 6, 6), (8, 4, 3, 3), padding=(1, 0, 1, 2)),
    "conv_transpose": S.fixed_case("conv2d_transpose", (1, 4, 3, 3), (4, 2, 3, 3), strides=2,
                                   padding=1, output_padding=1),
    "matmul": S.fixed_case("matmul", (2, 6, 8), (8, 5)),
}


def _bounded(strategy, family: str) -> None:
    stats, texts = Counter(), []

    @BOUNDED
    @given(case=S.substantial(strategy))
    @example(case=EXPLICIT[family])
    def run(case):
        res = D.check_case(case, max_alts=BOUNDED_ALTS)
        texts.append(f"{case.text}: {res.alternatives} alternatives")
        _record(stats, res)
        assert not res.failures, f"{case.text}: {res.failures}"

    run()
    # not vacuous: some forced alternative was really built and compared
    assert stats["applied"] >= 1, f"{family}: nothing applied: {dict(stats)}; " + "; ".join(texts)


def test_fuzz_conv():
    _bounded(S.conv_cases(False), "conv")


def test_fuzz_conv_transpose():
    _bounded(S.conv_cases(True), "conv_transpose")


def test_fuzz_matmul():
    _bounded(S.matmul_cases(), "matmul")


@pytest.mark.slow
def test_fuzz_long():
    examples = D.fuzz_examples(2000)
    alts = os.environ.get("OLLIE_FUZZ_ALTS")
    max_alts = int(alts) if alts else None
    log_path = os.environ.get("OLLIE_FUZZ_LOG")
    random_pick = os.environ.get("OLLIE_FUZZ_PICK") == "random"
    stats, failures = Counter(), []

    @seed(int(os.environ.get("OLLIE_FUZZ_SEED", "0")))
    @settings(max_examples=examples, deadline=None, derandomize=False, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=S.substantial(S.any_case(os.environ.get("OLLIE_FUZZ_FAMILY", "all"))))
    def run(case):
        pick = zlib.crc32(case.text.encode()) if random_pick else None
        res = D.check_case(case, max_alts=max_alts, pick_seed=pick)
        _record(stats, res)
        stats[f"op:{case.op}"] += 1
        stats["forced_builds"] += len(res.outcomes)
        failures.extend((case.text, o.label, o.kind, o.detail) for o in res.failures)
        if log_path:
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"case": case.text, "alternatives": res.alternatives,
                                    "skipped": res.skipped, "counts": dict(res.counts()),
                                    "forced": [o.label for o in res.outcomes],
                                    "failures": [o.__dict__ for o in res.failures],
                                    "rejected": [o.__dict__ for o in res.outcomes
                                                 if o.kind != "applied"]}) + "\n")

    run()
    print(dict(stats))
    assert not failures, "\n".join(map(str, failures))
    assert stats["applied"] >= 1


def test_comparison_is_tight_enough_to_catch_a_dropped_term():
    """The tolerance grows with the reduction length, but a single dropped product of a
    reduction (about 1/R of the output's scale) still fails it."""
    rng = np.random.default_rng(0)
    for reduction in (1, 9, 72, 576):
        terms = rng.standard_normal((64, reduction))
        ref = terms.sum(axis=1)
        assert D._compare(ref.astype("float32"), ref, reduction) is None
        dropped = ref - terms[:, 0]
        assert D._compare(dropped, ref, reduction) is not None, reduction
