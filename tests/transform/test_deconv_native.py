"""relax.nn.conv2d_transpose on the native library: its call form, its analytic estimate, the
Decider's "original [native]" alternative chosen by build(), and bias/relu epilogues folded into
the kernel call."""

import logging

import numpy as np
import pytest
import tvm
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.lift import lift_relax_call
from tvm_ollie.pipeline import build
from tvm_ollie.transform.epilogue import fuse_epilogues
from tvm_ollie.tune import analytic
from tvm_ollie.tune.calibrate import Calibration

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)

pytestmark = pytest.mark.skipif(
    not native.provides(native.CONV2D_TRANSPOSE),
    reason="native library unavailable or without conv2d_transpose")

#: a fixed calibration: the library's transposed convolution at its measured order (0.5)
CALIB = Calibration("llvm", sm.LLVM_CALIB.peak_flops, sm.LLVM_CALIB.bandwidth,
                    dict(sm.LLVM_CALIB.efficiency, native_conv_transpose=0.5), "given")
NATIVE = "original [native]"


def _deconv(epilogue=False, **attrs):
    """conv2d_transpose 1x6x7x7 -> 4 (k4, IOHW), optionally + bias -> relu."""
    opts = dict(strides=2, padding=1)
    opts.update(attrs)
    groups = opts.get("groups", 1)

    def body(bb, x, w, *b):
        y = relax.op.nn.conv2d_transpose(x, w, **opts)
        if not epilogue:
            return y
        y = bb.emit(y)
        return relax.op.nn.relu(relax.op.add(y, relax.op.reshape(b[0], (1, 4, 1, 1))))

    params = [tensor_var("x", (1, 6, 7, 7)), tensor_var("w", (6, 4 // groups, 4, 4))]
    return single_function_module(params + ([tensor_var("b", (4,))] if epilogue else []), body)


def _call(mod):
    return mod["main"].body.blocks[0].bindings[0].value


def _deconv_call(**attrs):
    """A bare conv2d_transpose call (float32, NCHW data, IOHW weight unless given)."""
    x = relax.Var("x", relax.TensorType((1, 6, 7, 7), "float32"))
    w = relax.Var("w", relax.TensorType((6, 6, 4, 4), "float32"))
    return relax.BlockBuilder().normalize(relax.op.nn.conv2d_transpose(x, w, **attrs))


def test_call_form_of_conv2d_transpose():
    form = lib.call_form(_deconv_call(strides=3, padding=(1, 0, 2, 1), output_padding=(2, 1),
                                      dilation=(1, 2)))
    assert form.func == lib.CONV2D_TRANSPOSE and form.kind == "conv2d_transpose"
    assert form.text() == ("layout=NCHW;klayout=IOHW;stride=3,3;pad=1,0,2,1;opad=2,1;dil=1,2;"
                           "groups=1")
    # no kernel: another layout, another output type
    assert lib.call_form(_deconv_call(kernel_layout="OIHW")) is None
    assert lib.call_form(_deconv_call(out_layout="NHWC")) is None
    assert lib.call_form(_deconv_call(out_dtype="float16")) is None


def test_emitted_call_is_recognized():
    form = lib.call_form(_deconv_call(strides=2, padding=1))
    x = relax.Var("x", relax.TensorType((1, 6, 7, 7), "float32"))
    w = relax.Var("w", relax.TensorType((6, 6, 4, 4), "float32"))
    found = lib.lib_call_of(lib.emit_call(form, [x, w], (1, 6, 14, 14)))
    assert found is not None and found[0] == form and len(found[1]) == 2


def test_native_estimate_counts_the_useful_work():
    call = _deconv_call(strides=2, padding=1)
    expr = lift_relax_call(call)
    assert analytic.useful_flops(expr, "relax.nn.conv2d_transpose") == 2.0 * 6 * 49 * 6 * 16
    assert analytic.useful_flops(expr, "relax.nn.conv2d") is None
    native_s = analytic.original_seconds(expr, "relax.nn.conv2d_transpose", CALIB, "native")
    tvm_s = analytic.original_seconds(expr, "relax.nn.conv2d_transpose", CALIB, "tvm")
    assert 0 < native_s < tvm_s


def test_build_chooses_the_native_kernel_when_it_is_fastest():
    mod = _deconv(strides=2, padding=(1, 0, 1, 1), output_padding=1)
    labels = []

    def timer(_mod, label):
        alt = label.split("|")[-1]
        labels.append(alt)
        return 1e-4 if alt == NATIVE else 10e-3

    ex, report = build(mod, "llvm", timer=timer, max_depth=1, search_time_s=2.0,
                       calibration=CALIB)
    (d,) = [d for d in report.decisions if d.op_name == "relax.nn.conv2d_transpose"]
    assert NATIVE in labels and d.chosen == NATIVE, d.reason
    assert f"call  {lib.CONV2D_TRANSPOSE} in:" in ex.as_text()  # the VM calls the kernel
    args = sm.random_inputs(mod, seed=3)
    sm.assert_close(sm.run(ex, args), sm.run(tvm.compile(mod, target="llvm"), args))


@pytest.mark.parametrize("groups", [1, 2])
def test_bias_and_relu_fold_into_the_kernel(groups):
    mod = _deconv(epilogue=True, groups=groups)
    call = _call(mod)
    rewritten = relax.BlockBuilder()
    params = list(mod["main"].params)
    with rewritten.function("main", params):
        with rewritten.dataflow():
            y = rewritten.emit(lib.emit_call(lib.call_form(call), params[:2], (1, 4, 14, 14)))
            b = rewritten.emit(relax.op.reshape(params[2], (1, 4, 1, 1)))
            y = rewritten.emit(relax.op.add(y, b))
            out = rewritten.emit_output(relax.op.nn.relu(y))
        rewritten.emit_func_output(out)
    fused, counts = fuse_epilogues(rewritten.get())
    assert counts == {"conv2d_transpose": 2}
    args = sm.random_inputs(mod, seed=groups)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    sm.assert_close(sm.run(tvm.compile(fused, target="llvm"), args), ref)


def test_calibration_measures_the_native_transposed_convolution():
    from tvm_ollie.tune.calibrate import measure_native_efficiency

    eff = measure_native_efficiency()
    assert 0 < eff["native_conv_transpose"] <= 1.0


#: the GAN generators' quick layers (models/gan.py): (data shape, out channels, k, stride, pad)
GAN_LAYERS = [((1, 12, 1, 1), 64, 4, 1, 0), ((1, 64, 4, 4), 32, 4, 2, 1),
              ((1, 16, 16, 16), 8, 4, 2, 1), ((1, 8, 32, 32), 3, 4, 2, 1),
              ((1, 56, 2, 2), 32, 4, 2, 1)]


@pytest.mark.parametrize("layer", GAN_LAYERS, ids=lambda l: "x".join(map(str, l[0])))
def test_gan_layers_with_folded_epilogue_match_tvm(layer):
    """conv2d_transpose + bias + relu (tanh on the RGB output), as the GAN generators run it
    after the epilogue fold, against TVM's own build of the Relax ops: the kernel's default,
    oneDNN on the plain formats and fmt=gemm."""
    import tvm_ffi

    shape, o, k, s, p = layer
    act = "tanh" if o == 3 else "relu"

    def body(bb, x, w, b):
        y = bb.emit(relax.op.nn.conv2d_transpose(x, w, strides=s, padding=p))
        y = bb.emit(relax.op.add(y, relax.op.reshape(b, (1, o, 1, 1))))
        return relax.op.tanh(y) if act == "tanh" else relax.op.nn.relu(y)

    mod = single_function_module([tensor_var("x", shape), tensor_var("w", (shape[1], o, k, k)),
                                  tensor_var("b", (o,))], body)
    args = sm.random_inputs(mod, seed=o)
    ref = sm.run(tvm.compile(mod, target="llvm"), args)
    form = lib.call_form(_call(mod)).with_attrs(bias=1, act=act)
    kernel = tvm_ffi.get_global_func(lib.CONV2D_TRANSPOSE)
    for fmt in (None, "plain", "gemm"):
        text = form.text() if fmt is None else form.with_attrs(fmt=fmt).text()
        out = np.full(ref.shape, np.nan, "float32")
        kernel(text, *[tvm_ffi.from_dlpack(a) for a in args], tvm_ffi.from_dlpack(out))
        sm.assert_close(out, ref)
