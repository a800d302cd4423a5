"""transform/blocked_layout: native transposed convolutions inside channels-last chains (guard
``member_deconv``).

A GCN-like decoder (conv -> deconv with the skip connection as its residual -> conv) is one
chain with the deconvolution reading and writing channels-last; a deconvolution whose data
comes from outside the chain reads it as NCHW (no entry); in a blocked format the chain is
found again without the deconvolution. Before/Expected compared structurally, numerics against
TVM's build of the original (Relax ``nn.conv2d_transpose``, no library)."""

import numpy as np
import pytest
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

import tvm
from test_blocked_layout import CONV, Net, build_pair, run, _w
from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform import blocked_layout as bl
from tvm_ollie.transform.blocked_layout import blocked_layout, member_deconv


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("native library without conv2d_preferred_format")


def deconv(net: Net, x, w, bias=None, res=None):
    """A 4x4 stride-2 transposed convolution (GCN's upsampling), NCHW / IOHW."""
    o = int(w.ty.shape[1])
    if not net.native:
        y = net.bb.emit(relax.op.nn.conv2d_transpose(x, w, strides=2, padding=1))
        if bias is not None:
            y = net.bb.emit(relax.op.add(y, relax.op.reshape(bias, (1, o, 1, 1))))
        return y if res is None else net.bb.emit(relax.op.add(y, res))
    call = lib.conv2d_transpose_call((2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 1)
    ops = [x, w]
    if bias is not None:
        call, ops = call.with_attrs(bias=1), ops + [bias]
    if res is not None:
        call, ops = call.with_attrs(res=1), ops + [res]
    n, _, h, wd = (int(s) for s in x.ty.shape)
    return net.bb.emit(lib.emit_call(call, ops, (n, o, 2 * h, 2 * wd)))


def decoder(net, x, c):
    """conv -> conv (stride 2) -> deconv (+ bias, + the first conv's output) -> conv, then a
    deconvolution of the input (data outside the chain) with that conv's output as residual."""
    skip = net.conv(x, c[0], act="relu")
    low = net.conv(skip, c[1], act="relu", stride=2)
    up = deconv(net, low, c[2], bias=c[3], res=skip)
    y = net.conv(up, c[4], act="relu")
    return deconv(net, x, c[5], res=deconv(net, y, c[6]))


def _weights(rng, c, o):
    return [_w(rng, o, c, 3, 3), _w(rng, o, o, 3, 3), _w(rng, o, o, 4, 4), _w(rng, o),
            _w(rng, o, o, 3, 3), _w(rng, c, o, 4, 4), _w(rng, o, o, 4, 4)]


@pytest.mark.parametrize("fmt", [None, "nhwc", "nChw8c"])
@pytest.mark.parametrize("c,o", [(16, 16), (5, 21)])
def test_decoder_numerics_vs_tvm(fmt, c, o):
    rng = np.random.default_rng(c * o)
    mod, ref_mod = build_pair(decoder, (1, c, 8, 8), _weights(rng, c, o))
    new, report = blocked_layout(mod, fmt=fmt)
    x = rng.standard_normal((1, c, 8, 8)).astype("float32")
    text = new.script()
    deconvs = [part.split(")")[0] for part in text.split("conv2d_transpose")[1:]]
    if fmt == "nChw8c":  # found again without the deconvolutions: the first two convs
        assert report.chains == [(2, "nChw8c")]
        assert all("src_fmt" not in d for d in deconvs)
    elif report.chains:  # None: oneDNN's preference
        assert report.chains == [(3, "nhwc")]
        assert (report.entries, report.exits) == (1, 1)  # x for the first conv; the result
        assert sum("src_fmt=nhwc;dst_fmt=nhwc" in d for d in deconvs) == 2
        assert sum("src_fmt=nchw;dst_fmt=nhwc" in d for d in deconvs) == 1  # reads x
    np.testing.assert_allclose(run(new, x), run(ref_mod, x), rtol=1e-4, atol=1e-4)


def test_member_deconv_refuses_formatted_calls():
    call = lib.conv2d_transpose_call((2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 1)
    x = relax.Var("x", relax.TensorType((1, 4, 3, 3), "float32"))
    w = relax.const(np.zeros((4, 4, 4, 4), "float32"))

    def emitted(c, shape):
        return relax.BlockBuilder().normalize(lib.emit_call(c, [x, w], shape))

    assert member_deconv(emitted(call, (1, 4, 6, 6))) is not None
    assert member_deconv(emitted(call.with_attrs(src_fmt="nhwc", dst_fmt="nhwc"),
                                 (1, 6, 6, 4))) is None
    conv = lib.conv2d_call((1, 1), (1,) * 4, (1, 1), 1, "NCHW", "OIHW")
    assert member_deconv(emitted(conv, (1, 4, 3, 3))) is None


D = "layout=NCHW;klayout=IOHW;stride=2,2;pad=1,1,1,1;opad=0,0;dil=1,1;groups=1;res=1"
C_IN = CONV + ";src_fmt=nhwc;dst_fmt=nhwc"


@I.ir_module
class ConvDeconvConv:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), "float32"), w1: R.Tensor((4, 4, 3, 3), "float32"),
             w2: R.Tensor((4, 4, 4, 4), "float32"), w3: R.Tensor((4, 4, 3, 3), "float32"),
             skip: R.Tensor((1, 4, 12, 12), "float32")) -> R.Tensor((1, 4, 12, 12), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), x, w1),
                                  out_ty=R.Tensor((1, 4, 6, 6), "float32"))
            u = R.call_dps_packed("tvm_ollie.cpu.conv2d_transpose", (R.str(D), y, w2, skip),
                                  out_ty=R.Tensor((1, 4, 12, 12), "float32"))
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), u, w3),
                                  out_ty=R.Tensor((1, 4, 12, 12), "float32"))
            R.output(z)
        return z


@I.ir_module
class ConvDeconvConvNhwc:
    @R.function
    def main(x: R.Tensor((1, 4, 6, 6), "float32"), w1: R.Tensor((4, 4, 3, 3), "float32"),
             w2: R.Tensor((4, 4, 4, 4), "float32"), w3: R.Tensor((4, 4, 3, 3), "float32"),
             skip: R.Tensor((1, 4, 12, 12), "float32")) -> R.Tensor((1, 4, 12, 12), "float32"):
        with R.dataflow():
            x_nhwc = R.layout_transform(x, index_map=lambda n, c, h, w: (n, h, w, c))
            y_nhwc = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(C_IN), x_nhwc, w1),
                                       out_ty=R.Tensor((1, 6, 6, 4), "float32"))
            skip_nhwc = R.layout_transform(skip, index_map=lambda n, c, h, w: (n, h, w, c))
            u_nhwc = R.call_dps_packed(
                "tvm_ollie.cpu.conv2d_transpose",
                (R.str(D + ";src_fmt=nhwc;dst_fmt=nhwc"), y_nhwc, w2, skip_nhwc),
                out_ty=R.Tensor((1, 12, 12, 4), "float32"))
            # the last convolution writes NCHW itself (exit_in_kernel)
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV + ";src_fmt=nhwc"), u_nhwc,
                                                            w3),
                                  out_ty=R.Tensor((1, 4, 12, 12), "float32"))
            R.output(z)
        return z


def test_before_expected():
    new, report = blocked_layout(ConvDeconvConv, fmt="nhwc")
    assert report.chains == [(2, "nhwc")]
    assert (report.entries, report.exits, report.plain_dests) == (2, 0, 1)
    tvm.ir.assert_structural_equal(new, ConvDeconvConvNhwc)


def test_a_library_without_deconv_formats_keeps_deconvs_nchw(monkeypatch):
    """A native library built before conv2d_transpose took src_fmt/dst_fmt (the probe
    ``deconv_takes_formats`` says so): the transposed convolution splits the chain as before."""
    assert bl.deconv_takes_formats()  # this checkout's library
    monkeypatch.setattr(bl, "deconv_takes_formats", lambda: False)
    new, report = blocked_layout(ConvDeconvConv, fmt="nhwc")
    assert report.chains == []  # two convs, no longer linked
    tvm.ir.assert_structural_equal(new, ConvDeconvConv)
