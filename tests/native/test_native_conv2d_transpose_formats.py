"""tvm_ollie.cpu.conv2d_transpose with a channels-last source or destination (``src_fmt`` /
``dst_fmt`` = ``nhwc``), against the numpy reference of the NCHW kernel, for every
implementation (oneDNN plain and blocked, the GEMM + gather of fmt=gemm, the default), with
every epilogue; the residual in the destination's format, and possibly Out itself."""

import numpy as np
import pytest
import tvm_ffi

from native_util import act_ref, call_direct, require_native
from test_native_conv2d_transpose import _attrs, deconv_ref
from tvm_ollie import native

FORMATS = [("nhwc", "nhwc"), ("nhwc", "nchw"), ("nchw", "nhwc")]


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_TRANSPOSE):
        pytest.skip("the loaded native library predates conv2d_transpose")


def _to(fmt, a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1)) if fmt == "nhwc" else a


def _from(fmt, a):
    return a.transpose(0, 3, 1, 2) if fmt == "nhwc" else a


def _run(rng, src, dst, n, c, h, w, o, k, stride=(1, 1), pad=(0, 0, 0, 0), opad=(0, 0),
         dil=(1, 1), groups=1, bias=True, res=False, act="none", fmt=None):
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((c, o // groups, k, k)).astype("float32")
    ref = deconv_ref(x, wt, stride, pad, opad, dil, groups)
    bv = rng.standard_normal(o).astype("float32")
    rv = rng.standard_normal(ref.shape).astype("float32")
    ref = act_ref(ref + (bv[None, :, None, None] if bias else 0) + (rv if res else 0), act)
    attrs = _attrs(stride, pad, opad, dil, groups, bias, res, act, fmt)
    attrs += f";src_fmt={src};dst_fmt={dst}"
    arrays = [_to(src, x), wt] + ([bv] if bias else []) + ([_to(dst, rv)] if res else [])
    out = call_direct(native.CONV2D_TRANSPOSE, attrs, arrays, _to(dst, ref).shape)
    tol = 1e-5 * (c // groups * k * k) ** 0.5 + 1e-5
    np.testing.assert_allclose(_from(dst, out), ref, rtol=1e-4, atol=tol)


@pytest.mark.parametrize("fmt", [None, "plain", "blocked", "gemm"])
@pytest.mark.parametrize("src,dst", FORMATS)
@pytest.mark.parametrize(
    "case",
    [
        dict(c=21, h=4, w=4, o=21, k=4, stride=(2, 2), pad=(1, 1, 1, 1)),  # GCN's
        dict(c=5, h=6, w=7, o=4, k=3),  # stride 1
        dict(c=4, h=7, w=5, o=6, k=3, stride=(2, 3), pad=(0, 2, 1, 0), opad=(1, 2)),  # asym.
        dict(c=3, h=6, w=6, o=4, k=3, stride=(2, 2), pad=(2, 1, 2, 1), dil=(2, 3), opad=(1, 0)),
        dict(c=6, h=5, w=6, o=4, k=4, stride=(2, 2), pad=(1, 1, 1, 1), groups=2),
        dict(c=8, h=5, w=4, o=8, k=4, stride=(2, 2), pad=(1, 1, 1, 1), groups=8),  # depthwise
    ],
)
def test_channels_last_variants(fmt, src, dst, case):
    rng = np.random.default_rng(sum(map(len, map(str, case.values()))))
    case = dict(case)
    _run(rng, src, dst, 2, case.pop("c"), case.pop("h"), case.pop("w"), case.pop("o"),
         case.pop("k"), fmt=fmt, **case)


@pytest.mark.parametrize("fmt", ["plain", "blocked", "gemm"])
@pytest.mark.parametrize("act", ["none", "relu", "sigmoid", "leaky_relu_0.1"])
def test_channels_last_epilogues(fmt, act):
    rng = np.random.default_rng(len(act + fmt))
    for bias, res in [(0, 0), (1, 1), (0, 1)]:
        _run(rng, "nhwc", "nhwc", 1, 6, 5, 5, 20, 4, stride=(2, 2), pad=(1, 1, 1, 1),
             bias=bias, res=res, act=act, fmt=fmt)


@pytest.mark.parametrize("fmt", ["plain", "blocked", "gemm"])
def test_channels_last_residual_may_be_the_output(fmt):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 4, 3, 3)).astype("float32")
    wt = rng.standard_normal((4, 2, 4, 4)).astype("float32")
    out = rng.standard_normal((1, 6, 6, 2)).astype("float32")  # nhwc
    ref = np.maximum(deconv_ref(x, wt, (2, 2), (1, 1, 1, 1)) + _from("nhwc", out), 0)
    t_out = tvm_ffi.from_dlpack(out)
    attrs = _attrs((2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 1, res=True, act="relu", fmt=fmt)
    tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)(
        attrs + ";src_fmt=nhwc;dst_fmt=nhwc", tvm_ffi.from_dlpack(_to("nhwc", x)),
        tvm_ffi.from_dlpack(wt), t_out, t_out)
    np.testing.assert_allclose(_from("nhwc", out), ref, rtol=1e-4, atol=1e-4)


def test_channels_last_shapes_are_checked():
    x = np.ones((1, 3, 3, 4), "float32")  # nhwc, C = 4
    w = np.ones((4, 2, 3, 3), "float32")
    with pytest.raises(ValueError, match="Out has shape"):
        call_direct(native.CONV2D_TRANSPOSE, "src_fmt=nhwc;dst_fmt=nhwc", [x, w], (1, 2, 5, 5))
    with pytest.raises(ValueError, match="does not fit data"):
        call_direct(native.CONV2D_TRANSPOSE, "src_fmt=nchw", [x, w], (1, 2, 5, 5))
    with pytest.raises(ValueError, match="bad value"):
        call_direct(native.CONV2D_TRANSPOSE, "src_fmt=nChw8c", [x, w], (1, 5, 5, 2))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("act", ["relu", "tanh"])
def test_channels_last_gemm_rows_over_threads(threads, act):
    """fmt=gemm on channels-last splits the output rows over the threads (each row written by
    one), then applies the activation over all of Out (tanh: oneDNN's eltwise primitive)."""
    threads0, serial0 = native.get_num_threads(), native.get_serial_flops()
    native.set_num_threads(threads)
    native.set_serial_flops(0)
    try:
        rng = np.random.default_rng(threads)
        _run(rng, "nhwc", "nhwc", 2, 6, 5, 4, 9, 3, stride=(2, 2), pad=(1, 1, 1, 1),
             opad=(1, 1), groups=3, res=True, act=act, fmt="gemm")
    finally:
        native.set_num_threads(threads0)
        native.set_serial_flops(serial0)


@pytest.mark.parametrize("src,dst", FORMATS)
@pytest.mark.parametrize(
    "case",
    [
        dict(n=2, c=5, h=6, w=7, k=9, stride=(2, 2), pad=(4, 4, 4, 4), opad=(1, 1)),  # FSRCNN's
        dict(n=1, c=2, h=90, w=40, k=9, stride=(3, 3), pad=(4, 4, 4, 4)),  # two row blocks
        dict(n=1, c=3, h=3, w=4, k=3, stride=(2, 1), pad=(1, 0, 1, 0)),  # transposed columns
    ],
)
@pytest.mark.parametrize("res,act", [(False, "none"), (True, "relu"), (True, "tanh")])
def test_channels_last_one_output_channel(src, dst, case, res, act):
    """One output channel, fmt=gemm: the channels GEMM (RunGemm) reads a channels-last source
    as stored and writes a channels-last Out of one channel as its NCHW form (the same memory),
    the residual too, instead of the positions' gather."""
    rng = np.random.default_rng(case["h"] * 7 + case["k"])
    case = dict(case)
    _run(rng, src, dst, case.pop("n"), case.pop("c"), case.pop("h"), case.pop("w"), 1,
         case.pop("k"), res=res, act=act, fmt="gemm", **case)


def test_channels_last_large_default():
    """Few output channels (the default is fmt=gemm) but more position columns than
    RunGemmPositions keeps by default (4M floats): the default computes it (with oneDNN)."""
    rng = np.random.default_rng(11)
    _run(rng, "nhwc", "nhwc", 1, 2, 260, 260, 4, 4, stride=(2, 2), pad=(1, 1, 1, 1),
         res=True, act="relu")
