"""tvm_ollie.cpu.conv2d_transpose's epilogue on oneDNN's blocked formats with many input
channels.

oneDNN 3.2's ``brgconv_strided`` applied its bias and post-ops to each chunk of input channels
once it cut them into chunks (1x504x4x4 -> 32, k4 s2 p1: off by up to 7.5 with a bias, 3.6 with
a relu, 13 with a residual; 496 channels exact), so that implementation's epilogue runs after
the deconvolution (``EpilogueBroken``). These cases fail without that: the explicit
``fmt=blocked`` and a shape whose default is the blocked format, with each epilogue alone and
combined, NCHW and channels-last."""

import numpy as np
import pytest

from native_util import act_ref, call_direct, require_native
from test_native_conv2d_transpose import _attrs, deconv_ref
from tvm_ollie import native

STRIDE, PAD = (2, 2), (1, 1, 1, 1)


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_TRANSPOSE):
        pytest.skip("the loaded native library predates conv2d_transpose")


def _check(c, h, o, fmt, res=False, act="none", nhwc=False, bias=True):
    rng = np.random.default_rng(c + h + o)
    x = rng.standard_normal((1, c, h, h)).astype("float32")
    wt = (0.05 * rng.standard_normal((c, o, 4, 4))).astype("float32")
    bv = rng.standard_normal(o).astype("float32")
    ref = deconv_ref(x, wt, STRIDE, PAD) + (bv[None, :, None, None] if bias else 0)
    rv = rng.standard_normal(ref.shape).astype("float32")
    ref = act_ref(ref + (rv if res else 0), act)
    to = (lambda a: np.ascontiguousarray(a.transpose(0, 2, 3, 1))) if nhwc else (lambda a: a)
    attrs = _attrs(STRIDE, PAD, (0, 0), (1, 1), 1, bias, res, act, fmt)
    if nhwc:
        attrs += ";src_fmt=nhwc;dst_fmt=nhwc"
    arrays = [to(x), wt] + ([bv] if bias else []) + ([to(rv)] if res else [])
    out = call_direct(native.CONV2D_TRANSPOSE, attrs, arrays, to(ref).shape)
    out = out.transpose(0, 3, 1, 2) if nhwc else out
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("bias,res,act,nhwc", [
    (True, False, "none", False), (False, False, "relu", False), (False, True, "none", False),
    (True, True, "relu", False), (True, False, "tanh", True), (False, True, "none", True)])
def test_blocked_epilogue_many_input_channels(bias, res, act, nhwc):
    _check(504, 4, 32, "blocked", res, act, nhwc, bias)


def test_default_blocked_epilogue_many_input_channels():
    # data + output (512*22*22 + 32*44*44) outweigh the weights (512*32*16): the default is the
    # blocked format
    _check(512, 22, 32, None, act="relu")
