"""transform/blocked_layout: instance norms and pads as chain members (guards ``member_norm``,
``member_pad``), so that a network whose convolutions are separated by norms and mirror pads
(Candy) is one chain. Before/Expected, and numerics against TVM's build of the original
(Relax ``nn.conv2d``, ``nn.instance_norm``, ``nn.pad``, ``image.resize2d``; no library)."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform import blocked_layout as bl
from tvm_ollie.transform.blocked_layout import blocked_layout

CONV1 = "layout=NCHW;klayout=OIHW;stride=1,1;pad=1,1,1,1;dil=1,1;groups=1"
CONV0 = "layout=NCHW;klayout=OIHW;stride=1,1;pad=0,0,0,0;dil=1,1;groups=1"
NORM = "eps=1e-05;scale=1;bias=1;act=relu"


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("native library without conv2d_preferred_format")
    if not bl.norm_takes_formats():
        pytest.skip("native library without instance_norm's formats")


# ---------------------------------------------------------------------------------------------
# Before / Expected.

@I.ir_module
class NormPad:
    """conv -> instance norm + relu -> reflect pad -> conv (Candy's pattern)."""

    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             g: R.Tensor((5,), "float32"), b: R.Tensor((5,), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV1), x, w1),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            n = R.call_dps_packed("tvm_ollie.cpu.instance_norm", (R.str(NORM), y, g, b),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            p = R.nn.pad(n, pad_width=[0, 0, 0, 0, 1, 1, 1, 1], pad_mode="reflect")
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV0), p, w2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@I.ir_module
class NormPadNhwc:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             g: R.Tensor((5,), "float32"), b: R.Tensor((5,), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            x_nhwc = R.layout_transform(x, index_map=lambda n, c, h, w: (n, h, w, c))
            y_nhwc = R.call_dps_packed(
                "tvm_ollie.cpu.conv2d", (R.str(CONV1 + ";src_fmt=nhwc;dst_fmt=nhwc"), x_nhwc, w1),
                out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            n_nhwc = R.call_dps_packed(
                "tvm_ollie.cpu.instance_norm", (R.str(NORM + ";fmt=nhwc"), y_nhwc, g, b),
                out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            p_nhwc = R.nn.pad(n_nhwc, pad_width=[0, 0, 1, 1, 1, 1, 0, 0], pad_mode="reflect")
            # the last convolution writes NCHW itself (exit_in_kernel)
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV0 + ";src_fmt=nhwc"), p_nhwc,
                                                            w2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@I.ir_module
class NormPadBlocked:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             g: R.Tensor((5,), "float32"), b: R.Tensor((5,), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            x_b = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 8, h, w, c % 8),
                                     pad_value=0.0)
            blk = ";src_fmt=nChw8c;dst_fmt=nChw8c;src_c=5;dst_c=5"
            y_b = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV1 + blk), x_b, w1),
                                    out_ty=R.Tensor((1, 1, 6, 6, 8), "float32"))
            n_b = R.call_dps_packed(
                "tvm_ollie.cpu.instance_norm", (R.str(NORM + ";fmt=nChw8c;c=5"), y_b, g, b),
                out_ty=R.Tensor((1, 1, 6, 6, 8), "float32"))
            p_b = R.nn.pad(n_b, pad_width=[0, 0, 0, 0, 1, 1, 1, 1, 0, 0], pad_mode="reflect")
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d",
                                  (R.str(CONV0 + ";src_fmt=nChw8c;src_c=5"), p_b, w2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@pytest.mark.parametrize("fmt,expected", [("nhwc", NormPadNhwc), ("nChw8c", NormPadBlocked)])
def test_before_expected(fmt, expected):
    new, report = blocked_layout(NormPad, fmt=fmt)
    assert report.chains == [(2, fmt)]
    tvm.ir.assert_structural_equal(new, expected)


def test_a_library_without_norm_formats_keeps_the_norm_nchw(monkeypatch):
    """A library built before the norm's formats: the norm is no member, so the two
    convolutions do not touch and nothing is converted."""
    monkeypatch.setattr(bl, "norm_takes_formats", lambda: False)
    new, report = blocked_layout(NormPad, fmt="nhwc")
    assert report.chains == []
    tvm.ir.assert_structural_equal(new, NormPad)


# ---------------------------------------------------------------------------------------------
# Numerics: a small Candy, built with native calls (what the pass sees) and with Relax
# operators (TVM's build of the original).

class Net:
    """A BlockBuilder program over NCHW tensors, emitted with native calls or Relax ops."""

    def __init__(self, native_calls: bool):
        self.native = native_calls
        self.bb = relax.BlockBuilder()

    def emit(self, expr):
        return self.bb.emit(expr)

    def conv(self, x, w, stride=1):
        o, _, kh, _ = (int(s) for s in w.ty.shape)
        if not self.native:
            return self.emit(relax.op.nn.conv2d(x, w, strides=stride))
        call = lib.conv2d_call((stride,) * 2, (0,) * 4, (1, 1), 1, "NCHW", "OIHW")
        n, _, h, wd = (int(s) for s in x.ty.shape)
        oh, ow = (h - kh) // stride + 1, (wd - kh) // stride + 1
        return self.emit(lib.emit_call(call, [x, w], (n, o, oh, ow)))

    def norm(self, x, g, b, res=None, relu=True):
        if not self.native:
            y = self.emit(relax.op.nn.instance_norm(x, g, b, channel_axis=1, axes=[2, 3]))
            y = self.emit(relax.op.add(y, res)) if res is not None else y
            return self.emit(relax.op.nn.relu(y)) if relu else y
        call = lib.LibCall(lib.INSTANCE_NORM, (("eps", "1e-05"), ("scale", "1"), ("bias", "1")))
        ops = [x, g, b]
        if res is not None:
            call, ops = call.with_attrs(res=1), ops + [res]
        if relu:
            call = call.with_attrs(act="relu")
        return self.emit(lib.emit_call(call, ops, tuple(int(s) for s in x.ty.shape)))

    def pad(self, x, k, mode="reflect", value=0.0):
        return self.emit(relax.op.nn.pad(x, [0, 0, 0, 0, k, k, k, k], mode, value))

    def reflect_take(self, x, k):
        """A reflection pad as the PyTorch exporter writes it: ``take`` along H, then W."""
        for axis in (2, 3):
            size = int(x.ty.shape[axis])
            idx = (size - 1) - np.abs((size - 1) - np.abs(np.arange(-k, size + k)))
            x = self.emit(relax.op.take(x, relax.const(idx.astype("int64")), axis=axis))
        return x

    def up(self, x):
        n, c, h, w = (int(s) for s in x.ty.shape)
        return self.emit(relax.op.image.resize2d(x, (2 * h, 2 * w), method="nearest_neighbor",
                                                 coordinate_transformation_mode="asymmetric",
                                                 rounding_method="floor"))


def small_candy(net, x, c):
    """Candy's structure with its pads and norms: reflect pad + conv + norm/relu (stride 2),
    a residual block (the shortcut as the second norm's residual; its first pad as PyTorch
    exports a reflection pad, two ``take``), a nearest upsample, a constant pad, and a last
    conv that the function returns."""
    y = net.norm(net.conv(net.pad(x, 2), c["w0"]), c["g0"], c["b0"])
    y = net.norm(net.conv(net.pad(y, 1, "replicate"), c["w1"], stride=2), c["g1"], c["b1"])
    a = net.norm(net.conv(net.reflect_take(y, 1), c["w2"]), c["g2"], c["b2"])
    r = net.norm(net.conv(net.pad(a, 1), c["w3"]), c["g3"], c["b3"], res=y, relu=False)
    z = net.norm(net.conv(net.pad(net.up(r), 1, "constant", 0.5), c["w4"]), c["g4"], c["b4"])
    return net.conv(net.pad(z, 2), c["w5"])


def _weights(rng, cin, mid):
    def w(*shape):
        return (rng.standard_normal(shape) * 0.3).astype("float32")

    shapes = {"w0": (mid, cin, 5, 5), "w1": (mid, mid, 3, 3), "w2": (mid, mid, 3, 3),
              "w3": (mid, mid, 3, 3), "w4": (mid, mid, 3, 3), "w5": (3, mid, 5, 5)}
    out = {k: w(*s) for k, s in shapes.items()}
    for k in range(5):
        out[f"g{k}"] = 1 + w(mid)
        out[f"b{k}"] = w(mid)
    return out


def build_pair(x_shape, weights):
    mods = []
    for native_calls in (True, False):
        net = Net(native_calls)
        x = relax.Var("x", relax.TensorType(x_shape, "float32"))
        with net.bb.function("main", [x]):
            with net.bb.dataflow():
                consts = {k: relax.const(v) for k, v in weights.items()}
                out = net.bb.emit_output(small_candy(net, x, consts))
            net.bb.emit_func_output(out)
        mods.append(net.bb.get())
    return mods


def run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(name="reference_outputs", scope="module")
def _reference_outputs():
    return {}


@pytest.mark.parametrize("fmt", [None, "nhwc", "nChw8c"])
@pytest.mark.parametrize("mid", [8, 5])
def test_small_candy_vs_tvm(fmt, mid, reference_outputs):
    """One chain of the six convolutions in channels-last (the first reads the padded input as
    it prefers; one exit); in ``nChw8c`` the upsample and the constant pad by 0.5 are
    channels-last only, so the chain splits there."""
    rng = np.random.default_rng(mid)
    weights = _weights(rng, 3, mid)
    mod, ref_mod = build_pair((1, 3, 12, 12), weights)
    x = rng.standard_normal((1, 3, 12, 12)).astype("float32")
    if mid not in reference_outputs:
        reference_outputs[mid] = run(ref_mod, x)
    new, report = blocked_layout(mod, fmt=fmt)
    script = new.script()
    if fmt == "nChw8c":
        assert report.chains == [(4, fmt), (2, fmt)]
    elif report.chains:  # None: oneDNN's preference, which may be NCHW on another CPU
        assert report.chains == [(6, report.chains[0][1])]
        assert report.exits + report.plain_dests == 1
        assert script.count("fmt=" + report.chains[0][1]) >= 5  # the norms' and convs' formats
    np.testing.assert_allclose(run(new, x), reference_outputs[mid], rtol=1e-4, atol=1e-4)


@I.ir_module
class TakeChannels:
    """A ``take`` along the channel axis is no member (it would move channels between
    blocks): the convolutions do not touch."""

    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV1), x, w1),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            t = R.take(y, R.const(np.array([4, 3, 2, 1, 0], "int64")), axis=1)
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV1), t, w2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


def test_take_along_channels_is_no_member():
    new, report = blocked_layout(TakeChannels, fmt="nhwc")
    assert report.chains == []
    tvm.ir.assert_structural_equal(new, TakeChannels)
