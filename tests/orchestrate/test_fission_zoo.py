"""Fission on the model zoo, imported into Relax exactly as the benchmark imports it: no
composite op with a rule is left (except pools kept on purpose as one reduce primitive), nothing
but primitives remains, and (slow) the compiled model still gives the same outputs."""

# pylint: disable=missing-function-docstring
import pytest

pytest.importorskip("torch")

from tvm_ollie.models import list_models  # noqa: E402
from tvm_ollie.orchestrate.fission_zoo import _kept_as_primitive, fission_model  # noqa: E402


def _assert_fully_split(res):
    assert res.non_primitive_after == {}, res.line()
    for op_name in res.composite_after:
        assert _kept_as_primitive(res.report, op_name), res.line()


@pytest.mark.slow  # the whole BERT layer through fission and numerics (about 20 s)
def test_bert_quick_fully_split():
    res = fission_model("bert", quick=True)
    assert res.composite_before  # the layer has softmax, layer_norm and gelu
    assert res.composite_after == {}
    assert res.report.split == {"softmax": 1, "layer_norm": 2, "gelu": 1}
    _assert_fully_split(res)


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_zoo_model_fission_equivalent(name):
    res = fission_model(name, quick=True, check=True)
    _assert_fully_split(res)
    assert res.max_rel_diff < 1e-4, res.line()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "segformer", "longformer"])
def test_zoo_attention_rewrite_equivalent(name):
    res = fission_model(name, quick=True, check=True, attention=True)
    _assert_fully_split(res)
    assert res.max_rel_diff < 1e-4, res.line()
