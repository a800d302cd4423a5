"""tvm_ollie.cpu.conv2d's per-call-site state (ConvSite in tvm_ollie/conv2d.cc): each thread keeps,
per attribute string and argument shapes, the resolved problem and the dnnl::memory objects of
the call, and only resets their data handles. These tests change what that state could get
wrong: the tensors' addresses and contents, the shapes behind one attribute string, the thread
count, the packed weights, and more sites than are kept; every result against numpy."""

import numpy as np
import pytest

from native_util import act_ref, require_native
from test_native_conv2d import conv_ref
from test_native_conv2d_blocked import from_blocked, to_blocked
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("the loaded native library predates blocked activations")


def _ffi(a):
    import tvm_ffi

    return tvm_ffi.from_dlpack(a)


def _conv():
    import tvm_ffi

    return tvm_ffi.get_global_func(native.CONV2D)


def _pack(attrs, x, w, blk):
    """The packed weight of w for attrs (without wpacked), NCHW data x given in format blk."""
    import tvm_ffi

    packed = np.zeros(native.conv2d_packed_size(attrs, list(x.shape), list(w.shape)), "float32")
    tvm_ffi.get_global_func(native.CONV2D_PACK_WEIGHT)(
        attrs, _ffi(to_blocked(x, blk)), _ffi(w), _ffi(packed))
    return packed


def _ref(x, w, b, pad, groups, act, stride=(1, 1)):
    y = conv_ref(x, w, stride=stride, pad=pad, groups=groups) + b.reshape(1, -1, 1, 1)
    return act_ref(y, act)


@pytest.mark.parametrize("blk", [-1, 8])
@pytest.mark.parametrize("packed", [False, True])
def test_new_tensors_every_call(blk, packed):
    """Fresh data, weight, bias and Out arrays at every call (new addresses, some reused by
    the allocator) on one site: every call computes on its own tensors. blk 8 with 12
    channels: blocked activations with padding channels."""
    rng = np.random.default_rng(0)
    c, o, h = 12, 12, 5
    base = (f"layout=NCHW;klayout=OIHW;pad=1,1,1,1;bias=1;act=silu;src_fmt={_fmt(blk)};"
            f"dst_fmt={_fmt(blk)}" + (f";src_c={c};dst_c={o}" if blk > 0 else ""))
    attrs = base + (";wpacked=1;kernel=3,3" if packed else "")
    for _ in range(6):
        x = rng.standard_normal((1, c, h, h)).astype("float32")
        w = rng.standard_normal((o, c, 3, 3)).astype("float32")
        b = rng.standard_normal(o).astype("float32")
        wt = _pack(base, x, w, blk) if packed else w
        out_shape = to_blocked(np.zeros((1, o, h, h), "float32"), blk).shape
        out = np.full(out_shape, np.nan, "float32")
        _conv()(attrs, _ffi(to_blocked(x, blk)), _ffi(wt), _ffi(b), _ffi(out))
        np.testing.assert_allclose(from_blocked(out, o), _ref(x, w, b, (1, 1, 1, 1), 1, "silu"),
                                   rtol=1e-4, atol=1e-4)
        if blk > 0:
            assert not out[:, -1, ..., o % blk:].any(), "padding channels must stay zero"


def _fmt(blk):
    return "nhwc" if blk == -1 else f"nChw{blk}c"


@pytest.mark.parametrize("packed", [False, True])
def test_contents_changed_in_place(packed):
    """The same buffers, new contents between calls (weights too, repacked in place): the
    kept memory objects wrap addresses, never contents."""
    rng = np.random.default_rng(1)
    c, o, h = 16, 16, 4
    base = "layout=NCHW;klayout=OIHW;groups=16;pad=1,1,1,1;bias=1;src_fmt=nhwc;dst_fmt=nhwc"
    attrs = base + (";wpacked=1;kernel=3,3" if packed else "")
    x = np.zeros((1, h, h, c), "float32")
    w = np.zeros((o, 1, 3, 3), "float32")
    b = np.zeros(o, "float32")
    wt = _pack(base, x.transpose(0, 3, 1, 2), w, -1) if packed else w
    out = np.zeros((1, h, h, o), "float32")
    args = [_ffi(a) for a in (x, wt, b, out)]
    for _ in range(4):
        x[...] = rng.standard_normal(x.shape)
        w[...] = rng.standard_normal(w.shape)
        b[...] = rng.standard_normal(b.shape)
        if packed:
            wt[...] = _pack(base, x.transpose(0, 3, 1, 2), w, -1)
        _conv()(attrs, *args)
        ref = _ref(x.transpose(0, 3, 1, 2), w, b, (1, 1, 1, 1), 16, "none")
        np.testing.assert_allclose(out.transpose(0, 3, 1, 2), ref, rtol=1e-4, atol=1e-4)


def test_shapes_interleaved_under_one_attrs_string():
    """One attribute string (a 1x1 conv with a residual) called with shapes in turn, as the
    pointwise convolutions of a model are: each call on its own site."""
    rng = np.random.default_rng(2)
    attrs = "layout=NCHW;klayout=OIHW;bias=1;res=1;act=relu;src_fmt=nhwc;dst_fmt=nhwc"
    shapes = [(8, 16, 4), (16, 8, 8), (32, 32, 2), (8, 16, 4), (32, 32, 2), (16, 8, 8)]
    for c, o, h in shapes * 2:
        x = rng.standard_normal((1, c, h, h)).astype("float32")
        w = rng.standard_normal((o, c, 1, 1)).astype("float32")
        b = rng.standard_normal(o).astype("float32")
        r = rng.standard_normal((1, o, h, h)).astype("float32")
        out = np.full((1, h, h, o), np.nan, "float32")
        _conv()(attrs, _ffi(to_blocked(x, -1)), _ffi(w), _ffi(b), _ffi(to_blocked(r, -1)),
                _ffi(out))
        ref = np.maximum(conv_ref(x, w) + b.reshape(1, -1, 1, 1) + r, 0)
        np.testing.assert_allclose(out.transpose(0, 3, 1, 2), ref, rtol=1e-4, atol=1e-4)


def test_residual_is_out_on_a_kept_site():
    """Out holding the residual itself (the sum post-op reads it in place), called repeatedly."""
    rng = np.random.default_rng(3)
    attrs = "layout=NCHW;klayout=OIHW;pad=1,1,1,1;res=1"
    x = rng.standard_normal((1, 8, 6, 6)).astype("float32")
    w = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    out = rng.standard_normal((1, 8, 6, 6)).astype("float32")
    for _ in range(3):
        ref = conv_ref(x, w, pad=(1, 1, 1, 1)) + out
        _conv()(attrs, _ffi(x), _ffi(w), _ffi(out), _ffi(out))
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


def test_thread_count_changes_between_calls():
    """set_num_threads and the serial threshold changed between calls of one site: the site
    takes the primitive made for the thread count in effect, and results stay right."""
    rng = np.random.default_rng(4)
    attrs = "layout=NCHW;klayout=OIHW;pad=1,1,1,1;bias=1;act=relu;src_fmt=nhwc;dst_fmt=nhwc"
    x = rng.standard_normal((1, 32, 16, 16)).astype("float32")
    w = rng.standard_normal((32, 32, 3, 3)).astype("float32")
    b = rng.standard_normal(32).astype("float32")
    ref = _ref(x, w, b, (1, 1, 1, 1), 1, "relu")
    threads, serial = native.get_num_threads(), native.get_serial_flops()
    try:
        for n, flops in [(1, serial), (2, 0), (2, 10**12), (1, 0), (2, 0)]:
            native.set_num_threads(n)
            native.set_serial_flops(flops)
            out = np.full((1, 16, 16, 32), np.nan, "float32")
            _conv()(attrs, _ffi(to_blocked(x, -1)), _ffi(w), _ffi(b), _ffi(out))
            np.testing.assert_allclose(out.transpose(0, 3, 1, 2), ref, rtol=1e-4, atol=1e-3)
    finally:
        native.set_num_threads(threads)
        native.set_serial_flops(serial)


def test_more_sites_than_kept():
    """More shapes under one attribute string than a thread keeps sites for (256): the
    oldest are dropped and made again, and every call is still right."""
    rng = np.random.default_rng(5)
    attrs = "layout=NCHW;klayout=OIHW;bias=1"
    w = rng.standard_normal((4, 4, 1, 1)).astype("float32")
    b = rng.standard_normal(4).astype("float32")
    for width in list(range(1, 270)) + [1, 2, 3]:
        x = rng.standard_normal((1, 4, 1, width)).astype("float32")
        out = np.full((1, 4, 1, width), np.nan, "float32")
        _conv()(attrs, _ffi(x), _ffi(w), _ffi(b), _ffi(out))
        np.testing.assert_allclose(out, conv_ref(x, w) + b.reshape(1, -1, 1, 1), rtol=1e-4,
                                   atol=1e-4)


def test_bad_shapes_after_a_kept_site_still_raise():
    """A kept site does not skip the checks of another call: a wrong Out or bias shape under
    the same attribute string raises, and the good call still works after it."""
    rng = np.random.default_rng(6)
    attrs = "layout=NCHW;klayout=OIHW;pad=1,1,1,1;bias=1"
    x = rng.standard_normal((1, 4, 5, 5)).astype("float32")
    w = rng.standard_normal((8, 4, 3, 3)).astype("float32")
    b = rng.standard_normal(8).astype("float32")
    out = np.zeros((1, 8, 5, 5), "float32")
    _conv()(attrs, _ffi(x), _ffi(w), _ffi(b), _ffi(out))
    with pytest.raises(ValueError, match="Out has shape"):
        _conv()(attrs, _ffi(x), _ffi(w), _ffi(b), _ffi(np.zeros((1, 8, 4, 5), "float32")))
    with pytest.raises(ValueError, match="bias has shape"):
        _conv()(attrs, _ffi(x), _ffi(w), _ffi(b[:4].copy()), _ffi(out))
    with pytest.raises(TypeError, match="float32"):
        _conv()(attrs, _ffi(x.astype("float64")), _ffi(w), _ffi(b), _ffi(out))
    _conv()(attrs, _ffi(x), _ffi(w), _ffi(b), _ffi(out))
    np.testing.assert_allclose(out, conv_ref(x, w, pad=(1, 1, 1, 1)) + b.reshape(1, -1, 1, 1),
                               rtol=1e-4, atol=1e-3)
