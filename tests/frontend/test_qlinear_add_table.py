"""com.microsoft ``QLinearAdd`` as ONNX Runtime computes it (:func:`tvm_ollie.frontend.
onnx_quant.qlinear_add_table`): the table against ONNX Runtime on all 65536 input pairs for
random scales and zero points (uint8 and int8), and the decomposed operator through TVM's
import, bit-exact."""

import numpy as np
import pytest

from onnx_op_cases import _init, _ints, _model, _value, run_ort
from tvm_ollie.frontend.onnx_quant import qlinear_add_table


def _avx2() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return " avx2" in f.read()
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not _avx2(), reason="the table is MLAS's AVX2 arithmetic")


def _add_model(dtype, shape, params):
    from onnx import helper  # pylint: disable=import-outside-toplevel

    a_scale, a_zp, b_scale, b_zp, c_scale, c_zp = params
    inits = [_init("a_scale", np.float32(a_scale)), _init("a_zp", np.array(a_zp, dtype)),
             _init("b_scale", np.float32(b_scale)), _init("b_zp", np.array(b_zp, dtype)),
             _init("c_scale", np.float32(c_scale)), _init("c_zp", np.array(c_zp, dtype))]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("QLinearAdd", ["a", "a_scale", "a_zp", "b", "b_scale", "b_zp",
                                           "c_scale", "c_zp"], ["c"], domain="com.microsoft")
    return _model([node], [_value("a", elem, shape), _value("b", elem, shape)],
                  [_value("c", elem, None)], inits, domains=("com.microsoft",))


def _params(rng, dtype):
    info = np.iinfo(dtype)
    scales = [float(np.float32(rng.random() * 0.2 + 1e-3)) for _ in range(3)]
    zps = [int(rng.integers(info.min, info.max + 1)) for _ in range(3)]
    return scales[0], zps[0], scales[1], zps[1], scales[2], zps[2]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_table_equals_onnxruntime_on_every_pair(dtype):
    pytest.importorskip("onnxruntime")
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1).astype(dtype)
    a, b = np.repeat(values, values.size), np.tile(values, values.size)
    rng = np.random.default_rng(21)
    for _ in range(6):
        params = _params(rng, dtype)
        theirs = run_ort(_add_model(dtype, [a.size], params), {"a": a, "b": b})[0]
        assert np.array_equal(qlinear_add_table(*params, dtype), theirs), params


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_same_shape_add_imports_as_the_table(dtype):
    """Through the import (``Gather`` of the table: TVM's ``take``), bit-exact; with a
    broadcast operand the float formula stays (no table)."""
    pytest.importorskip("onnxruntime")
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    from tvm_ollie.frontend.loader import load_onnx  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(22)
    params = _params(rng, dtype)
    feeds = {"a": _ints(rng, dtype, (2, 8, 5, 5)), "b": _ints(rng, dtype, (2, 8, 5, 5))}
    model = _add_model(dtype, [2, 8, 5, 5], params)
    mod = load_onnx(model, None, simplifier="none")
    assert "R.take(" in mod.script()
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    ours = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    assert np.array_equal(ours, run_ort(model, feeds)[0])
    broadcast = _add_model(dtype, [2, 8, 5, 5], params)
    broadcast.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 1
    assert "R.take(" not in load_onnx(broadcast, None, simplifier="none").script()
