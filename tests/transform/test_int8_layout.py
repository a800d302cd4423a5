"""Chains of int8 convolutions in NHWC (:mod:`tvm_ollie.transform.int8_layout`): quantized
models built with ``onnx.helper`` (zero points, per-channel scales, saturation at the 8-bit
limits, a residual ``QLinearAdd`` and a pooling inside the chain) through ``ollie.build``,
bit-exact against ONNX Runtime with and without the layout pass; the guards on small Relax
functions; the library's format query."""

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform import int8_layout as L
from tvm_ollie.transform.int8_kernels import int8_kernels

FRONTEND_TESTS = os.path.join(os.path.dirname(__file__), "..", "frontend")


def _require():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    if not native.provides(L.CONV2D_INT8_PREFERRED_FORMAT):
        pytest.skip("the loaded native library predates conv2d_int8_preferred_format")


def _require_s8_conv_exact(x_type):
    """The int8-source chains need the int8 rewrite: without VNNI oneDNN's s8-source
    convolutions halve the weights (its s8s8 compensation) and the rewrite keeps TVM's
    convolutions (tests/transform/test_int8_kernels.py tests that fallback)."""
    if np.dtype(x_type) == np.int8 and not native.int8_exact_products():
        pytest.skip("s8-source convolutions without VNNI halve the weights (oneDNN's s8s8 path)")


def _cases():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    sys.path.insert(0, FRONTEND_TESTS)
    import onnx_op_cases  # pylint: disable=import-outside-toplevel

    return onnx_op_cases


def _qconv(c, rng, name, src, quant, cin, cout, x_type, per_channel, y_scale, inits, nodes):
    """A 3x3 QLinearConv ``name`` (pad 1) reading ``src``, quantized as ``{quant}_scale``,
    ``{quant}_zp``; int32 bias, weight zero point 0 (as quantizers write)."""
    from onnx import helper  # pylint: disable=import-outside-toplevel

    w = c._ints(rng, np.int8, (cout, cin, 3, 3), *c._weight_range(x_type, np.int8, False))
    w_scale = (rng.random(cout if per_channel else ()) * 0.01 + 0.001).astype(np.float32)
    inits += [c._init(f"{name}_w", w), c._init(f"{name}_ws", w_scale),
              c._init(f"{name}_wzp", np.zeros(w_scale.shape, np.int8)),
              c._init(f"{name}_scale", np.float32(y_scale)),
              c._init(f"{name}_zp", c._ints(rng, x_type, ())),
              c._init(f"{name}_b", rng.integers(-3000, 3000, cout).astype(np.int32))]
    nodes.append(helper.make_node(
        "QLinearConv", [src, f"{quant}_scale", f"{quant}_zp", f"{name}_w", f"{name}_ws",
                        f"{name}_wzp", f"{name}_scale", f"{name}_zp", f"{name}_b"], [name],
        pads=[1, 1, 1, 1]))


def chain_model(x_type=np.uint8, per_channel=True, last_scale=0.05, seed=0, residual=False):
    """``x -> QuantizeLinear -> conv a -> conv b [-> QLinearAdd(a, b)] -> MaxPool -> conv c ->
    DequantizeLinear``; a small ``last_scale`` saturates many of conv c's outputs."""
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    c = _cases()
    rng = np.random.default_rng(seed)
    inits = [c._init("q_scale", np.float32(0.02)), c._init("q_zp", c._ints(rng, x_type, ())),
             c._init("s_scale", np.float32(0.06)), c._init("s_zp", c._ints(rng, x_type, ()))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "q_scale", "q_zp"], ["q"])]
    _qconv(c, rng, "a", "q", "q", 4, 8, x_type, per_channel, 0.05, inits, nodes)
    _qconv(c, rng, "b", "a", "a", 8, 8, x_type, per_channel, 0.04, inits, nodes)
    if residual:
        nodes.append(helper.make_node("QLinearAdd", ["a", "a_scale", "a_zp", "b", "b_scale",
                                                     "b_zp", "s_scale", "s_zp"], ["s"],
                                      domain="com.microsoft"))
    pooled = "s" if residual else "b"
    nodes.append(helper.make_node("MaxPool", [pooled], ["p"], kernel_shape=[2, 2],
                                  strides=[2, 2]))
    _qconv(c, rng, "c", "p", pooled, 8, 8, x_type, per_channel, last_scale, inits, nodes)
    nodes.append(helper.make_node("DequantizeLinear", ["c", "c_scale", "c_zp"], ["y"]))
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32) * 2
    model = c._model(nodes, [c._value("x", TensorProto.FLOAT, x.shape)],
                     [c._value("y", TensorProto.FLOAT, None)], inits, domains=("com.microsoft",))
    return model, {"x": x}


def kernel_timer(_module, label: str) -> float:
    """A fake timer under which the requantizing int8 kernels are the fastest form of every
    int8 unit (the decision is timed: tests/transform/test_int8_choice.py), so that the
    chains this file tests are the ones built."""
    return 1e-6 if label.endswith("-requant") else 1e-3


def _build_and_run(model, feeds, layout: bool, monkeypatch):
    import tvm_ollie as ollie  # pylint: disable=import-outside-toplevel
    from tvm_ollie.frontend.loader import load_onnx  # pylint: disable=import-outside-toplevel
    from tvm_ollie.transform import optimize  # pylint: disable=import-outside-toplevel

    if not layout:
        monkeypatch.setattr(optimize, "int8_kernels",
                            lambda mod, choice=None: int8_kernels(mod, False, choice))
    mod = load_onnx(model, None, simplifier="none")
    ex, report = ollie.build(mod, target="llvm", trials=0, derive=False, timer=kernel_timer)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(v) for v in feeds.values()]).numpy()
    return out, report.inference_folds


@pytest.mark.parametrize("x_type, per_channel, last_scale", [
    (np.uint8, True, 0.05), (np.uint8, False, 0.002), (np.int8, True, 0.001)])
def test_chain_in_nhwc_equals_onnxruntime(x_type, per_channel, last_scale, monkeypatch):
    """Three requantizing convolutions and the pooling in one NHWC chain: outputs bit-exact
    against ONNX Runtime, and equal to the build without the layout pass."""
    _require()
    _require_s8_conv_exact(x_type)
    model, feeds = chain_model(x_type, per_channel, last_scale)
    theirs = _cases().run_ort(model, feeds)[0]
    ours, folds = _build_and_run(model, feeds, True, monkeypatch)
    assert folds.get("int8_conv2d_requant") == 3, folds
    assert folds.get("int8_nhwc_chains") == 1 and folds.get("int8_nhwc_convs") == 3, folds
    assert folds.get("int8_nhwc_permutes") == 2, folds  # one entry, one exit
    assert np.array_equal(ours, theirs)  # bit-exact
    info = np.iinfo(x_type)
    c_zp = [i for i in model.graph.initializer if i.name == "c_zp"][0]
    scale = [i for i in model.graph.initializer if i.name == "c_scale"][0]
    from onnx import numpy_helper  # pylint: disable=import-outside-toplevel
    limits = (np.array([info.min, info.max], np.float32) - numpy_helper.to_array(c_zp)) * \
        numpy_helper.to_array(scale)
    if last_scale < 0.01:  # saturation at the 8-bit limits is part of what is compared
        assert np.isin(ours, limits).any()
    plain, plain_folds = _build_and_run(model, feeds, False, monkeypatch)
    assert "int8_nhwc_chains" not in plain_folds
    assert np.array_equal(plain, ours)


@pytest.mark.parametrize("x_type, last_scale", [(np.uint8, 0.05), (np.int8, 0.002)])
def test_residual_add_joins_the_chain(x_type, last_scale, monkeypatch):
    """With the residual ``QLinearAdd`` between the convolutions the chain is still one (the
    add's decomposition is elementwise) and the outputs equal the build without the layout pass
    exactly; for uint8 (ONNX Runtime's arithmetic as a table inside the chain) also bit-exact
    against ONNX Runtime."""
    _require()
    _require_s8_conv_exact(x_type)
    model, feeds = chain_model(x_type, True, last_scale, residual=True)
    ours, folds = _build_and_run(model, feeds, True, monkeypatch)
    assert folds.get("int8_nhwc_chains") == 1 and folds.get("int8_nhwc_convs") == 3, folds
    assert folds.get("int8_nhwc_permutes") == 2, folds
    if x_type is np.uint8:
        assert np.array_equal(ours, _cases().run_ort(model, feeds)[0])
    plain, plain_folds = _build_and_run(model, feeds, False, monkeypatch)
    assert "int8_nhwc_chains" not in plain_folds
    assert np.array_equal(plain, ours)


def _conv_function(convs: int, broadcast: bool = False):
    """``convs`` requantizing int8 conv calls in a row (4 -> 4 channels, 6x6, u8), then an add
    of a constant that broadcasts a chain value when ``broadcast``."""
    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "uint8"))
    call = lib.conv2d_int8_call((1, 1), (1, 1, 1, 1), (1, 1), 1, xzp=True, requant="channel")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(convs):
                operands = [y, relax.const(rng.integers(-60, 60, (4, 4, 3, 3)).astype(np.int8)),
                            relax.const(np.array([128], np.int32)),
                            relax.const(np.full(4, 0.01, np.float32)),
                            relax.const(np.zeros(4, np.float32)),
                            relax.const(np.array([3], np.int32))]
                y = bb.emit(lib.emit_call(call, operands, (1, 4, 6, 6), "uint8"))
            wide = bb.emit(relax.op.astype(y, "int32"))
            other = relax.const(np.ones((2, 4, 6, 6) if broadcast else (1, 4, 1, 1), np.int32))
            out = bb.emit_output(bb.emit(relax.op.add(wide, other)))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def test_guards_and_the_rewrite_on_relax():
    """Two convolutions and a per-channel add: one chain (the constant re-laid out), same
    values; one convolution (``chain_length``) or an add that broadcasts a chain value
    (``member_elementwise``: it is left outside, its operand leaves the chain) change
    accordingly."""
    _require()
    x = np.random.default_rng(4).integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)
    mod = _conv_function(2)
    after, report = L.int8_layout(mod)
    assert report.chains == [2] and report.entries == 1 and report.exits == 1
    assert after.script().count("layout=NHWC;klayout=OHWI") == 2
    assert np.array_equal(_run(after, x), _run(mod, x))
    single, report = L.int8_layout(_conv_function(1))
    assert not report.chains and "layout=NHWC" not in single.script()
    wide = _conv_function(2, broadcast=True)
    after, report = L.int8_layout(wide)
    assert report.chains == [2] and report.exits == 1
    assert "R.add(lv" in after.script() and np.array_equal(_run(after, x), _run(wide, x))


def test_int8_kernels_without_layout_keeps_nchw():
    _require()
    mod = _conv_function(2)
    assert L.int8_layout(mod)[1].chains == [2]
    # the pass's entry point: with layout=False nothing turns NHWC (and the weights are packed)
    from tvm_ollie.transform.int8_kernels import pack_conv_weights  # pylint: disable=C0415
    packed = pack_conv_weights(mod)
    if native.provides(native.CONV2D_INT8_PACK_WEIGHT):
        assert packed.script().count("wpacked=1") == 2
    assert "layout=NHWC" not in packed.script()


def test_preferred_format_query():
    """``conv2d_int8_preferred_format`` names a plain format or ``other`` for source and
    destination and refuses attrs with ``wpacked``."""
    _require()
    fmt = L.preferred_format("pad=1,1,1,1;xzp=1", (1, 16, 8, 8), "uint8", (16, 16, 3, 3),
                             (1, 16, 8, 8), "int32")
    assert len(fmt) == 2 and all(f in ("nchw", "nhwc", "other") for f in fmt)
    same = L.preferred_format("layout=NHWC;klayout=OHWI;pad=1,1,1,1;xzp=1", (1, 8, 8, 16),
                              "uint8", (16, 3, 3, 16), (1, 8, 8, 16), "int32")
    assert same == fmt  # oneDNN's choice does not depend on the caller's layout
    with pytest.raises(Exception, match="wpacked"):
        L.preferred_format.__wrapped__("xzp=1;wpacked=1;kernel=3,3", (1, 16, 8, 8), "uint8",
                                       (16, 16, 3, 3), (1, 16, 8, 8), "int32")
