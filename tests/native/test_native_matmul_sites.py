"""tvm_ollie.cpu.matmul's per-call-site state (MatmulSite in tvm_ollie/matmul.cc): each thread
keeps, per attribute string and argument shapes, the checked problem, the oneDNN primitive and
the dnnl::memory objects of the call, and only resets their data handles. These tests change what
that state could get wrong: the tensors' addresses and contents, the shapes behind one attribute
string, the thread count, and more sites than are kept; every result against numpy."""

import numpy as np
import pytest

from native_util import act_ref, require_native
from tvm_ollie import native

LIBS = ["onednn", "openblas"]


@pytest.fixture(autouse=True)
def _native():
    require_native()


def _ffi(a):
    import tvm_ffi

    return tvm_ffi.from_dlpack(a)


def _matmul():
    import tvm_ffi

    return tvm_ffi.get_global_func(native.MATMUL)


def _ref(a, b, bias=None, res=None, act="none", tb=False):
    y = a.astype("float64") @ (np.swapaxes(b, -1, -2) if tb else b).astype("float64")
    if bias is not None:
        y = y + bias
    if res is not None:
        y = y + res
    return act_ref(y, act)


@pytest.mark.parametrize("lib", LIBS)
def test_new_tensors_every_call(lib):
    """Fresh A, B, bias, residual and Out arrays at every call (new addresses, some reused by
    the allocator) on one site: every call computes on its own tensors."""
    rng = np.random.default_rng(0)
    attrs = f"tb=1;bias=1;res=1;act=gelu;lib={lib}"
    for _ in range(6):
        a = rng.standard_normal((1, 9, 16)).astype("float32")
        b = rng.standard_normal((12, 16)).astype("float32")
        bias = rng.standard_normal(12).astype("float32")
        res = rng.standard_normal((1, 9, 12)).astype("float32")
        out = np.full((1, 9, 12), np.nan, "float32")
        _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(res), _ffi(out))
        np.testing.assert_allclose(out, _ref(a, b, bias, res, "gelu", tb=True), rtol=1e-4,
                                   atol=1e-4)


@pytest.mark.parametrize("lib", LIBS)
def test_contents_changed_in_place(lib):
    """The same buffers, new contents between calls: the kept memory objects wrap addresses,
    never contents."""
    rng = np.random.default_rng(1)
    attrs = f"bias=1;act=relu;lib={lib}"
    a = np.zeros((2, 5, 8), "float32")
    b = np.zeros((2, 8, 6), "float32")
    bias = np.zeros(6, "float32")
    out = np.zeros((2, 5, 6), "float32")
    args = [_ffi(x) for x in (a, b, bias, out)]
    for _ in range(4):
        a[...] = rng.standard_normal(a.shape)
        b[...] = rng.standard_normal(b.shape)
        bias[...] = rng.standard_normal(bias.shape)
        _matmul()(attrs, *args)
        np.testing.assert_allclose(out, _ref(a, b, bias, act="relu"), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lib", LIBS)
def test_shapes_interleaved_under_one_attrs_string(lib):
    """One attribute string called with shapes in turn (batched, broadcast, folded into one
    GEMM), as a model's matmuls of one kind are: each call on its own site."""
    rng = np.random.default_rng(2)
    attrs = f"res=1;act=tanh;lib={lib}"
    shapes = [((4, 7), (7, 3)), ((2, 4, 7), (7, 3)), ((2, 4, 7), (2, 7, 3)),
              ((1, 5, 2), (3, 2, 4)), ((4, 7), (7, 3)), ((2, 4, 7), (2, 7, 3))]
    for a_shape, b_shape in shapes * 2:
        a = rng.standard_normal(a_shape).astype("float32")
        b = rng.standard_normal(b_shape).astype("float32")
        ref_shape = np.broadcast_shapes(a_shape[:-2], b_shape[:-2]) + (a_shape[-2], b_shape[-1])
        res = rng.standard_normal(ref_shape).astype("float32")
        out = np.full(ref_shape, np.nan, "float32")
        _matmul()(attrs, _ffi(a), _ffi(b), _ffi(res), _ffi(out))
        np.testing.assert_allclose(out, _ref(a, b, res=res, act="tanh"), rtol=1e-4, atol=1e-4)


def test_thread_count_changes_between_calls():
    """set_num_threads and the serial threshold changed between calls of one site: the site
    takes the primitive made for the thread count in effect, and results stay right."""
    rng = np.random.default_rng(4)
    attrs = "bias=1;act=silu;lib=onednn"
    a = rng.standard_normal((64, 96)).astype("float32")
    b = rng.standard_normal((96, 80)).astype("float32")
    bias = rng.standard_normal(80).astype("float32")
    ref = _ref(a, b, bias, act="silu")
    threads, serial = native.get_num_threads(), native.get_serial_flops()
    try:
        for n, flops in [(1, serial), (2, 0), (2, 10**12), (1, 0), (2, 0)]:
            native.set_num_threads(n)
            native.set_serial_flops(flops)
            out = np.full((64, 80), np.nan, "float32")
            _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(out))
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)
    finally:
        native.set_num_threads(threads)
        native.set_serial_flops(serial)


def test_more_sites_than_kept():
    """More shapes under one attribute string than a thread keeps sites for (256): the
    oldest are dropped and made again, and every call is still right."""
    rng = np.random.default_rng(5)
    attrs = "bias=1;lib=onednn"
    b = rng.standard_normal((3, 4)).astype("float32")
    bias = rng.standard_normal(4).astype("float32")
    for rows in list(range(1, 270)) + [1, 2, 3]:
        a = rng.standard_normal((rows, 3)).astype("float32")
        out = np.full((rows, 4), np.nan, "float32")
        _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(out))
        np.testing.assert_allclose(out, _ref(a, b, bias), rtol=1e-4, atol=1e-4)


def test_bad_shapes_after_a_kept_site_still_raise():
    """A kept site does not skip the checks of another call: a wrong Out, bias or residual
    shape under the same attribute string raises, and the good call still works after it."""
    rng = np.random.default_rng(6)
    attrs = "bias=1;res=1"
    a = rng.standard_normal((5, 8)).astype("float32")
    b = rng.standard_normal((8, 6)).astype("float32")
    bias = rng.standard_normal(6).astype("float32")
    res = rng.standard_normal((5, 6)).astype("float32")
    out = np.zeros((5, 6), "float32")
    _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(res), _ffi(out))
    with pytest.raises(ValueError, match="Out has shape"):
        _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(res),
                  _ffi(np.zeros((5, 7), "float32")))
    with pytest.raises(ValueError, match="bias has shape"):
        _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias[:3].copy()), _ffi(res), _ffi(out))
    with pytest.raises(ValueError, match="residual has shape"):
        _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(res[:1].copy()), _ffi(out))
    with pytest.raises(TypeError, match="float32"):
        _matmul()(attrs, _ffi(a.astype("float64")), _ffi(b), _ffi(bias), _ffi(res), _ffi(out))
    _matmul()(attrs, _ffi(a), _ffi(b), _ffi(bias), _ffi(res), _ffi(out))
    np.testing.assert_allclose(out, _ref(a, b, bias, res), rtol=1e-4, atol=1e-4)
