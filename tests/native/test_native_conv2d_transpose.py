"""tvm_ollie.cpu.conv2d_transpose against a numpy reference: strides, asymmetric padding, output
padding, dilation, groups, epilogues, the three implementations (oneDNN on the plain and on the
blocked formats, the GEMM + scatter of fmt=gemm), errors."""

import numpy as np
import pytest

from native_util import act_ref, call_direct, call_relax, require_native
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_TRANSPOSE):
        pytest.skip("the loaded native library predates conv2d_transpose")


def deconv_ref(x, w, stride=(1, 1), pad=(0, 0, 0, 0), opad=(0, 0), dil=(1, 1), groups=1):
    """NCHW x IOHW transposed convolution (float64): every input point scatters the kernel,
    ``full[n, o, h*SH + r*DH, w*SW + s*DW] += x[n, i, h, w] * w[i, o, r, s]``, then the output
    is ``full[pad_top : pad_top + OH, pad_left : pad_left + OW]`` (zero past ``full``'s end,
    the output padding rows)."""
    x = x.astype("float64")
    w = w.astype("float64")
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    ig = c // groups
    pt, pl, pb, pr = pad
    oh = (h - 1) * stride[0] - pt - pb + dil[0] * (kh - 1) + opad[0] + 1
    ow = (wd - 1) * stride[1] - pl - pr + dil[1] * (kw - 1) + opad[1] + 1
    fh = max((h - 1) * stride[0] + dil[0] * (kh - 1) + 1, pt + oh)
    fw = max((wd - 1) * stride[1] + dil[1] * (kw - 1) + 1, pl + ow)
    full = np.zeros((n, og * groups, fh, fw))
    for g in range(groups):
        xs = x[:, g * ig:(g + 1) * ig]
        for r in range(kh):
            for s in range(kw):
                r0, s0 = r * dil[0], s * dil[1]
                full[:, g * og:(g + 1) * og, r0:r0 + stride[0] * (h - 1) + 1:stride[0],
                     s0:s0 + stride[1] * (wd - 1) + 1:stride[1]] += np.einsum(
                         "nihw,io->nohw", xs, w[g * ig:(g + 1) * ig, :, r, s])
    return full[:, :, pt:pt + oh, pl:pl + ow]


def _attrs(stride, pad, opad, dil, groups, bias=False, res=False, act="none", fmt=None):
    text = (f"layout=NCHW;klayout=IOHW;stride={stride[0]},{stride[1]};"
            f"pad={','.join(map(str, pad))};opad={opad[0]},{opad[1]};dil={dil[0]},{dil[1]};"
            f"groups={groups};bias={int(bias)};res={int(res)};act={act}")
    return text + (f";fmt={fmt}" if fmt else "")


def _case(rng, n, c, h, w, o, k, stride=(1, 1), pad=(0, 0, 0, 0), opad=(0, 0), dil=(1, 1),
          groups=1, bias=False, res=False, act="none", fmt=None, relax_build=False):
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((c, o // groups, kh, kw)).astype("float32")
    ref = deconv_ref(x, wt, stride, pad, opad, dil, groups)
    bv = rng.standard_normal(o).astype("float32")
    if bias:
        ref = ref + bv[None, :, None, None]
    rv = rng.standard_normal(ref.shape).astype("float32")
    if res:
        ref = ref + rv
    ref = act_ref(ref, act)
    arrays = [x, wt] + ([bv] if bias else []) + ([rv] if res else [])
    call = call_relax if relax_build else call_direct
    out = call(native.CONV2D_TRANSPOSE, _attrs(stride, pad, opad, dil, groups, bias, res, act, fmt),
               arrays, ref.shape)
    tol = 1e-5 * (c // groups * kh * kw) ** 0.5 + 1e-5
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=tol)


@pytest.mark.parametrize("fmt", [None, "plain", "blocked", "gemm"])
@pytest.mark.parametrize(
    "case",
    [
        dict(c=5, h=6, w=7, o=4, k=3),  # stride 1
        dict(c=6, h=8, w=8, o=5, k=4, stride=(2, 2), pad=(1, 1, 1, 1)),  # GCN/DCGAN kind
        dict(c=4, h=5, w=7, o=3, k=3, stride=(3, 3), pad=(1, 1, 1, 1), opad=(2, 1)),
        dict(c=4, h=7, w=5, o=6, k=3, stride=(2, 3), pad=(0, 2, 1, 0), opad=(1, 2)),  # asym.
        dict(c=3, h=6, w=6, o=4, k=3, stride=(2, 2), pad=(2, 1, 2, 1), dil=(2, 3), opad=(1, 0)),
        dict(c=6, h=5, w=6, o=4, k=4, stride=(2, 2), pad=(1, 1, 1, 1), groups=2),
        dict(c=8, h=9, w=7, o=8, k=4, stride=(2, 2), pad=(1, 1, 1, 1), groups=8),  # depthwise
        dict(c=4, h=6, w=5, o=12, k=3, stride=(2, 2), pad=(1, 1, 1, 1), groups=4),  # mult. 3
        dict(c=3, h=5, w=9, o=2, k=(2, 5), stride=(1, 2), pad=(0, 2, 1, 2)),  # non-square
        dict(c=7, h=4, w=5, o=3, k=1, stride=(2, 2), opad=(1, 1)),  # 1x1, holes
        dict(c=5, h=4, w=4, o=1, k=9, stride=(3, 3), pad=(4, 4, 4, 4), opad=(2, 2)),  # FSRCNN
        dict(c=40, h=3, w=3, o=24, k=4, stride=(2, 2), pad=(1, 1, 1, 1)),  # weight-heavy
    ],
)
def test_deconv_variants(fmt, case):
    rng = np.random.default_rng(sum(map(len, map(str, case.values()))))
    case = dict(case)
    _case(rng, 2, case.pop("c"), case.pop("h"), case.pop("w"), case.pop("o"), case.pop("k"),
          bias=True, fmt=fmt, **case)


@pytest.mark.parametrize("fmt", ["plain", "blocked", "gemm"])
@pytest.mark.parametrize("act", ["none", "relu", "clip_0_6", "sigmoid", "tanh",
                                 "hardswish_0.16666667_0.5", "hardsigmoid_0.2_0.5",
                                 "leaky_relu_0.1"])
def test_epilogues(fmt, act):
    rng = np.random.default_rng(len(act + fmt))
    for bias, res in [(0, 0), (1, 0), (0, 1), (1, 1)]:
        _case(rng, 1, 6, 5, 5, 20, 4, stride=(2, 2), pad=(1, 1, 1, 1), bias=bias, res=res,
              act=act, fmt=fmt)


@pytest.mark.parametrize("fmt", ["plain", "blocked", "gemm"])
def test_residual_may_be_the_output(fmt):
    # on plain formats the residual is added after the deconvolution, which overwrites Out
    import tvm_ffi

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 3, 3)).astype("float32")
    wt = rng.standard_normal((4, 2, 4, 4)).astype("float32")
    out = rng.standard_normal((1, 2, 6, 6)).astype("float32")
    ref = np.maximum(deconv_ref(x, wt, (2, 2), (1, 1, 1, 1)) + out, 0)
    t_out = tvm_ffi.from_dlpack(out)
    tvm_ffi.get_global_func(native.CONV2D_TRANSPOSE)(
        _attrs((2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 1, res=True, act="relu", fmt=fmt),
        tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(wt), t_out, t_out)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_through_relax_call_dps_packed():
    rng = np.random.default_rng(4)
    _case(rng, 1, 6, 7, 7, 4, 3, stride=(2, 2), pad=(1, 0, 1, 1), opad=(1, 1), bias=True,
          res=True, act="relu", relax_build=True)


@pytest.mark.parametrize("fmt", ["plain", "gemm"])
def test_primitive_is_made_once(fmt):
    """The second call of a call site (same attrs, same shapes, new tensors) makes no oneDNN
    primitive: oneDNN's is kept by the site, fmt=gemm has none."""
    import tvm_ffi

    stats = tvm_ffi.get_global_func(native.CACHE_STATS)
    rng = np.random.default_rng(5)
    _case(rng, 1, 3, 4, 4, 2, 3, stride=(2, 2), pad=(0, 0, 1, 1), fmt=fmt)
    before = dict(kv.split("=") for kv in stats().split(";"))
    _case(rng, 1, 3, 4, 4, 2, 3, stride=(2, 2), pad=(0, 0, 1, 1), fmt=fmt)
    after = dict(kv.split("=") for kv in stats().split(";"))
    assert after["misses"] == before["misses"]
    assert after["size"] == before["size"]


@pytest.mark.parametrize(
    "attrs,match",
    [
        ("layout=NHWC", "bad value 'NHWC'"),
        ("klayout=OIHW", "bad value 'OIHW'"),
        ("stride=2", "expected 2 comma-separated integers"),
        ("opad=1", "expected 2 comma-separated integers"),
        ("pad=-1,0,0,0", "pad must be >= 0"),
        ("stride=0,1", "stride must be >= 1"),
        ("dil=1,0", "dil must be >= 1"),
        ("groups=0", "groups must be >= 1"),
        ("opad=1,0", "opad must satisfy 0 <= opad < stride"),
        ("stride=2,2;opad=0,-1", "opad must satisfy"),
        ("output_padding=1,1", "unknown attribute"),
        ("act=leaky", "bad activation"),
        ("fmt=nchw8c", "bad value"),
        ("fmt=GEMM", "bad value"),
    ],
)
def test_bad_attrs_raise(attrs, match):
    x = np.ones((1, 2, 3, 3), "float32")
    w = np.ones((2, 3, 3, 3), "float32")
    with pytest.raises(ValueError, match=match):
        call_direct(native.CONV2D_TRANSPOSE, attrs, [x, w], (1, 3, 5, 5))


def test_bad_shapes_raise():
    f = native.CONV2D_TRANSPOSE
    x = np.ones((1, 4, 3, 3), "float32")
    w = np.ones((4, 2, 3, 3), "float32")
    with pytest.raises(ValueError, match="Out has shape"):
        call_direct(f, "", [x, w], (1, 2, 3, 3))
    with pytest.raises(ValueError, match="does not fit data"):
        call_direct(f, "", [x, np.ones((3, 2, 3, 3), "float32")], (1, 2, 5, 5))
    with pytest.raises(ValueError, match="groups=3"):
        call_direct(f, "groups=3", [x, w], (1, 6, 5, 5))
    with pytest.raises(ValueError, match="empty output"):
        call_direct(f, "pad=3,3,3,3", [x, w], (1, 2, 1, 1))
    with pytest.raises(ValueError, match="rank >= 4"):
        call_direct(f, "", [np.ones((4, 3, 3), "float32"), w], (2, 5, 5))
    with pytest.raises(ValueError, match="bias has shape"):
        call_direct(f, "bias=1", [x, w, np.ones(4, "float32")], (1, 2, 5, 5))
    with pytest.raises(ValueError, match="residual has shape"):
        call_direct(f, "res=1", [x, w, np.ones((1, 2, 5, 4), "float32")], (1, 2, 5, 5))
    with pytest.raises(TypeError, match="expected 5 arguments"):
        call_direct(f, "bias=1", [x, w], (1, 2, 5, 5))
    with pytest.raises(TypeError):
        call_direct(f, "", [x.astype("float64"), w], (1, 2, 5, 5))


def test_info_describes_the_kernel():
    assert "conv2d_transpose default" in native.info()


def test_provides_names_only_registered_kernels():
    assert native.provides(native.CONV2D_TRANSPOSE)
    assert not native.provides("tvm_ollie.cpu.no_such_kernel")
