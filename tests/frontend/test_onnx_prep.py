"""ONNX models as exporters write them: dynamic axes and shape arithmetic, folded before import.

The issue's failure first (a ``Shape -> Cast -> Slice -> Concat -> Reshape`` chain that TVM's
importer cannot follow even with fixed input shapes), then models exported here by
``torch.onnx.export`` with dynamic batch/height/width: they import with ``--shape`` and their
outputs equal eager PyTorch. Zoo models and the dynamo exporter are ``slow``.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.frontend.loader import ModelLoadError, load_module, load_onnx
from tvm_ollie.frontend.onnx_prep import fold_constants, prepare_onnx

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
import torch_models as tm  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
SHAPE = [1, 3, 8, 12]


def _installed(name):
    return importlib.util.find_spec(name) is not None


SIMPLIFIERS = ["builtin"] + [
    pytest.param(name, marks=pytest.mark.skipif(not _installed(name), reason=f"no {name}"))
    for name in ("onnxsim", "onnxslim")
]


def cast_chain_model(extra_nodes=()):
    """conv -> relu -> reshape to ``Shape(y)[:2] + [-1]``, the shape passing through Cast."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([2], np.int64), "two")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT, name="to_float"),
        helper.make_node("Cast", ["sf"], ["si"], to=TensorProto.INT64, name="to_int"),
        helper.make_node("Slice", ["si", "zero", "two"], ["s2"], name="first_two"),
        helper.make_node("Concat", ["s2", "minus1"], ["target"], axis=0, name="concat"),
        helper.make_node("Reshape", ["r", "target"], ["y"], name="reshape"),
        *extra_nodes,
    ]
    out = extra_nodes[-1].output[0] if extra_nodes else "y"
    graph = helper.make_graph(
        nodes, "cast_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                            [1, 3, "height", "width"])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 4, "hw"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def run_relax(mod, *inputs):
    ex = tvm.compile(mod, "llvm")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in inputs])
    return out.numpy()


def test_issue_chain_fails_without_folding():
    # The issue's report: TVM's importer cannot turn the computed shape into a reshape target.
    with pytest.raises(ModelLoadError, match="Reshape requires the input new shape to be Shape"):
        load_onnx(cast_chain_model(), {"x": SHAPE}, simplifier="none")


def test_issue_chain_folds_and_matches_reference():
    model = cast_chain_model()
    x = np.random.default_rng(1).standard_normal(SHAPE).astype("float32")
    from onnx.reference import ReferenceEvaluator

    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(run_relax(load_onnx(model, {"x": SHAPE}), x), expected,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("simplifier", SIMPLIFIERS)
def test_each_simplifier_folds_the_chain(simplifier):
    prepared, info = prepare_onnx(cast_chain_model(), {"x": SHAPE}, simplifier=simplifier)
    assert info.simplifier == simplifier, info.notes
    assert [n.op_type for n in prepared.graph.node] == ["Conv", "Relu", "Reshape"]
    mod = load_onnx(cast_chain_model(), {"x": SHAPE}, simplifier=simplifier)
    assert "R.Tensor((1, 4, 96)" in mod.script()


def test_fold_constants_keeps_dynamic_chains():
    # Without fixed shapes the Shape node stays (its value is not known), nothing breaks.
    folded = fold_constants(cast_chain_model())
    assert "Shape" in [n.op_type for n in folded.graph.node]


def test_unsupported_operator_names_op_and_node():
    odd = helper.make_node("NoSuchOp", ["y"], ["z"], name="my_odd_node")
    with pytest.raises(ModelLoadError) as err:
        load_onnx(cast_chain_model([odd]), {"x": SHAPE})
    message = str(err.value)
    assert "operator NoSuchOp (node 'my_odd_node')" in message and "\n" not in message


def test_shapes_as_mapping_or_strings(tmp_path):
    path = str(tmp_path / "chain.onnx")
    onnx.save(cast_chain_model(), path)
    a = load_module(path, shapes=["x=1,3,8,12"])
    b = load_module(path, shapes={"x": (1, 3, 8, 12)})
    tvm.ir.assert_structural_equal(a, b)


def test_cli_shape_and_one_line_errors(tmp_path, capsys):
    from tvm_ollie.cli import main

    onnx.save(cast_chain_model(), str(tmp_path / "chain.onnx"))
    onnx.save(cast_chain_model([helper.make_node("NoSuchOp", ["y"], ["z"], name="odd")]),
              str(tmp_path / "odd.onnx"))

    def cli(*args):
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            code = main(list(args))
        finally:
            os.chdir(old)
        captured = capsys.readouterr()
        return code, [line for line in captured.err.splitlines() if line.strip()]

    code, errors = cli("lift", "chain.onnx", "--shape", "x=1,3,8,12")
    assert code == 0, errors
    code, errors = cli("lift", "odd.onnx", "--shape", "x=1,3,8,12")
    assert code != 0 and len(errors) == 1, errors
    assert "NoSuchOp" in errors[0] and "'odd'" in errors[0]
    code, errors = cli("lift", "chain.onnx")
    assert code != 0 and "--shape" in errors[-1]


def test_fold_keeps_graph_outputs_produced_by_nodes():
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    prepared, _ = prepare_onnx(model, {"x": [1, 5]}, simplifier="builtin")
    assert [n.op_type for n in prepared.graph.node] == ["Shape", "Relu"]
    onnx.checker.check_model(prepared)


def _export_and_compare(module, x, path, opset, dynamo, simplifier="auto"):
    tm.export_onnx(module, (x,), path, opset, dynamo)
    mod = load_onnx(path, shapes={"input0": list(x.shape)}, simplifier=simplifier)
    with torch.no_grad():
        expected = module(x).numpy()
    np.testing.assert_allclose(run_relax(mod, x.numpy()), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [11, pytest.param(13, marks=pytest.mark.slow), 17])
def test_torchscript_export_dynamic_axes(tmp_path, opset):
    module, x = tm.seeded(tm.ShapeChainNet)
    _export_and_compare(module, x, str(tmp_path / "m.onnx"), opset, dynamo=False)


def test_builtin_folding_of_a_torch_export(tmp_path):
    # What runs without onnxsim/onnxslim installed: our folding with onnx's reference evaluator.
    module, x = tm.seeded(tm.ShapeChainNet)
    _export_and_compare(module, x, str(tmp_path / "m.onnx"), 11, dynamo=False,
                        simplifier="builtin")


@pytest.mark.slow
@pytest.mark.parametrize("opset", [18])
def test_dynamo_export_dynamic_axes(tmp_path, opset):
    module, x = tm.seeded(tm.ShapeChainNet)
    _export_and_compare(module, x, str(tmp_path / "m.onnx"), opset, dynamo=True)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["candy", "yolox", "efficientvit"])
@pytest.mark.parametrize("opset, dynamo", [(11, False), (13, False), (17, False), (18, True)])
def test_zoo_models_exported_with_dynamic_axes(tmp_path, name, opset, dynamo):
    # Before folding, TVM's importer rejects all of these but candy/yolox at some opsets
    # ("Dynamic pads are not supported yet", "Reshape expects the input data to be a Tensor").
    from tvm_ollie.models.registry import get_model

    spec = get_model(name, quick=True)
    _export_and_compare(spec.module, spec.example_inputs[0], str(tmp_path / "m.onnx"), opset,
                        dynamo)
