"""transform/blocked_layout: chains of native convolutions kept in one activation format.

Before/Expected modules compared structurally, numerics against TVM's build of the original
(Relax ``nn.conv2d`` and friends, no library), formats forced and as oneDNN prefers, channels
that do not fill a block."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.blocked_layout import (blocked_layout, constant_to_format,
                                                formatted_shape)
from tvm_ollie.transform.choosing import native_everywhere

CONV = "layout=NCHW;klayout=OIHW;stride=1,1;pad=1,1,1,1;dil=1,1;groups=1"


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("native library without conv2d_preferred_format")


# ---------------------------------------------------------------------------------------------
# Small modules: each built twice, with native conv calls (what the pass sees) and with Relax
# nn.conv2d (TVM's build of the original, the numeric reference).

class Net:
    """A BlockBuilder program over NCHW tensors, emitted either way."""

    def __init__(self, native_convs: bool):
        self.native = native_convs
        self.bb = relax.BlockBuilder()

    def conv(self, x, w, bias=None, res=None, act=None, pad=1, stride=1):
        o, _, kh, _ = (int(s) for s in w.ty.shape)
        if not self.native:
            y = self.bb.emit(relax.op.nn.conv2d(x, w, strides=stride, padding=pad))
            if bias is not None:
                y = self.bb.emit(relax.op.add(y, relax.op.reshape(bias, (1, o, 1, 1))))
            if res is not None:
                y = self.bb.emit(relax.op.add(y, res))
            return self.bb.emit(relax.op.nn.relu(y)) if act == "relu" else y
        call = lib.conv2d_call((stride,) * 2, (pad,) * 4, (1, 1), 1, "NCHW", "OIHW")
        ops = [x, w]
        if bias is not None:
            call, ops = call.with_attrs(bias=1), ops + [bias]
        if res is not None:
            call, ops = call.with_attrs(res=1), ops + [res]
        if act:
            call = call.with_attrs(act=act)
        n, _, h, wd = (int(s) for s in x.ty.shape)
        oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kh) // stride + 1
        return self.bb.emit(lib.emit_call(call, ops, (n, o, oh, ow)))


def build_pair(program, x_shape, weights):
    """``program(net, x, consts) -> output`` as (native module, reference module)."""
    mods = []
    for native_convs in (True, False):
        net = Net(native_convs)
        x = relax.Var("x", relax.TensorType(x_shape, "float32"))
        with net.bb.function("main", [x]):
            with net.bb.dataflow():
                consts = [relax.const(w) for w in weights]
                out = net.bb.emit_output(program(net, x, consts))
            net.bb.emit_func_output(out)
        mods.append(net.bb.get())
    return mods


def run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _w(rng, *shape):
    return (rng.standard_normal(shape) * 0.3).astype("float32")


def relu_chain(net, x, c):
    y = net.conv(x, c[0], bias=c[1], act="relu")
    return net.conv(y, c[2], bias=c[3], act="relu")


def residual_block(net, x, c):
    """conv-relu-conv with the shortcut as the second conv's residual, an add of two chain
    values, a per-channel scale and a scalar shift."""
    y = net.conv(x, c[0], act="relu")
    z = net.conv(y, c[1], res=y, act="relu")
    s = net.bb.emit(relax.op.add(z, y))
    s = net.bb.emit(relax.op.multiply(s, c[2]))
    return net.bb.emit(relax.op.add(s, c[3]))


def branch(net, x, c):
    """A chain value also read by an NCHW consumer (max_pool2d) outside the chain."""
    y = net.conv(x, c[0], act="relu")
    p = net.bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
    z = net.conv(y, c[1], act="relu")
    zp = net.bb.emit(relax.op.nn.max_pool2d(z, pool_size=2, strides=2))
    return net.bb.emit(relax.op.add(p, zp))


def spatial(net, x, c):
    """Pooling, resize and a channel concatenation between the convolutions (channels-last
    chains only; a blocked chain is found again without them)."""
    y = net.conv(x, c[0], act="relu")
    p = net.bb.emit(relax.op.nn.max_pool2d(y, pool_size=2, strides=2))
    z = net.conv(p, c[1], act="relu")
    a = net.bb.emit(relax.op.nn.avg_pool2d(z, pool_size=3, strides=1, padding=1))
    u = net.bb.emit(relax.op.image.resize2d(a, (8, 8), method="nearest_neighbor"))
    cat = net.bb.emit(relax.op.concat([u, y], axis=1))
    w = net.conv(cat, c[2], act="relu")
    return net.bb.emit(relax.op.nn.adaptive_avg_pool2d(w, (2, 2)))


def _cases(rng, c, o):
    return {
        "relu_chain": (relu_chain, [_w(rng, o, c, 3, 3), _w(rng, o), _w(rng, o, o, 3, 3),
                                    _w(rng, o)]),
        "residual": (residual_block, [_w(rng, o, c, 3, 3), _w(rng, o, o, 3, 3),
                                      _w(rng, 1, o, 1, 1), np.float32(0.25).reshape(())]),
        "branch": (branch, [_w(rng, o, c, 3, 3), _w(rng, o, o, 3, 3)]),
        "spatial": (spatial, [_w(rng, o, c, 3, 3), _w(rng, o, o, 3, 3),
                              _w(rng, o, 2 * o, 3, 3)]),
    }


# ---------------------------------------------------------------------------------------------
# Numerics against TVM's build of the original.

@pytest.fixture(name="reference_outputs", scope="module")
def _reference_outputs():
    """TVM's output of a case's reference module, built once per (case, c, o): the four
    formats of one case share it (a build costs a second or more)."""
    return {}


@pytest.mark.parametrize("case", ["relu_chain", "residual", "branch", "spatial"])
@pytest.mark.parametrize("fmt", [None, "nhwc", "nChw8c", "nChw16c"])
@pytest.mark.parametrize("c,o", [(16, 16), (5, 13)])
def test_numerics_vs_tvm(case, fmt, c, o, reference_outputs):
    rng = np.random.default_rng(c * o)
    program, weights = _cases(rng, c, o)[case]
    mod, ref_mod = build_pair(program, (1, c, 8, 8), weights)
    new, report = blocked_layout(mod, fmt=fmt)
    x = rng.standard_normal((1, c, 8, 8)).astype("float32")
    if (case, c, o) not in reference_outputs:
        reference_outputs[case, c, o] = run(ref_mod, x)
    want = reference_outputs[case, c, o]
    if case == "spatial" and fmt not in (None, "nhwc"):
        # without the spatial operators no two convolutions touch: nothing to convert
        assert report.chains == []
    elif report.chains:  # None: oneDNN's preference, which may be NCHW on another CPU
        convs = 3 if case == "spatial" else 2
        assert report.chains == [(convs, fmt or report.chains[0][1])]
        assert "dst_fmt" in new.script()
    else:
        assert fmt is None
    np.testing.assert_allclose(run(new, x), want, rtol=1e-4, atol=1e-4)


def test_chain_of_one_conv_is_left_alone():
    rng = np.random.default_rng(0)

    def one(net, x, c):
        y = net.conv(x, c[0], act="relu")
        return net.bb.emit(relax.op.nn.relu(y))

    mod, _ = build_pair(one, (1, 8, 6, 6), [_w(rng, 8, 8, 3, 3)])
    new, report = blocked_layout(mod, fmt="nhwc")
    assert report.chains == []
    tvm.ir.assert_structural_equal(new, mod)


@pytest.mark.parametrize("stride", [1, 2])
def test_lone_conv_weights_packed(stride):
    """A convolution no chain takes keeps its NCHW activations but, with ``pack_weights``, gets
    its constant weight packed for its call (``wpacked=1``, ``kernel=KH,KW``): no transform is
    added, and it computes what TVM's build of the original does."""
    rng = np.random.default_rng(7)

    def one(net, x, c):
        y = net.conv(x, c[0], bias=c[1], act="relu", stride=stride)
        return net.bb.emit(relax.op.nn.relu(y))

    mod, ref_mod = build_pair(one, (1, 5, 9, 9), [_w(rng, 13, 5, 3, 3), _w(rng, 13)])
    new, report = blocked_layout(mod, pack_weights=True)
    assert report.chains == [] and report.lone_packed == 1
    script = new.script()
    assert script.count("wpacked=1") == 1 and "kernel=3,3" in script
    assert "layout_transform" not in script and "dst_fmt" not in script
    assert "lone convs' weights packed" in report.to_text()
    x = rng.standard_normal((1, 5, 9, 9)).astype("float32")
    np.testing.assert_allclose(run(new, x), run(ref_mod, x), rtol=1e-4, atol=1e-4)


def test_lone_conv_with_a_weight_parameter_is_left_alone():
    """Only constant weights are packed: a weight given at run time stays OIHW."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 6, 6), "float32"))
    w = relax.Var("w", relax.TensorType((8, 4, 3, 3), "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            call = lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW")
            y = bb.emit_output(bb.emit(lib.emit_call(call, [x, w], (1, 8, 6, 6))))
        bb.emit_func_output(y)
    mod = bb.get()
    new, report = blocked_layout(mod, pack_weights=True)
    assert report.lone_packed == 0
    tvm.ir.assert_structural_equal(new, mod)


def test_preferred_format_is_a_chain_format_or_skipped():
    rng = np.random.default_rng(1)
    mod, _ = build_pair(relu_chain, (1, 32, 8, 8),
                        [_w(rng, 32, 32, 3, 3), _w(rng, 32), _w(rng, 32, 32, 3, 3), _w(rng, 32)])
    _, report = blocked_layout(mod)
    assert all(f in ("nhwc", "nChw4c", "nChw8c", "nChw16c") for _, f in report.chains)


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="fmt must be"):
        blocked_layout(tvm.IRModule(), fmt="NCHW")


def test_constant_to_format():
    vec = np.arange(5, dtype="float32").reshape(1, 5, 1, 1)
    got = constant_to_format(vec, "nChw4c", 5)
    assert got.shape == formatted_shape((1, 5, 1, 1), "nChw4c") == (1, 2, 1, 1, 4)
    np.testing.assert_array_equal(got.reshape(-1), [0, 1, 2, 3, 4, 0, 0, 0])
    assert constant_to_format(vec, "nhwc", 5).shape == (1, 1, 1, 5)
    assert constant_to_format(np.zeros((5, 1, 1), "float32"), "nhwc", 5).shape == (1, 1, 1, 5)
    assert constant_to_format(np.zeros((1, 5, 2, 1), "float32"), "nhwc", 5) is None


# ---------------------------------------------------------------------------------------------
# Before / Expected.

A1 = CONV + ";bias=1;act=relu"
A_IN = A1 + ";src_fmt=nhwc;dst_fmt=nhwc"
A_BLK = A1 + ";src_fmt=nChw8c;dst_fmt=nChw8c;src_c=5;dst_c=5"
A_MID = CONV + ";src_fmt=nhwc;dst_fmt=nhwc"
# the chain's last convolution writes NCHW itself (exit_in_kernel): no exit transform after it
A_LAST = A1 + ";src_fmt=nhwc"
A_BLK_LAST = A1 + ";src_fmt=nChw8c;src_c=5"


@I.ir_module
class ReluChain:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             b1: R.Tensor((5,), "float32"), w2: R.Tensor((5, 5, 3, 3), "float32"),
             b2: R.Tensor((5,), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A1), x, w1, b1),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A1), y, w2, b2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@I.ir_module
class ReluChainNhwc:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             b1: R.Tensor((5,), "float32"), w2: R.Tensor((5, 5, 3, 3), "float32"),
             b2: R.Tensor((5,), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            x_nhwc = R.layout_transform(x, index_map=lambda n, c, h, w: (n, h, w, c))
            y_nhwc = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_IN), x_nhwc, w1, b1),
                                       out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_LAST), y_nhwc, w2, b2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@I.ir_module
class ReluChainBlocked:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             b1: R.Tensor((5,), "float32"), w2: R.Tensor((5, 5, 3, 3), "float32"),
             b2: R.Tensor((5,), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            x_b = R.layout_transform(x, index_map=lambda n, c, h, w: (n, c // 8, h, w, c % 8),
                                     pad_value=0.0)
            y_b = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_BLK), x_b, w1, b1),
                                    out_ty=R.Tensor((1, 1, 6, 6, 8), "float32"))
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_BLK_LAST), y_b, w2, b2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@I.ir_module
class Branch:
    """conv -> (relu, and an NCHW consumer) -> conv."""

    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), x, w1),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            r = R.nn.relu(y)
            s = R.sum(y, axis=[2, 3], keepdims=True)
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), r, w2),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            out = R.add(z, s)
            R.output(out)
        return out


@I.ir_module
class BranchNhwc:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            x_nhwc = R.layout_transform(x, index_map=lambda n, c, h, w: (n, h, w, c))
            y_nhwc = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_MID), x_nhwc, w1),
                                       out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            y = R.layout_transform(y_nhwc, index_map=lambda n, h, w, c: (n, c, h, w))
            r_nhwc = R.nn.relu(y_nhwc)
            s = R.sum(y, axis=[2, 3], keepdims=True)
            z_nhwc = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_MID), r_nhwc, w2),
                                       out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            # read by a TVM operator: the exit stays (TVM fuses it into the add)
            z = R.layout_transform(z_nhwc, index_map=lambda n, h, w, c: (n, c, h, w))
            out = R.add(z, s)
            R.output(out)
        return out


A_RES = CONV + ";res=1;src_fmt=nhwc;dst_fmt=nhwc"


@I.ir_module
class ResidualLast:
    """The chain's last convolution adds a chain value (its residual): it cannot write NCHW
    (the residual would have to be read in NCHW), so the exit stays."""

    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), x, w1),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV + ";res=1"), y, w2, y),
                                  out_ty=R.Tensor((1, 5, 6, 6), "float32"))
            R.output(z)
        return z


@I.ir_module
class ResidualLastNhwc:
    @R.function
    def main(x: R.Tensor((1, 5, 6, 6), "float32"), w1: R.Tensor((5, 5, 3, 3), "float32"),
             w2: R.Tensor((5, 5, 3, 3), "float32")) -> R.Tensor((1, 5, 6, 6), "float32"):
        with R.dataflow():
            x_nhwc = R.layout_transform(x, index_map=lambda n, c, h, w: (n, h, w, c))
            y_nhwc = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_MID), x_nhwc, w1),
                                       out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            z_nhwc = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(A_RES), y_nhwc, w2,
                                                                 y_nhwc),
                                       out_ty=R.Tensor((1, 6, 6, 5), "float32"))
            z = R.layout_transform(z_nhwc, index_map=lambda n, h, w, c: (n, c, h, w))
            R.output(z)
        return z


@pytest.mark.parametrize("before,fmt,expected,exits,in_kernel", [
    (ReluChain, "nhwc", ReluChainNhwc, 0, 1),
    (ReluChain, "nChw8c", ReluChainBlocked, 0, 1),
    (Branch, "nhwc", BranchNhwc, 2, 0),
    (ResidualLast, "nhwc", ResidualLastNhwc, 1, 0),
])
def test_before_expected(before, fmt, expected, exits, in_kernel):
    new, report = blocked_layout(before, fmt=fmt)
    assert report.chains == [(2, fmt)]
    assert (report.exits, report.plain_dests) == (exits, in_kernel)
    assert ("exits written by their conv" in report.to_text()) == bool(in_kernel)
    tvm.ir.assert_structural_equal(new, expected)


@pytest.mark.parametrize("fmt", ["nhwc", "nChw8c", "nChw16c"])
@pytest.mark.parametrize("c,o", [(16, 16), (5, 13), (13, 150)])
def test_exit_in_kernel_numerics_vs_tvm(fmt, c, o):
    """The chain's last convolution writing NCHW (rule ``exit_in_kernel``; a classifier's
    1x1 convolution after a 3x3 one, as Segformer's head) computes what TVM's build of the
    original does, in every format, whole blocks or not."""
    rng = np.random.default_rng(c + o)

    def head(net, x, w):
        y = net.conv(x, w[0], bias=w[1], act="relu")
        return net.conv(y, w[2], bias=w[3], pad=0)

    weights = [_w(rng, c, c, 3, 3), _w(rng, c), _w(rng, o, c, 1, 1), _w(rng, o)]
    mod, ref_mod = build_pair(head, (1, c, 7, 9), weights)
    new, report = blocked_layout(mod, fmt=fmt)
    assert (report.exits, report.plain_dests) == (0, 1)
    assert new.script().count("R.layout_transform") == 1  # the entry only
    x = rng.standard_normal((1, c, 7, 9)).astype("float32")
    np.testing.assert_allclose(run(new, x), run(ref_mod, x), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# In the pass (OllieConfig.blocked_layout).

def _relax_chain(rng):
    weights = [_w(rng, 16, 8, 3, 3), _w(rng, 16), _w(rng, 16, 16, 3, 3), _w(rng, 16)]
    return build_pair(relu_chain, (1, 8, 8, 8), weights)[1]


@pytest.mark.parametrize("on,pack", [(True, False), (False, False), (True, True)])
def test_in_optimize_module(on, pack):
    """With every conv on its native kernel, the option converts the chain (or, off, leaves
    the convs NCHW), and the result computes what TVM's build of the original does."""
    from tvm_ollie.transform.optimize import optimize_module

    rng = np.random.default_rng(4)
    mod = _relax_chain(rng)
    new, report = optimize_module(mod, target="llvm", trials=0, derive=False,
                                  chooser=native_everywhere, blocked_layout=on,
                                  pack_weights=pack, check_untuned=False)
    x = rng.standard_normal((1, 8, 8, 8)).astype("float32")
    np.testing.assert_allclose(run(new, x), run(mod, x), rtol=1e-4, atol=1e-4)
    if not on:
        assert report.layouts is None and "dst_fmt" not in new.script()
    else:
        assert report.layouts is not None
        assert ("dst_fmt" in new.script()) == bool(report.layouts.chains)
        # packed inside the chain, or outside every chain (pack_lone_weights)
        assert ("wpacked=1" in new.script()) == pack
        assert "layouts:" in report.to_text()


@pytest.mark.parametrize("fmt", [None, "nhwc", "nChw8c"])
@pytest.mark.parametrize("case", ["relu_chain", "residual"])
def test_pack_weights(fmt, case):
    """``pack_weights``: the chain's constant weights packed at compile time (``wpacked=1``),
    same numbers as TVM's build of the original."""
    rng = np.random.default_rng(9)
    program, weights = _cases(rng, 5, 13)[case]
    mod, ref_mod = build_pair(program, (1, 5, 8, 8), weights)
    new, report = blocked_layout(mod, fmt=fmt, pack_weights=True)
    assert new.script().count("wpacked=1") == 2  # in the chain, or each conv alone
    assert report.lone_packed == (0 if report.chains else 2)
    x = rng.standard_normal((1, 5, 8, 8)).astype("float32")
    np.testing.assert_allclose(run(new, x), run(ref_mod, x), rtol=1e-4, atol=1e-4)


@I.ir_module
class ManyEntries:
    """Two convolutions, but three tensors enter the chain and two leave it: more transforms
    (5) than reorders saved (4)."""

    @R.function
    def main(x: R.Tensor((1, 16, 6, 6), "float32"), e1: R.Tensor((1, 16, 6, 6), "float32"),
             e2: R.Tensor((1, 16, 6, 6), "float32"), w1: R.Tensor((16, 16, 3, 3), "float32"),
             w2: R.Tensor((16, 16, 3, 3), "float32")) -> R.Tensor((1, 16, 6, 6), "float32"):
        with R.dataflow():
            y = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), x, w1),
                                  out_ty=R.Tensor((1, 16, 6, 6), "float32"))
            a = R.add(y, e1)
            b = R.add(a, e2)
            z = R.call_dps_packed("tvm_ollie.cpu.conv2d", (R.str(CONV), b, w2),
                                  out_ty=R.Tensor((1, 16, 6, 6), "float32"))
            s = R.sum(y, axis=[2, 3], keepdims=True)
            out = R.add(z, s)
            R.output(out)
        return out


def test_saves_reorders_guard():
    if native.conv2d_preferred_format(CONV, (1, 16, 6, 6), (16, 16, 3, 3))[0] == "nchw":
        pytest.skip("oneDNN prefers NCHW sources here: the counts differ")
    new, report = blocked_layout(ManyEntries)
    assert report.chains == [] and "more transforms" in report.to_text()
    tvm.ir.assert_structural_equal(new, ManyEntries)
    forced, report = blocked_layout(ManyEntries, fmt="nhwc")  # a forced format skips the guard
    assert report.chains == [(2, "nhwc")] and report.entries == 3 and report.exits == 2


def test_a_preferred_blocked_format_with_spatial_members_is_not_dry_run(monkeypatch):
    """oneDNN preferring a blocked format for a chain with pooling in it: the chain is found
    again without its channels-last-only members (no conversion of a 5-D tensor for a pool:
    the reorder guard's dry run used to try it and fail on ResNet-18)."""
    bl = __import__("tvm_ollie.transform.blocked_layout", fromlist=["choose_format"])
    monkeypatch.setattr(bl, "choose_format", lambda _chain, _bindings: "nChw16c")
    rng = np.random.default_rng(3)
    program, weights = _cases(rng, 16, 16)["spatial"]
    mod, ref_mod = build_pair(program, (1, 16, 8, 8), weights)
    new, report = blocked_layout(mod)
    assert report.chains == []  # without the spatial operators no two convolutions touch
    x = rng.standard_normal((1, 16, 8, 8)).astype("float32")
    np.testing.assert_allclose(run(new, x), run(ref_mod, x), rtol=1e-4, atol=1e-4)


def test_a_failing_layout_step_leaves_the_module_nchw(monkeypatch):
    """An optional step never fails the build: the layout step raising leaves the rewritten
    module as it was, and the report says why."""
    from tvm_ollie.transform import optimize as opt

    def broken(*_args, **_kwargs):
        raise ValueError("a bug in the layout step")

    monkeypatch.setattr(opt, "blocked_layout", broken)
    rng = np.random.default_rng(5)
    mod = _relax_chain(rng)
    new, report = opt.optimize_module(mod, target="llvm", trials=0, derive=False,
                                      chooser=native_everywhere, check_untuned=False)
    assert "layout step failed: ValueError: a bug" in report.layouts.skipped[0]
    assert "dst_fmt" not in new.script()
    x = rng.standard_normal((1, 8, 8, 8)).astype("float32")
    np.testing.assert_allclose(run(new, x), run(mod, x), rtol=1e-4, atol=1e-4)
