"""tvm_ollie.cpu.conv2d against a numpy reference: layouts, strides, padding, dilation, groups,
epilogues, both implementations (plain and blocked formats), errors."""

import numpy as np
import pytest

from native_util import ACTS, PARAM_ACTS, act_ref, call_direct, call_relax, require_native
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()


def conv_ref(x, w, stride=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1):
    """NCHW x OIHW reference (float64), the sum over kernel taps of strided slices."""
    x = x.astype("float64")
    w = w.astype("float64")
    n, c, h, wd = x.shape
    o, i, kh, kw = w.shape
    pt, pl, pb, pr = pad
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    oh = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        for r in range(kh):
            for s in range(kw):
                r0, s0 = r * dil[0], s * dil[1]
                patch = xp[:, g * i:(g + 1) * i, r0:r0 + stride[0] * (oh - 1) + 1:stride[0],
                           s0:s0 + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum(
                    "nihw,oi->nohw", patch, w[g * og:(g + 1) * og, :, r, s])
    return out


def _case(rng, n, c, h, w, o, k, stride=(1, 1), pad=(0, 0, 0, 0), dil=(1, 1), groups=1,
          layout="NCHW", klayout="OIHW", bias=False, res=False, act="none", fmt=None,
          relax_build=False):
    kh, kw = (k, k) if isinstance(k, int) else k
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    wt = rng.standard_normal((o, c // groups, kh, kw)).astype("float32")
    ref = conv_ref(x, wt, stride, pad, dil, groups)
    bv = rng.standard_normal(o).astype("float32")
    if bias:
        ref = ref + bv[None, :, None, None]
    rv = rng.standard_normal(ref.shape).astype("float32")
    if res:
        ref = ref + rv
    ref = act_ref(ref, act)
    if layout == "NHWC":
        x, ref, rv = x.transpose(0, 2, 3, 1), ref.transpose(0, 2, 3, 1), rv.transpose(0, 2, 3, 1)
    wk = {"OIHW": wt, "HWIO": wt.transpose(2, 3, 1, 0), "OHWI": wt.transpose(0, 2, 3, 1)}[klayout]
    arrays = [x, wk] + ([bv] if bias else []) + ([rv] if res else [])
    attrs = (f"layout={layout};klayout={klayout};stride={stride[0]},{stride[1]};"
             f"pad={','.join(map(str, pad))};dil={dil[0]},{dil[1]};groups={groups};"
             f"bias={int(bias)};res={int(res)};act={act}")
    if fmt:
        attrs += f";fmt={fmt}"
    call = call_relax if relax_build else call_direct
    out = call(native.CONV2D, attrs, [np.ascontiguousarray(a) for a in arrays], ref.shape)
    tol = 1e-5 * (c // groups * kh * kw) ** 0.5 + 1e-5
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=tol)


FMTS = ["plain", "blocked"]


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("klayout", ["OIHW", "HWIO", "OHWI"])
def test_layouts_3x3_with_epilogue(fmt, layout, klayout):
    rng = np.random.default_rng(len(layout + klayout + fmt))
    _case(rng, 2, 5, 7, 6, 3, 3, pad=(1, 1, 1, 1), layout=layout, klayout=klayout, bias=True,
          res=True, act="relu", fmt=fmt)


@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize(
    "case",
    [
        dict(c=6, h=9, w=11, o=4, k=3, stride=(2, 2), pad=(1, 1, 1, 1)),
        dict(c=6, h=9, w=11, o=4, k=3, stride=(2, 1), pad=(0, 1, 2, 1)),  # asymmetric
        dict(c=4, h=12, w=10, o=5, k=3, dil=(2, 2), pad=(2, 2, 2, 2)),
        dict(c=6, h=8, w=8, o=4, k=3, groups=2, pad=(1, 1, 1, 1)),
        dict(c=8, h=9, w=9, o=8, k=3, groups=8, pad=(1, 1, 1, 1)),  # depthwise
        dict(c=8, h=10, w=10, o=16, k=3, groups=8, stride=(2, 2), pad=(1, 1, 1, 1)),  # mult. 2
        dict(c=7, h=5, w=6, o=9, k=1),  # 1x1
        dict(c=3, h=16, w=15, o=8, k=7, stride=(2, 2), pad=(3, 3, 3, 3)),  # 7x7 stem
        dict(c=5, h=7, w=9, o=3, k=(1, 3), pad=(0, 1, 0, 1)),  # non-square kernel
    ],
)
def test_conv_variants(fmt, layout, case):
    rng = np.random.default_rng(sum(map(hash, map(str, case.values()))) % 1000)
    case = dict(case)
    _case(rng, 2, case.pop("c"), case.pop("h"), case.pop("w"), case.pop("o"), case.pop("k"),
          layout=layout, bias=True, fmt=fmt, **case)


@pytest.mark.parametrize("act", ACTS + PARAM_ACTS)
def test_epilogues(act):
    rng = np.random.default_rng(len(act))
    for bias, res in [(0, 0), (1, 0), (0, 1), (1, 1)]:
        for layout in ("NCHW", "NHWC"):
            _case(rng, 1, 4, 6, 6, 5, 3, pad=(1, 1, 1, 1), layout=layout, bias=bias, res=res,
                  act=act)


def test_larger_default_implementation():
    rng = np.random.default_rng(2)
    _case(rng, 1, 64, 14, 14, 64, 3, pad=(1, 1, 1, 1), bias=True, res=True, act="relu")
    _case(rng, 1, 64, 14, 14, 64, 3, pad=(1, 1, 1, 1), bias=True, res=True, act="relu",
          layout="NHWC", klayout="HWIO")
    _case(rng, 1, 32, 15, 15, 32, 3, pad=(1, 1, 1, 1), groups=32, bias=True, act="relu",
          layout="NHWC", klayout="HWIO")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_through_relax_call_dps_packed(layout):
    rng = np.random.default_rng(4)
    _case(rng, 1, 6, 7, 7, 4, 3, stride=(2, 2), pad=(1, 1, 1, 1), layout=layout,
          klayout="OHWI", bias=True, res=True, act="clip_0_6", relax_build=True)


@pytest.mark.parametrize(
    "attrs,match",
    [
        ("layout=NCWH", "bad value 'NCWH'"),
        ("klayout=IOHW", "bad value 'IOHW'"),
        ("stride=1", "expected 2 comma-separated integers"),
        ("pad=1,1,1", "expected 4 comma-separated integers"),
        ("pad=1,1,1,x", "expected 4 comma-separated integers"),
        ("pad=-1,0,0,0", "pad must be >= 0"),
        ("stride=0,1", "stride must be >= 1"),
        ("dil=0,1", "dil must be >= 1"),
        ("groups=0", "groups must be >= 1"),
        ("group=1", "unknown attribute"),
        ("act=leaky", "bad activation"),
        ("fmt=nchw16c", "bad value"),
    ],
)
def test_bad_attrs_raise(attrs, match):
    x = np.ones((1, 2, 5, 5), "float32")
    w = np.ones((3, 2, 3, 3), "float32")
    with pytest.raises(ValueError, match=match):
        call_direct(native.CONV2D, attrs, [x, w], (1, 3, 3, 3))


def test_bad_shapes_raise():
    x = np.ones((1, 4, 5, 5), "float32")
    w = np.ones((3, 4, 3, 3), "float32")
    with pytest.raises(ValueError, match="Out has shape"):
        call_direct(native.CONV2D, "", [x, w], (1, 3, 5, 5))
    with pytest.raises(ValueError, match="groups=2"):
        call_direct(native.CONV2D, "groups=2", [x, w], (1, 3, 3, 3))
    with pytest.raises(ValueError, match="larger than the padded input"):
        call_direct(native.CONV2D, "", [np.ones((1, 4, 2, 2), "float32"), w], (1, 3, 1, 1))
    with pytest.raises(ValueError, match="rank >= 4"):
        call_direct(native.CONV2D, "", [np.ones((4, 5, 5), "float32"), w], (3, 3, 3))
    with pytest.raises(ValueError, match="bias has shape"):
        call_direct(native.CONV2D, "bias=1", [x, w, np.ones(4, "float32")], (1, 3, 3, 3))
    with pytest.raises(TypeError, match="expected 5 arguments"):
        call_direct(native.CONV2D, "res=1", [x, w], (1, 3, 3, 3))


PACK = "tvm_ollie.cpu.conv2d_pack_weight"
PACK_SIZE = "tvm_ollie.cpu.conv2d_packed_size"


def _pack(attrs, x, w):
    import tvm_ffi

    size = tvm_ffi.get_global_func(PACK_SIZE)(attrs, list(x.shape), list(w.shape))
    return call_direct(PACK, attrs, [x, w], (size,))


@pytest.mark.parametrize(
    "layout,klayout,groups,o,act",
    [("NCHW", "OIHW", 1, 6, "relu"), ("NHWC", "HWIO", 1, 6, "none"),
     ("NHWC", "OHWI", 2, 6, "silu"), ("NCHW", "OIHW", 8, 8, "clip_0_6")],
)
def test_packed_weights_match_unpacked(layout, klayout, groups, o, act):
    rng = np.random.default_rng(groups)
    n, c, h, w, k = 1, 8, 9, 7, 3
    x = rng.standard_normal((n, c, h, w) if layout == "NCHW" else (n, h, w, c)).astype("f4")
    wshape = {"OIHW": (o, c // groups, k, k), "HWIO": (k, k, c // groups, o),
              "OHWI": (o, k, k, c // groups)}[klayout]
    wt = rng.standard_normal(wshape).astype("float32")
    bias = rng.standard_normal(o).astype("float32")
    out_shape = (n, o, h, w) if layout == "NCHW" else (n, h, w, o)
    res = rng.standard_normal(out_shape).astype("float32")
    attrs = (f"layout={layout};klayout={klayout};pad=1,1,1,1;groups={groups};bias=1;res=1;"
             f"act={act}")
    packed = _pack(attrs, x, wt)
    assert packed.ndim == 1 and packed.size > wt.size  # header + (padded) blocked weights
    ref = call_direct(native.CONV2D, attrs, [x, wt, bias, res], out_shape)
    out = call_direct(native.CONV2D, attrs + f";wpacked=1;kernel={k},{k}",
                      [x, packed, bias, res], out_shape)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_packed_weights_run_on_another_problem_through_their_format_tag():
    """A pack whose hash does not match the call (another problem here; on users' machines:
    another CPU or thread count) is reordered from the format tag in its header: the call
    computes what the unpacked call does."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 9, 9)).astype("float32")
    wt = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    packed = _pack("pad=1,1,1,1", x, wt)
    assert packed[:16].view("uint64")[2] != 0  # the tag
    for attrs, shape in [("pad=1,1,1,1;act=relu", (1, 8, 9, 9)), ("stride=2,2", (1, 8, 4, 4))]:
        ref = call_direct(native.CONV2D, attrs, [x, wt], shape)
        out = call_direct(native.CONV2D, attrs + ";wpacked=1;kernel=3,3", [x, packed], shape)
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_packed_weights_for_other_weights_are_rejected():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 8, 9, 9)).astype("float32")
    wt = rng.standard_normal((8, 8, 3, 3)).astype("float32")
    packed = _pack("pad=1,1,1,1", x, wt)
    with pytest.raises(ValueError, match="packed weight has"):
        call_direct(native.CONV2D, "pad=1,1,1,1;wpacked=1;kernel=3,3", [x, packed[:-1]],
                    (1, 8, 9, 9))
    with pytest.raises(ValueError, match="made for other weights"):  # 8x8x1x1: other dims
        call_direct(native.CONV2D, "wpacked=1;kernel=1,1", [x, packed], (1, 8, 9, 9))
    bad = packed.copy()
    bad[:4] = 0
    with pytest.raises(ValueError, match="header mismatch"):
        call_direct(native.CONV2D, "pad=1,1,1,1;wpacked=1;kernel=3,3", [x, bad], (1, 8, 9, 9))
    with pytest.raises(ValueError, match="needs kernel"):
        call_direct(native.CONV2D, "pad=1,1,1,1;wpacked=1", [x, packed], (1, 8, 9, 9))
    with pytest.raises(ValueError, match="expected \\["):
        call_direct(PACK, "pad=1,1,1,1", [x, wt], (7,))
