"""tvm_ollie.cpu.conv2d on blocked and channels-last activations (src_fmt/dst_fmt: oneDNN's
nChw{B}c as 5-D tensors, nhwc as 4-D) and tvm_ollie.cpu.conv2d_preferred_format, against
numpy."""

import numpy as np
import pytest

from native_util import ACTS, PARAM_ACTS, act_ref, call_direct, call_relax, require_native
from test_native_conv2d import conv_ref
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("the loaded native library predates blocked activations")


def to_blocked(x, b):
    """NCHW -> [N, ceil(C/b), H, W, b], padding channels zero (numpy's nChw{b}c); b = -1:
    NHWC."""
    if b == -1:
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    n, c, h, w = x.shape
    cb = -(-c // b)
    xp = np.zeros((n, cb * b, h, w), x.dtype)
    xp[:, :c] = x
    return np.ascontiguousarray(xp.reshape(n, cb, b, h, w).transpose(0, 1, 3, 4, 2))


def from_blocked(y, c):
    """[N, CB, H, W, b] (or NHWC) -> NCHW with the first c channels."""
    if y.ndim == 4:
        return y.transpose(0, 3, 1, 2)
    n, cb, h, w, b = y.shape
    return y.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)[:, :c]


def _fmt(blk):
    return "nhwc" if blk == -1 else f"nChw{blk}c"


def _blocked_case(rng, c, o, src_blk, dst_blk, k=3, pad=(1, 1, 1, 1), stride=(1, 1),
                  groups=1, bias=False, res=False, act="none", relax_build=False,
                  size=(2, 7, 6)):
    n, h, w = size
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((o, c // groups, k, k)).astype("float32")
    bv = rng.standard_normal(o).astype("float32")
    ref = conv_ref(x, wt, stride, pad, (1, 1), groups)
    if bias:
        ref = ref + bv[None, :, None, None]
    rv = rng.standard_normal(ref.shape).astype("float32")
    if res:
        ref = ref + rv
    ref = act_ref(ref, act)
    attrs = (f"layout=NCHW;klayout=OIHW;stride={stride[0]},{stride[1]};"
             f"pad={','.join(map(str, pad))};dil=1,1;groups={groups};bias={int(bias)};"
             f"res={int(res)};act={act}")
    if src_blk:
        attrs += f";src_fmt={_fmt(src_blk)}" + (f";src_c={c}" if src_blk > 0 else "")
        x = to_blocked(x, src_blk)
    out_shape = ref.shape
    if dst_blk:
        attrs += f";dst_fmt={_fmt(dst_blk)}" + (f";dst_c={o}" if dst_blk > 0 else "")
        rv = to_blocked(rv, dst_blk)
        out_shape = to_blocked(ref.astype("float32"), dst_blk).shape
    arrays = [x, wt] + ([bv] if bias else []) + ([rv] if res else [])
    run = call_relax if relax_build else call_direct
    out = run(native.CONV2D, attrs, arrays, out_shape)
    return out, ref


@pytest.mark.parametrize("blk", [4, 8, 16, -1])
@pytest.mark.parametrize("c,o", [(16, 32), (13, 21), (3, 16), (32, 5)])
@pytest.mark.parametrize("sides", ["src", "dst", "both"])
def test_blocked_layouts(blk, c, o, sides):
    rng = np.random.default_rng(blk + c + o)
    src = blk if sides in ("src", "both") else 0
    dst = blk if sides in ("dst", "both") else 0
    out, ref = _blocked_case(rng, c, o, src, dst, bias=True)
    got = from_blocked(out, o) if dst else out
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-3)
    if dst > 0 and o % blk:
        assert np.all(out[:, -1, :, :, o % blk:] == 0)  # padding channels are zero


@pytest.mark.parametrize("act", ACTS + PARAM_ACTS)
def test_blocked_epilogues(act):
    """Bias, residual (sum post-op) and every activation on blocked src and dst, with channels
    that do not fill the last block: the padding stays zero even where act(0) != 0."""
    rng = np.random.default_rng(len(act))
    out, ref = _blocked_case(rng, 12, 20, 16, 16, bias=True, res=True, act=act)
    np.testing.assert_allclose(from_blocked(out, 20), ref, rtol=1e-4, atol=1e-3)
    assert np.all(out[:, -1, :, :, 4:] == 0)


@pytest.mark.parametrize("blk", [16, -1])
def test_blocked_strided_grouped_and_relax(blk):
    rng = np.random.default_rng(7)
    out, ref = _blocked_case(rng, 32, 32, blk, blk, stride=(2, 2), groups=32, act="relu")
    np.testing.assert_allclose(from_blocked(out, 32), ref, rtol=1e-4, atol=1e-3)
    out, ref = _blocked_case(rng, 24, 40, 8, blk, k=1, pad=(0, 0, 0, 0), bias=True,
                             relax_build=True)
    np.testing.assert_allclose(from_blocked(out, 40), ref, rtol=1e-4, atol=1e-3)
    out, ref = _blocked_case(rng, 6, 9, blk, 4, groups=3, res=True)
    np.testing.assert_allclose(from_blocked(out, 9), ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("c, bias, res, act", [(3, False, False, "silu"), (3, True, True, "relu"),
                                                (16, True, False, "none")])
def test_one_channel_block_is_channels_last(c, bias, res, act):
    """16 output channels in NHWC from an NCHW source, YOLOX's stem after rule
    ``space_to_depth_conv`` (kernel 6, stride 2, padding 2): oneDNN picks nChw16c for dst here,
    byte for byte NHWC, which the kernel writes in place without a reorder (the residual read
    there too); and 16 channels in NHWC on both sides."""
    rng = np.random.default_rng(c + len(act))
    src = 0 if c == 3 else -1
    out, ref = _blocked_case(rng, c, 16, src, -1, k=6, pad=(2, 2, 2, 2), stride=(2, 2),
                             bias=bias, res=res, act=act, size=(2, 20, 18))
    np.testing.assert_allclose(from_blocked(out, 16), ref, rtol=1e-4, atol=1e-3)


def test_blocked_garbage_padding_in_src_is_ignored():
    """A src whose padding channels hold finite non-zero values gives the same result: the
    weights' padding is zero (a producer's epilogue may leave act(0) there)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 5, 4, 4)).astype("float32")
    wt = rng.standard_normal((8, 5, 3, 3)).astype("float32")
    xb = to_blocked(x, 8)
    xb[:, -1, :, :, 5:] = 0.5
    attrs = "layout=NCHW;klayout=OIHW;pad=1,1,1,1;src_fmt=nChw8c;src_c=5"
    out = call_direct(native.CONV2D, attrs, [xb, wt], (1, 8, 4, 4))
    np.testing.assert_allclose(out, conv_ref(x, wt, pad=(1, 1, 1, 1)), rtol=1e-4, atol=1e-3)


def test_blocked_packed_weight():
    """conv2d_pack_weight with blocked data (the same attrs as the call)."""
    import tvm_ffi

    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 16, 5, 5)).astype("float32")
    wt = rng.standard_normal((16, 16, 3, 3)).astype("float32")
    attrs = ("layout=NCHW;klayout=OIHW;pad=1,1,1,1;src_fmt=nChw16c;src_c=16;"
             "dst_fmt=nChw16c;dst_c=16")
    xb = to_blocked(x, 16)
    size = native.conv2d_packed_size(attrs, x.shape, wt.shape)
    packed = np.zeros(size, "float32")
    tvm_ffi.get_global_func(native.CONV2D_PACK_WEIGHT)(
        attrs, tvm_ffi.from_dlpack(xb), tvm_ffi.from_dlpack(wt), tvm_ffi.from_dlpack(packed))
    out = call_direct(native.CONV2D, attrs + ";wpacked=1;kernel=3,3", [xb, packed],
                      (1, 1, 5, 5, 16))
    np.testing.assert_allclose(from_blocked(out, 16), conv_ref(x, wt, pad=(1, 1, 1, 1)),
                               rtol=1e-4, atol=1e-3)


def test_preferred_format():
    """A format the kernel accepts (or "other"), the same answer on a second query, and a
    call in the preferred formats that matches numpy."""
    attrs = "layout=NCHW;klayout=OIHW;pad=1,1,1,1"
    formats = ("nchw", "nhwc", "nChw4c", "nChw8c", "nChw16c", "other")
    for x_shape, w_shape in [((1, 64, 28, 28), (64, 64, 3, 3)), ((1, 3, 32, 32), (16, 3, 3, 3))]:
        src, dst = native.conv2d_preferred_format(attrs, x_shape, w_shape)
        assert src in formats and dst in formats
        assert (src, dst) == native.conv2d_preferred_format(attrs, x_shape, w_shape)
    with pytest.raises(ValueError, match="layout=NCHW"):
        native.conv2d_preferred_format("layout=NHWC;klayout=OHWI", (1, 8, 8, 64), (64, 3, 3, 64))


@pytest.mark.parametrize("attrs,x_shape,out_shape,match", [
    ("src_fmt=nChw16c", (1, 1, 4, 4, 16), (1, 8, 4, 4), "src_c"),
    ("src_fmt=nChw3c;src_c=5", (1, 2, 4, 4, 3), (1, 8, 4, 4), "src_fmt"),
    ("src_fmt=nChw8c;src_c=5", (1, 2, 4, 4, 8), (1, 8, 4, 4), "blocked"),
    ("dst_fmt=nChw8c;dst_c=8", (1, 5, 4, 4), (1, 8, 4, 4), "blocked"),
    ("src_fmt=nhwc", (1, 5, 4, 4, 1), (1, 8, 4, 4), "nhwc"),
    ("layout=NHWC;src_fmt=nChw8c;src_c=5", (1, 1, 4, 4, 8), (1, 4, 4, 8), "layout=NCHW"),
    ("dst_c=8", (1, 5, 4, 4), (1, 8, 4, 4), "only for blocked"),
    ("src_fmt=nhwc;src_c=5", (1, 4, 4, 5), (1, 8, 4, 4), "only for blocked"),
])
def test_blocked_errors(attrs, x_shape, out_shape, match):
    x = np.zeros(x_shape, "float32")
    wt = np.zeros((8, 5, 1, 1), "float32")
    with pytest.raises(ValueError, match=match):
        call_direct(native.CONV2D, attrs, [x, wt], out_shape)
