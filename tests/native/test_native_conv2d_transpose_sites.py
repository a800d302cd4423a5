"""tvm_ollie.cpu.conv2d_transpose's per-call-site state (DeconvSite in
tvm_ollie/conv2d_transpose.cc) and its GEMM implementation (fmt=gemm): each thread keeps, per
attribute string and argument shapes, the resolved problem (and oneDNN's primitive and memory
objects, whose data handles are reset per call). These tests change what that state could get
wrong (the tensors' addresses and contents, the shapes behind one attribute string, the thread
count, more sites than are kept) and the cuts fmt=gemm makes (output channels over threads,
images and groups, data rows into column blocks); every result against the numpy reference."""

import numpy as np
import pytest

from native_util import act_ref, require_native
from test_native_conv2d_transpose import deconv_ref
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_TRANSPOSE):
        pytest.skip("the loaded native library predates conv2d_transpose")
    threads, serial = native.get_num_threads(), native.get_serial_flops()
    yield
    native.set_num_threads(threads)
    native.set_serial_flops(serial)


def _ffi(a):
    import tvm_ffi

    return tvm_ffi.from_dlpack(a)


def _deconv():
    import tvm_ffi

    return tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)


def _attrs(stride=2, pad=1, groups=1, bias=True, res=False, act="relu", fmt="gemm", opad=0):
    text = (f"layout=NCHW;klayout=IOHW;stride={stride},{stride};pad={pad},{pad},{pad},{pad};"
            f"opad={opad},{opad};groups={groups};bias={int(bias)};res={int(res)};act={act}")
    return text + (f";fmt={fmt}" if fmt else "")


def _run(attrs, x, w, b=None, r=None, out_shape=None, out=None):
    out = np.full(out_shape, np.nan, "float32") if out is None else out
    args = [x, w] + ([b] if b is not None else []) + ([r] if r is not None else [])
    _deconv()(attrs, *[_ffi(a) for a in args], _ffi(out))
    return out


def _ref(x, w, b, stride=2, pad=1, groups=1, act="relu", opad=0):
    y = deconv_ref(x, w, (stride, stride), (pad,) * 4, (opad, opad), groups=groups)
    return act_ref(y + b.reshape(1, -1, 1, 1), act)


@pytest.mark.parametrize("fmt", ["gemm", "plain", "blocked"])
def test_new_tensors_every_call(fmt):
    """Fresh data, weight, bias and Out arrays at every call on one site."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        x = rng.standard_normal((1, 12, 5, 5)).astype("float32")
        w = rng.standard_normal((12, 20, 4, 4)).astype("float32")
        b = rng.standard_normal(20).astype("float32")
        out = _run(_attrs(fmt=fmt, act="tanh"), x, w, b, out_shape=(1, 20, 10, 10))
        np.testing.assert_allclose(out, _ref(x, w, b, act="tanh"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gemm", "plain"])
def test_contents_changed_in_place(fmt):
    """The same buffers, new contents between calls: a site keeps addresses, never contents."""
    rng = np.random.default_rng(1)
    x = np.zeros((1, 6, 4, 4), "float32")
    w = np.zeros((6, 5, 4, 4), "float32")
    b = np.zeros(5, "float32")
    out = np.zeros((1, 5, 8, 8), "float32")
    for _ in range(4):
        for a in (x, w, b):
            a[...] = rng.standard_normal(a.shape)
        _run(_attrs(fmt=fmt), x, w, b, out=out)
        np.testing.assert_allclose(out, _ref(x, w, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gemm", "plain"])
def test_shapes_interleaved_under_one_attrs_string(fmt):
    """One attribute string called with shapes in turn: each call on its own site."""
    rng = np.random.default_rng(2)
    shapes = [(8, 4, 3), (4, 8, 6), (16, 3, 2), (8, 4, 3), (16, 3, 2), (4, 8, 6)]
    for c, o, h in shapes * 2:
        x = rng.standard_normal((1, c, h, h)).astype("float32")
        w = rng.standard_normal((c, o, 4, 4)).astype("float32")
        b = rng.standard_normal(o).astype("float32")
        r = rng.standard_normal((1, o, 2 * h, 2 * h)).astype("float32")
        out = _run(_attrs(fmt=fmt, res=True), x, w, b, r, out_shape=(1, o, 2 * h, 2 * h))
        ref = act_ref(deconv_ref(x, w, (2, 2), (1, 1, 1, 1)) + b.reshape(1, -1, 1, 1) + r,
                      "relu")
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gemm", "plain"])
def test_residual_is_out_on_a_kept_site(fmt):
    """Out holding the residual itself, called repeatedly on one site."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 5, 5)).astype("float32")
    w = rng.standard_normal((8, 6, 4, 4)).astype("float32")
    out = rng.standard_normal((1, 6, 10, 10)).astype("float32")
    for _ in range(3):
        ref = deconv_ref(x, w, (2, 2), (1, 1, 1, 1)) + out
        _deconv()(_attrs(fmt=fmt, bias=False, res=True, act="none"), _ffi(x), _ffi(w),
                  _ffi(out), _ffi(out))
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("fmt", ["gemm", "plain", "blocked"])
def test_thread_count_changes_between_calls(fmt):
    """set_num_threads and the serial threshold changed between calls of one site: oneDNN's
    site takes the primitive made for the thread count in effect, fmt=gemm splits its channels
    over it; the results stay right."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 16, 8, 8)).astype("float32")
    w = rng.standard_normal((16, 24, 4, 4)).astype("float32")
    b = rng.standard_normal(24).astype("float32")
    ref = _ref(x, w, b)
    for n, flops in [(1, 0), (2, 0), (2, 10**12), (3, 0), (1, 0), (2, 0)]:
        native.set_num_threads(n)
        native.set_serial_flops(flops)
        out = _run(_attrs(fmt=fmt), x, w, b, out_shape=(1, 24, 16, 16))
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


def test_more_sites_than_kept():
    """More shapes under one attribute string than a thread keeps sites for (256)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 2, 2, 2)).astype("float32")
    b = rng.standard_normal(2).astype("float32")
    attrs = _attrs(stride=1, pad=0)
    for width in list(range(1, 265)) + [1, 2, 3]:
        x = rng.standard_normal((1, 3, 1, width)).astype("float32")
        out = _run(attrs, x, w, b, out_shape=(1, 2, 2, width + 1))
        np.testing.assert_allclose(out, _ref(x, w, b, stride=1, pad=0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gemm", "plain"])
def test_bad_shapes_after_a_kept_site_still_raise(fmt):
    """A kept site does not skip the checks of another call under the same attribute string."""
    rng = np.random.default_rng(6)
    attrs = _attrs(fmt=fmt)
    x = rng.standard_normal((1, 4, 5, 5)).astype("float32")
    w = rng.standard_normal((4, 8, 4, 4)).astype("float32")
    b = rng.standard_normal(8).astype("float32")
    out = np.zeros((1, 8, 10, 10), "float32")
    _run(attrs, x, w, b, out=out)
    with pytest.raises(ValueError, match="Out has shape"):
        _run(attrs, x, w, b, out_shape=(1, 8, 9, 10))
    with pytest.raises(ValueError, match="bias has shape"):
        _run(attrs, x, w, b[:4].copy(), out_shape=(1, 8, 10, 10))
    with pytest.raises(TypeError, match="float32"):
        _run(attrs, x.astype("float64"), w, b, out_shape=(1, 8, 10, 10))
    _run(attrs, x, w, b, out=out)
    np.testing.assert_allclose(out, _ref(x, w, b), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n, c, o, groups", [
    (3, 6, 3, 1),   # three output channels over the threads: uneven ranges
    (2, 6, 9, 3),   # ranges cut at image and group boundaries
    (1, 4, 1, 1),   # a single output channel: on the calling thread
])
def test_gemm_channel_ranges(threads, n, c, o, groups):
    """fmt=gemm's split of the output channels of every image and group over the threads."""
    rng = np.random.default_rng(n * 100 + o)
    native.set_num_threads(threads)
    native.set_serial_flops(0)
    x = rng.standard_normal((n, c, 5, 4)).astype("float32")
    w = rng.standard_normal((c, o // groups, 3, 3)).astype("float32")
    b = rng.standard_normal(o).astype("float32")
    attrs = _attrs(stride=2, pad=1, groups=groups, act="leaky_relu_0.1", opad=1)
    out = _run(attrs, x, w, b, out_shape=(n, o, 10, 8))
    ref = _ref(x, w, b, stride=2, pad=1, groups=groups, act="leaky_relu_0.1", opad=1)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("c, o, h, w", [
    (3, 16, 10, 256),  # 128 column rows a thread x 256: blocks of 8 data rows (8, 2)
    (2, 64, 5, 320),   # 512 column rows a thread x 320 > one block: one data row per block
])
def test_gemm_column_blocks(c, o, h, w):
    """Data rows cut into column blocks (kColFloats): the blocks' scatters meet in Out's rows."""
    rng = np.random.default_rng(h * w)
    native.set_num_threads(2)
    x = rng.standard_normal((1, c, h, w)).astype("float32")
    wt = rng.standard_normal((c, o, 4, 4)).astype("float32")
    b = rng.standard_normal(o).astype("float32")
    out = _run(_attrs(), x, wt, b, out_shape=(1, o, 2 * h, 2 * w))
    np.testing.assert_allclose(out, _ref(x, wt, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fmt", ["gemm", "plain"])
def test_empty_batch_writes_nothing(fmt):
    x = np.ones((0, 2, 3, 3), "float32")
    w = np.ones((2, 3, 4, 4), "float32")
    b = np.ones(3, "float32")
    out = _run(_attrs(fmt=fmt), x, w, b, out_shape=(0, 3, 6, 6))
    assert out.shape == (0, 3, 6, 6)


@pytest.mark.parametrize("shape", [
    (1, 12, 1, 1, 64, 4, 1, 0),  # DCGAN quick's five layers: (n, c, h, w, o, k, stride, pad)
    (1, 64, 4, 4, 32, 4, 2, 1),
    (1, 32, 8, 8, 16, 4, 2, 1),
    (1, 16, 16, 16, 8, 4, 2, 1),
    (1, 8, 32, 32, 3, 4, 2, 1),
    (1, 28, 1, 1, 56, 2, 1, 0),  # InfoGAN quick's first
])
def test_default_is_gemm_on_gan_layers(shape):
    """The default picks fmt=gemm on the GAN generators' layers (fewer than 16 output channels
    or weights larger than data + output): the default's results equal fmt=gemm's bit for bit,
    and are right."""
    n, c, h, w, o, k, s, p = shape
    rng = np.random.default_rng(c * o)
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((c, o, k, k)).astype("float32")
    b = rng.standard_normal(o).astype("float32")
    oh, ow = (h - 1) * s - 2 * p + k, (w - 1) * s - 2 * p + k
    default = _run(_attrs(stride=s, pad=p, fmt=None), x, wt, b, out_shape=(n, o, oh, ow))
    gemm = _run(_attrs(stride=s, pad=p), x, wt, b, out_shape=(n, o, oh, ow))
    np.testing.assert_array_equal(default, gemm)
    np.testing.assert_allclose(gemm, _ref(x, wt, b, stride=s, pad=p), rtol=1e-4, atol=1e-4)
