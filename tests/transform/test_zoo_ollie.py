"""Every zoo model (quick size) built with the ollie pass, every rewrite it can make forced
(the cheapest alternative of each call, still verified), against PyTorch eager.

All ``slow``: the smallest model takes about a minute to derive and build on one core (the
default run's budget has no room); ``-m slow`` runs them.
"""

import logging

import pytest

pytest.importorskip("torch")

import zoo_check  # noqa: E402

logging.getLogger("tvm_ollie").setLevel(logging.ERROR)

SMALL = ["dcgan", "fsrcnn", "infogan"]
LARGE = ["bert", "candy", "csrnet", "efficientvit", "gcn", "longformer", "resnet18",
         "segformer", "yolox"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SMALL + LARGE)
def test_zoo_model_with_every_rewrite_matches_torch(name):
    rewritten, decisions, err, _ = zoo_check.check_model(name)
    assert decisions, f"{name}: no derivable operator"
    assert rewritten >= 1, f"{name}: nothing rewritten ({decisions} decisions)"
    assert err <= zoo_check.RTOL


def test_zoo_list_is_complete():
    from tvm_ollie.models import list_models

    assert sorted(SMALL + LARGE) == sorted(list_models())
