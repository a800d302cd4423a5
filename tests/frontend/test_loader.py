"""Model loading, target parsing, input handling and report formatting of the command line."""

import dataclasses
import json

import numpy as np
import pytest
import tiny_models
import tvm
from tvm import relax

from tvm_ollie.frontend.explain import (
    chosen_lines,
    decision_details,
    decision_table,
    format_time,
    other_operators,
    summary_line,
)
from tvm_ollie.frontend.inputs import (
    InputError,
    Param,
    arrange_inputs,
    load_signature,
    module_signature,
    read_input_files,
    save_signature,
)
from tvm_ollie.frontend.loader import ModelLoadError, bind_params, load_module, parse_shapes
from tvm_ollie.frontend.targets import TargetError, is_gpu, parse_target


def _run(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _x(seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, tiny_models.X_SHAPE).astype("float32")


# ----- models ---------------------------------------------------------------------------------


def test_onnx_weights_are_constants(tmp_path):
    path = str(tmp_path / "m.onnx")
    w, b = tiny_models.write_onnx(path)
    mod = load_module(path)
    assert [p.name for p in mod["main"].params] == ["x"]
    x = _x()
    np.testing.assert_allclose(_run(mod, x), tiny_models.reference(x, w, b), rtol=1e-4, atol=1e-5)


def test_onnx_shape_fixes_dynamic_batch(tmp_path):
    path = str(tmp_path / "m.onnx")
    tiny_models.write_onnx(path, dynamic_batch=True)
    sig = module_signature(load_module(path, shapes=["x=3,2,6,6"]))
    assert sig == [Param("x", (3, 2, 6, 6), "float32")]
    assert module_signature(load_module(path))[0].shape[0] is None


def test_onnx_shape_of_unknown_input(tmp_path):
    path = str(tmp_path / "m.onnx")
    tiny_models.write_onnx(path)
    with pytest.raises(ModelLoadError, match="not inputs"):
        load_module(path, shapes=["y=1,2"])


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_onnx_unsupported_operator(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    path = str(tmp_path / "bad_op.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    with pytest.raises(ModelLoadError, match="NoSuchOp"):
        load_module(path)


def test_json_module_round_trip(tmp_path):
    mod = tiny_models.relax_module()
    path = tmp_path / "m.json"
    path.write_text(tvm.ir.save_json(mod))
    loaded = load_module(str(path))
    tvm.ir.assert_structural_equal(loaded, mod)


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    (json.dumps({"a": 1}), "tvm.ir.save_json"),
])
def test_json_errors(tmp_path, content, match):
    path = tmp_path / "m.json"
    path.write_text(content)
    with pytest.raises(ModelLoadError, match=match):
        load_module(str(path))


@pytest.mark.parametrize("func", ["make", "make_detached"])
def test_python_function_params_are_bound(tmp_path, func):
    path = str(tmp_path / "model.py")
    tiny_models.write_python_model(path)
    mod = load_module(f"{path}:{func}")
    assert [p.name for p in mod["main"].params] == ["x"]
    x = _x()
    w, b = tiny_models.weights()
    np.testing.assert_allclose(_run(mod, x), tiny_models.reference(x, w, b), rtol=1e-4, atol=1e-5)


def test_python_function_errors(tmp_path):
    path = str(tmp_path / "model.py")
    tiny_models.write_python_model(path)
    with pytest.raises(ModelLoadError, match="no function 'nope'"):
        load_module(f"{path}:nope")
    with pytest.raises(ModelLoadError, match="returned int"):
        load_module(f"{path}:not_a_module")
    with pytest.raises(ModelLoadError, match="no such file"):
        load_module(str(tmp_path / "other.py") + ":make")


def test_bind_params_rejects_unknown_names():
    mod = tiny_models.relax_module(weights_as_params=True)
    with pytest.raises(ModelLoadError, match="not parameters"):
        bind_params(mod, {"q": np.zeros(3, "float32")})


@pytest.mark.parametrize("name, match", [
    ("missing.onnx", "no such model file"),
    ("model.pb", "unsupported model format"),
])
def test_bad_model_paths(tmp_path, name, match):
    path = tmp_path / name
    if name.endswith(".pb"):
        path.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match=match):
        load_module(str(path))


def test_corrupt_onnx(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"\x00garbage\xff")
    with pytest.raises(ModelLoadError, match="cannot read ONNX"):
        load_module(str(path))


@pytest.mark.parametrize("spec", ["x", "=1,2", "x=1,a", "x=0,2"])
def test_parse_shapes_errors(spec):
    with pytest.raises(ModelLoadError):
        parse_shapes([spec])


def test_parse_shapes():
    assert parse_shapes(["x=1,3,8,8", "y=4"]) == {"x": [1, 3, 8, 8], "y": [4]}


# ----- targets --------------------------------------------------------------------------------


def test_targets():
    assert parse_target("llvm")[0].kind.name == "llvm"
    target, _ = parse_target('{"kind": "llvm", "num-cores": 2}')
    assert int(target.attrs["num-cores"]) == 2
    target, _ = parse_target("nvidia/nvidia-h100")
    assert is_gpu(target) and target.host.kind.name == "llvm"
    target, note = parse_target("cuda")
    assert is_gpu(target)
    assert bool(note) == (not tvm.cuda(0).exist)


@pytest.mark.parametrize("text", ["llvmx", "llvm -mcpu=znver3", '{"kind": "llvm"', '{"kind": "x"}',
                                  "nvidia/no-such-gpu"])
def test_bad_targets(text):
    with pytest.raises(TargetError, match="bad target"):
        parse_target(text)


# ----- inputs ---------------------------------------------------------------------------------

SIG = [Param("x", (1, 2), "float32"), Param("y", (3,), "int32")]


def test_signature_file_round_trip(tmp_path):
    lib = str(tmp_path / "m.so")
    assert load_signature(lib) is None
    save_signature(lib, SIG)
    assert load_signature(lib) == SIG


def test_arrange_inputs_orders_and_converts():
    given = {"y": np.arange(3, dtype="int64"), "x": np.ones((1, 2), "float64")}
    arrays, notes = arrange_inputs(["x", "y"], given, SIG)
    assert [a.dtype for a in arrays] == [np.float32, np.int32]
    assert len(notes) == 2


def test_arrange_inputs_random_is_seeded():
    first, _ = arrange_inputs(["x", "y"], {}, SIG, random=True, seed=3)
    again, _ = arrange_inputs(["x", "y"], {}, SIG, random=True, seed=3)
    assert first[0].shape == (1, 2) and first[1].dtype == np.int32
    np.testing.assert_array_equal(first[0], again[0])


@pytest.mark.parametrize("given, random, sig, match", [
    ({"z": np.ones((1, 2), "float32")}, False, SIG, "unknown input z"),
    ({"x": np.ones((1, 2), "float32")}, False, SIG, "missing input y"),
    ({"x": np.ones((2, 2), "float32"), "y": np.ones(3, "int32")}, False, SIG, "shape"),
    ({"x": np.ones((1, 2), "float32"), "y": np.ones(3, "float32")}, False, SIG, "dtype"),
    ({}, True, None, "not known"),
])
def test_arrange_inputs_errors(given, random, sig, match):
    with pytest.raises(InputError, match=match):
        arrange_inputs(["x", "y"], given, sig, random=random)


def test_read_input_files(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(4))
    assert list(read_input_files([f"x={tmp_path / 'a.npy'}"])["x"]) == [0, 1, 2, 3]
    for spec, match in [("x", "NAME=FILE"), (f"x={tmp_path / 'b.npy'}", "no such input file")]:
        with pytest.raises(InputError, match=match):
            read_input_files([spec])
    (tmp_path / "c.npy").write_bytes(b"junk")
    with pytest.raises(InputError, match="cannot read"):
        read_input_files([f"x={tmp_path / 'c.npy'}"])


# ----- report text ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Decision:
    function: str
    var_name: str
    op_name: str
    signature: str
    chosen: str
    reason: str
    explain: str
    before_s: float
    after_s: float
    measured: bool
    candidates: list


def test_decision_text():
    decisions = [
        _Decision("main", "lv", "relax.nn.conv2d", "x: float32[1, 2, 6, 6]",
                  "matmul[36x18 @ 18x4] -> eop[offset-add]", "faster", "split r\nmerge",
                  2e-3, 1e-3, False, [1, 2, 3]),
        _Decision("main", "lv1", "relax.nn.relu", "", "original", "no candidate", "",
                  1e-5, 1e-5, True, []),
    ]
    table = decision_table(decisions)
    assert "relax.nn.conv2d" in table and "relax.nn.relu" in table
    assert "2.00x" in table and "2.000 ms*" in table and "estimated" in table
    details = decision_details(decisions)
    assert "split r" in details and "merge" in details and "candidates: 3" in details
    assert summary_line(decisions) == "2 derivable operators, 1 rewritten"
    assert chosen_lines(decisions).splitlines()[0] == (
        "[1] relax.nn.conv2d: matmul[36x18 @ 18x4] -> eop[offset-add]")


def test_other_operators_lists_undecided_calls():
    mod = tiny_models.relax_module()
    conv = _Decision("main", "lv", "relax.nn.conv2d", "", "original", "", "", 0, 0, False, 0)
    assert other_operators(mod, [conv]) == "relax.add x1, relax.nn.relu x1, relax.reshape x1"


@pytest.mark.parametrize("seconds, text", [
    (None, "-"), (2.5, "2.500 s"), (2e-3, "2.000 ms"), (3.5e-6, "3.5 us"), (4e-8, "40.0 ns"),
])
def test_format_time(seconds, text):
    assert format_time(seconds) == text
