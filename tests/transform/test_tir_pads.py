"""transform/tir_pads: the ONNX importer's TOPI pads (``call_tir``) recognised as ``nn.pad``, so
that they join a chain (``blocked_layout``); numerics against TVM's build of the original."""

import numpy as np
import pytest
import tvm
from tvm import relax, topi

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform import blocked_layout as bl
from tvm_ollie.transform.tir_pads import pads_as_ops, recognised_pad


def _pad_module(make, shape=(1, 4, 6, 5)):
    """``main(x) = make(bb, x)`` (emit_te, as the ONNX importer does)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(make(bb, x))
        bb.emit_func_output(y)
    return bb.get()


def _binding(mod):
    """The call_tir of ``main``."""
    return next(b.value for b in mod["main"].body.blocks[0].bindings
                if isinstance(b.value, relax.Call))


@pytest.mark.parametrize("mode,topi_pad", [
    ("reflect", lambda x, b, a: topi.nn.mirror_pad(x, b, a, "REFLECT")),
    ("replicate", topi.nn.replicate_pad),
    ("constant", lambda x, b, a: topi.nn.pad(x, b, a, 0.0)),
])
@pytest.mark.parametrize("before,after", [([0, 0, 1, 1], [0, 0, 1, 1]),
                                          ([0, 0, 2, 0], [0, 0, 1, 3])])
def test_recognised_and_equal(mode, topi_pad, before, after):
    mod = _pad_module(lambda bb, x: bb.emit_te(topi_pad, x, before, after))
    found = recognised_pad(mod, _binding(mod))
    assert found == (mode, [0, 0, 0, 0, before[2], after[2], before[3], after[3]])
    func = pads_as_ops(mod, mod["main"])
    assert "R.nn.pad" in func.script()
    new = tvm.IRModule({"main": func})
    x = np.random.default_rng(0).standard_normal((1, 4, 6, 5)).astype("float32")
    outs = []
    for m in (mod, new):
        vm = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize("make", [
    lambda bb, x: bb.emit_te(topi.nn.mirror_pad, x, [0, 0, 1, 1], [0, 0, 1, 1], "SYMMETRIC"),
    lambda bb, x: bb.emit_te(topi.nn.pad, x, [0, 0, 1, 1], [0, 0, 1, 1], 0.5),
    lambda bb, x: bb.emit_te(topi.nn.pad, x, [0, 1, 1, 1], [0, 0, 1, 1], 0.0),
    lambda bb, x: bb.emit_te(lambda t: topi.nn.relu(topi.nn.pad(t, [0, 0, 1, 1], [0, 0, 1, 1])),
                             x),
])
def test_other_primfuncs_are_not_pads(make):
    """A symmetric mirror pad, a constant pad by 0.5, a pad of the channels and a pad fused with
    a relu are not ``nn.pad``'s reflect/replicate/zero pads of the spatial axes."""
    mod = _pad_module(make)
    assert recognised_pad(mod, _binding(mod)) is None
    func = mod["main"]
    assert pads_as_ops(mod, func) is func


CONV0 = "layout=NCHW;klayout=OIHW;stride=1,1;pad=0,0,0,0;dil=1,1;groups=1"


def _conv_pad_conv(native_convs: bool, w1, w2):
    """conv -> reflect pad (the importer's call_tir) -> conv, NCHW."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            def conv(v, w, shape):
                if native_convs:
                    call = lib.LibCall(lib.CONV2D, tuple(
                        kv.split("=") for kv in CONV0.split(";")))
                    return bb.emit(lib.emit_call(call, [v, relax.const(w)], shape))
                return bb.emit(relax.op.nn.conv2d(v, relax.const(w)))

            y = conv(x, w1, (1, 8, 8, 8))
            p = bb.emit_te(topi.nn.mirror_pad, y, [0, 0, 1, 1], [0, 0, 1, 1], "REFLECT")
            out = bb.emit_output(conv(p, w2, (1, 8, 8, 8)))
        bb.emit_func_output(out)
    return bb.get()


def test_importer_pad_joins_a_chain():
    if not native.available() or not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("native library without conv2d_preferred_format")
    rng = np.random.default_rng(1)
    w1, w2 = ((rng.standard_normal((8, 8, 3, 3)) * 0.3).astype("float32") for _ in range(2))
    mod, ref = _conv_pad_conv(True, w1, w2), _conv_pad_conv(False, w1, w2)
    new, report = bl.blocked_layout(mod, fmt="nhwc")
    assert report.chains == [(2, "nhwc")] and report.tir_pads == 1
    x = rng.standard_normal((1, 8, 10, 10)).astype("float32")
    outs = []
    for m in (new, ref):
        vm = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)
