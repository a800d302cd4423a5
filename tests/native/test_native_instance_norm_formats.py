"""tvm_ollie.cpu.instance_norm in the chains' formats (``fmt=nhwc|nChw{B}c``) against the NCHW
reference: channels that do not fill a block (padding written as 0), the epilogue, the
parallel path, the errors."""

import numpy as np
import pytest

from tvm_ollie import native
from tvm_ollie.codegen import library as lib

from native_util import call_direct, call_relax, require_native
from test_native_instance_norm import reference


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(lib.INSTANCE_NORM):
        pytest.skip("native library built before instance_norm")
    try:
        call_direct(lib.INSTANCE_NORM, "fmt=nhwc", [np.ones((1, 1, 1, 1), "float32")],
                    (1, 1, 1, 1))
    except (ValueError, TypeError, RuntimeError):
        pytest.skip("native library built before instance_norm's formats")


def to_fmt(x, fmt):
    """An NCHW array in ``fmt`` (nChw{B}c padded with zeros)."""
    if fmt == "nhwc":
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    b = int(fmt[4:-1])
    n, c, h, w = x.shape
    cb = -(-c // b)
    padded = np.zeros((n, cb * b, h, w), x.dtype)
    padded[:, :c] = x
    return np.ascontiguousarray(padded.reshape(n, cb, b, h, w).transpose(0, 1, 3, 4, 2))


def from_fmt(y, fmt, c):
    """``fmt`` -> NCHW, the padding channels dropped, and those channels."""
    if fmt == "nhwc":
        return y.transpose(0, 3, 1, 2), None
    n, cb, h, w, b = y.shape
    full = y.transpose(0, 1, 4, 2, 3).reshape(n, cb * b, h, w)
    return full[:, :c], full[:, c:]


def _attrs(fmt, c, extra=""):
    return f"fmt={fmt}" + (f";c={c}" if fmt != "nhwc" else "") + extra


@pytest.mark.parametrize("fmt", ["nhwc", "nChw4c", "nChw8c", "nChw16c"])
@pytest.mark.parametrize("shape", [(1, 8, 16, 16), (2, 5, 7, 9), (1, 13, 3, 1), (1, 3, 64, 64)])
@pytest.mark.parametrize("epilogue", ["none", "affine_relu", "affine_res_sigmoid"])
def test_formats_against_nchw(fmt, shape, epilogue):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 2 + 3).astype("float32")
    c = shape[1]
    scale = rng.standard_normal(c).astype("float32")
    bias = rng.standard_normal(c).astype("float32")
    res = rng.standard_normal(shape).astype("float32")
    args, extra, want = [to_fmt(x, fmt)], "", reference(x)
    if epilogue == "affine_relu":
        args, extra = args + [scale, bias], ";scale=1;bias=1;act=relu"
        want = reference(x, scale, bias, act="relu")
    elif epilogue == "affine_res_sigmoid":
        args = args + [scale, bias, to_fmt(res, fmt)]
        extra = ";scale=1;bias=1;res=1;act=sigmoid"
        want = reference(x, scale, bias, res, "sigmoid")
    out = call_direct(lib.INSTANCE_NORM, _attrs(fmt, c, extra), args, args[0].shape)
    got, padding = from_fmt(out, fmt, c)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if padding is not None:  # written, and 0 (sigmoid(0) would be 0.5)
        np.testing.assert_array_equal(padding, 0)


@pytest.mark.parametrize("fmt", ["nhwc", "nChw8c"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_row_ranges(fmt, threads):
    """Above the serial threshold the rows of a group are split over the threads, their sums
    combined: the same numbers for 1, 2 and 3 threads (one image, so fewer groups than threads),
    and for planes whose mean is far from zero (shifted sums)."""
    rng = np.random.default_rng(threads)
    x = (rng.standard_normal((1, 12, 96, 96)) + 300).astype("float32")
    scale, bias = (rng.standard_normal(12).astype("float32") for _ in range(2))
    before = native.get_num_threads()
    native.set_num_threads(threads)
    try:
        args = [to_fmt(x, fmt), scale, bias]
        out = call_direct(lib.INSTANCE_NORM, _attrs(fmt, 12, ";scale=1;bias=1;act=relu"), args,
                          args[0].shape)
    finally:
        native.set_num_threads(before)
    np.testing.assert_allclose(from_fmt(out, fmt, 12)[0],
                               reference(x, scale, bias, act="relu"), rtol=1e-3, atol=1e-3)


def test_relax_nhwc_rank3():
    """Channels last of any rank >= 3 (``[N, S, C]``), inside a Relax build."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 10, 6)).astype("float32")
    out = call_relax(lib.INSTANCE_NORM, "fmt=nhwc", [x], x.shape)
    want = reference(np.ascontiguousarray(x.transpose(0, 2, 1))).transpose(0, 2, 1)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs, shape, match", [
    ("fmt=nChw8c", (1, 1, 2, 2, 8), "needs c"),
    ("fmt=nhwc;c=4", (1, 2, 2, 4), "only for blocked"),
    ("fmt=nChw8c;c=20", (1, 2, 2, 2, 8), "channel blocks"),
    ("fmt=nChw8c;c=5", (1, 1, 2, 2, 4), "expected"),
    ("fmt=NHWC", (1, 2, 2, 4), "fmt"),
])
def test_format_errors(attrs, shape, match):
    with pytest.raises(ValueError, match=match):
        call_direct(lib.INSTANCE_NORM, attrs, [np.ones(shape, "float32")], shape)
