"""The int8 kernels ``tvm_ollie.cpu.conv2d_int8`` / ``matmul_int8`` against numpy's integers.

    Out = saturate(round(scale * sum (x - xzp) * w + bias) + yzp)

The references sum in int64 (exact); an int32 Out must match exactly, an 8-bit Out within one
step (oneDNN adds the destination zero point before it rounds, so a tie can round the other
way, and it applies the scale to the float32 accumulator in its own order).
"""

import numpy as np
import pytest

from native_util import require_native, two_threads_stall_on
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.CONV2D_INT8) or not native.provides(native.MATMUL_INT8):
        pytest.skip("the loaded native library predates the int8 kernels")


def _call(name, attrs, arrays, out):
    import tvm_ffi

    func = tvm_ffi.get_global_func(name)
    func(attrs, *[tvm_ffi.from_dlpack(np.ascontiguousarray(a)) for a in arrays],
         tvm_ffi.from_dlpack(out))
    return out


def _ints(rng, dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    lo = info.min if lo is None else lo
    hi = info.max if hi is None else hi
    return rng.integers(lo, hi + 1, shape).astype(dtype)


def _weights(rng, shape):
    """int8 weights, in [-64, 63] where the CPU lacks VNNI (the kernels' exact range there)."""
    return _ints(rng, np.int8, shape, *((-128, 127) if native.int8_exact_products() else
                                        (-64, 63)))


def conv_ref(x, w, zp, stride, pad, dil, groups):
    """int64 ``conv2d(x - zp, w)``, NCHW/OIHW, padding reading ``zp`` (zero after centering)."""
    xc = np.pad(x.astype(np.int64) - zp, ((0, 0), (0, 0), (pad[0], pad[2]), (pad[1], pad[3])))
    n, _, h, wd = xc.shape
    o, i, kh, kw = w.shape
    oh = (h - (kh - 1) * dil[0] - 1) // stride[0] + 1
    ow = (wd - (kw - 1) * dil[1] - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    per_group = o // groups
    for c in range(o):
        g = c // per_group
        for r in range(kh):
            for s in range(kw):
                patch = xc[:, g * i:(g + 1) * i, r * dil[0]:r * dil[0] + stride[0] * oh:stride[0],
                           s * dil[1]:s * dil[1] + stride[1] * ow:stride[1]]
                out[:, c] += np.einsum("nchw,c->nhw", patch, w[c, :, r, s].astype(np.int64))
    return out


CONV_CASES = {
    "u8-plain": (np.uint8, 1, (1, 1), (0, 0, 0, 0), (1, 1)),
    "s8-group2-stride2-pads": (np.int8, 2, (2, 2), (1, 1, 2, 1), (1, 1)),
    "u8-depthwise-dilated": (np.uint8, 4, (1, 1), (2, 2, 2, 2), (2, 2)),
}


@pytest.mark.parametrize("name", sorted(CONV_CASES))
def test_conv2d_int8_int32_out_is_exact(name):
    xtype, groups, stride, pad, dil = CONV_CASES[name]
    rng = np.random.default_rng(0)
    x = _ints(rng, xtype, (2, 4, 7, 6))
    w = _weights(rng, (8, 4 // groups, 3, 3))
    zp = np.array([100 if xtype == np.uint8 else -7], np.int32)
    ref = conv_ref(x, w, int(zp[0]), stride, pad, dil, groups)
    attrs = (f"stride={stride[0]},{stride[1]};pad={','.join(map(str, pad))};"
             f"dil={dil[0]},{dil[1]};groups={groups};xzp=1")
    out = _call(native.CONV2D_INT8, attrs, [x, w, zp], np.zeros(ref.shape, np.int32))
    assert np.array_equal(out, ref)


def test_conv2d_int8_without_zero_point_nhwc():
    rng = np.random.default_rng(1)
    x = _ints(rng, np.uint8, (1, 5, 5, 3))
    w = _weights(rng, (4, 3, 3, 3))
    ref = conv_ref(x.transpose(0, 3, 1, 2), w, 0, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    out = _call(native.CONV2D_INT8, "layout=NHWC;pad=1,1,1,1", [x, w],
                np.zeros((1, 5, 5, 4), np.int32))
    assert np.array_equal(out.transpose(0, 3, 1, 2), ref)


def _requantized(acc, scale, bias, yzp, dtype):
    info = np.iinfo(dtype)
    return np.clip(np.round(acc * scale + bias) + yzp, info.min, info.max)


@pytest.mark.parametrize("per_channel", [False, True])
def test_conv2d_int8_requantizes_to_u8_within_one_step(per_channel):
    rng = np.random.default_rng(2)
    x = _ints(rng, np.uint8, (1, 4, 6, 6))
    w = _weights(rng, (6, 4, 3, 3))
    zp, yzp = np.array([128], np.int32), np.array([10], np.int32)
    scale = (rng.random(6 if per_channel else 1) * 0.01 + 0.002).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32) * 5
    acc = conv_ref(x, w, 128, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    shaped = scale.reshape(1, -1, 1, 1).astype(np.float64)
    ref = _requantized(acc, shaped, bias.reshape(1, -1, 1, 1), 10, np.uint8)
    attrs = f"pad=1,1,1,1;xzp=1;scale={'channel' if per_channel else 'tensor'};bias=1;yzp=1"
    out = _call(native.CONV2D_INT8, attrs, [x, w, zp, scale, bias, yzp],
                np.zeros(ref.shape, np.uint8))
    assert np.abs(out.astype(np.int64) - ref).max() <= 1
    assert out.max() > 10 and out.min() < 250  # not all saturated


#: oneDNN's s8-source convolutions on x86 without VNNI keep the source signed and halve the
#: weights in their reorder (its s8s8 compensation, ``scale_adjust`` 0.5, rounded half to
#: even): odd weights lose a bit (measured on an AVX2 EPYC: weight 1 -> 0, 3 -> 4). The rewrite
#: keeps TVM's int32 convolution for such sources there (int8_kernels._conv_source_exact).
NO_VNNI_S8_CONV = "s8-source convolutions without VNNI halve the weights (oneDNN's s8s8 path)"


def _require_s8_conv_exact():
    if not native.int8_exact_products():
        pytest.skip(NO_VNNI_S8_CONV)


@pytest.mark.parametrize("xtype", [np.uint8, np.int8])
def test_conv2d_int8_float_out_scaled(xtype):
    if xtype == np.int8:
        _require_s8_conv_exact()
    rng = np.random.default_rng(3)
    x = _ints(rng, xtype, (1, 2, 5, 5))
    w = _weights(rng, (3, 2, 1, 1))
    scale = np.array([0.5, 0.25, 2.0], np.float32)
    acc = conv_ref(x, w, 0, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    out = _call(native.CONV2D_INT8, "scale=channel", [x, w, scale],
                np.zeros(acc.shape, np.float32))
    np.testing.assert_allclose(out, acc * scale.reshape(1, 3, 1, 1), rtol=1e-6)


@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("xtype", [np.uint8, np.int8])
def test_matmul_int8_int32_out_is_exact(xtype, tb):
    rng = np.random.default_rng(4)
    a = _ints(rng, xtype, (2, 3, 16))
    b = _weights(rng, (16, 5))
    zp = np.array([3], np.int32)
    ref = (a.astype(np.int64) - 3) @ b.astype(np.int64)
    stored = np.ascontiguousarray(b.T) if tb else b
    out = _call(native.MATMUL_INT8, f"tb={int(tb)};xzp=1", [a, stored, zp],
                np.zeros(ref.shape, np.int32))
    assert np.array_equal(out, ref)


def test_matmul_int8_per_column_scale_to_s8():
    rng = np.random.default_rng(5)
    a = _ints(rng, np.uint8, (4, 32))
    b = _weights(rng, (32, 6))
    scale = (rng.random(6) * 0.002 + 0.0005).astype(np.float32)
    acc = (a.astype(np.int64) - 120) @ b.astype(np.int64)
    ref = _requantized(acc, scale.astype(np.float64), 0.0, -3, np.int8)
    out = _call(native.MATMUL_INT8, "xzp=1;scale=channel;yzp=1",
                [a, b, np.array([120], np.int32), scale, np.array([-3], np.int32)],
                np.zeros(ref.shape, np.int8))
    assert np.abs(out.astype(np.int64) - ref).max() <= 1


def test_int8_kernels_reject_float_data_and_wrong_operands():
    rng = np.random.default_rng(6)
    w = _weights(rng, (2, 2, 1, 1))
    with pytest.raises(TypeError, match="uint8 or int8"):
        _call(native.CONV2D_INT8, "", [np.zeros((1, 2, 3, 3), np.float32), w],
              np.zeros((1, 2, 3, 3), np.int32))
    with pytest.raises(TypeError, match="expected 5 arguments"):
        _call(native.CONV2D_INT8, "xzp=1", [np.zeros((1, 2, 3, 3), np.uint8), w],
              np.zeros((1, 2, 3, 3), np.int32))
    with pytest.raises(ValueError, match="scale has shape"):
        _call(native.MATMUL_INT8, "scale=channel", [np.zeros((2, 4), np.uint8),
                                                    np.zeros((4, 3), np.int8),
                                                    np.ones(2, np.float32)],
              np.zeros((2, 3), np.float32))


# --- rq=1: ONNX's QLinearConv/QLinearMatMul requantization inside the kernel, bit-exact -------


def onnx_requantized(acc, bias, scale, yzp, dtype):
    """ONNX Runtime's (MLAS's) requantization: float32(acc + bias) * scale in float32, rounded
    half to even, the zero point added, saturated."""
    value = (acc.astype(np.int64) + bias.astype(np.int64)).astype(np.float32)
    value = value * scale.astype(np.float32)
    info = np.iinfo(dtype)
    return np.clip(np.rint(value) + yzp, info.min, info.max).astype(dtype)


#: Per-column multipliers of the tie test: exact ties (0.5, 1/128), values 2^-20 above a tie
#: (oneDNN's own zero point, added before rounding, loses that bit: fl(200.5 + 2^-20) = 200.5),
#: and multipliers that saturate both ends.
TIE_SCALES = np.array([0.5, 0.5 + 2.0 ** -20, 1.5 - 2.0 ** -20, 1.0 / 128, 1.0, 3.0],
                      np.float32)


@pytest.mark.parametrize("dtype, yzp", [(np.uint8, 101), (np.uint8, 0), (np.int8, -3),
                                        (np.int8, 7)])
def test_matmul_int8_rq_is_exact_at_ties_and_limits(dtype, yzp):
    """acc = a - xzp over every 8-bit value (K = 1, B = 1): each multiplier meets its ties, and
    the large ones saturate at both type limits."""
    info = np.iinfo(dtype)
    a = np.arange(info.min, info.max + 1).astype(dtype).reshape(-1, 1)
    xzp = 0 if dtype == np.int8 else 128
    b = np.ones((1, TIE_SCALES.size), np.int8)
    bias = np.array([0, 1, -1, 64, -3, 0], np.float32)
    acc = (a.astype(np.int64) - xzp) @ b.astype(np.int64)
    ref = onnx_requantized(acc, bias.reshape(1, -1), TIE_SCALES.reshape(1, -1), yzp, dtype)
    out = _call(native.MATMUL_INT8, "xzp=1;scale=channel;bias=1;yzp=1;rq=1",
                [a, b, np.array([xzp], np.int32), TIE_SCALES, bias,
                 np.array([yzp], np.int32)], np.zeros(ref.shape, dtype))
    assert np.array_equal(out, ref)
    assert out.min() == info.min and out.max() == info.max


RQ_CONV_CASES = {
    "u8-per-channel-pads": (np.uint8, np.uint8, 1, True, (1, 1), (1, 1, 1, 1)),
    "u8-to-s8-per-tensor-stride2": (np.uint8, np.int8, 1, False, (2, 2), (0, 1, 1, 0)),
    "s8-group2-per-channel": (np.int8, np.int8, 2, True, (1, 1), (1, 1, 1, 1)),
    "u8-depthwise-per-tensor": (np.uint8, np.uint8, 4, False, (1, 1), (1, 1, 1, 1)),
}


@pytest.mark.parametrize("name", sorted(RQ_CONV_CASES))
def test_conv2d_int8_rq_equals_onnx_requantization(name):
    xtype, ytype, groups, per_channel, stride, pad = RQ_CONV_CASES[name]
    rng = np.random.default_rng(7)
    x = _ints(rng, xtype, (2, 4, 7, 6))
    w = _weights(rng, (8, 4 // groups, 3, 3))
    xzp = 100 if xtype == np.uint8 else -5
    yzp = 131 if ytype == np.uint8 else -9
    acc = conv_ref(x, w, xzp, stride, pad, (1, 1), groups)
    spread = float(np.abs(acc).max())
    # Powers of two times small odd numbers put many products on .5 ties; 8/spread saturates.
    scale = (rng.integers(1, 8, 8 if per_channel else 1) * 2.0 ** -9).astype(np.float32)
    scale[0] = np.float32(300.0 / spread)
    bias = rng.integers(-3000, 3000, 8).astype(np.float32)
    wide = np.broadcast_to(scale, (8,)).reshape(1, 8, 1, 1)
    ref = onnx_requantized(acc, bias.reshape(1, 8, 1, 1), wide, yzp, ytype)
    attrs = (f"stride={stride[0]},{stride[1]};pad={','.join(map(str, pad))};groups={groups};"
             f"xzp=1;scale={'channel' if per_channel else 'tensor'};bias=1;yzp=1;rq=1")
    out = _call(native.CONV2D_INT8, attrs,
                [x, w, np.array([xzp], np.int32), scale, bias, np.array([yzp], np.int32)],
                np.zeros(ref.shape, ytype))
    assert np.array_equal(out, ref)
    assert len(np.unique(out)) > 8  # not all saturated


def test_conv2d_int8_rq_without_scale_rounds_nothing():
    """rq=1 without a scale: the (integer) accumulator plus the bias, saturated."""
    rng = np.random.default_rng(8)
    x = _ints(rng, np.uint8, (1, 2, 4, 4), 0, 3)
    w = _weights(rng, (3, 2, 1, 1))
    bias = np.array([0, 5, -5], np.float32)
    acc = conv_ref(x, w, 0, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    ref = np.clip(acc + bias.reshape(1, 3, 1, 1), -128, 127).astype(np.int8)
    out = _call(native.CONV2D_INT8, "bias=1;rq=1", [x, w, bias], np.zeros(ref.shape, np.int8))
    assert np.array_equal(out, ref)


# --- packed weights: conv2d_int8_packed_size / conv2d_int8_pack_weight, wpacked=1 ---------------


def _pack(attrs, x, w, out):
    import tvm_ffi

    args = [tvm_ffi.from_dlpack(np.ascontiguousarray(a)) for a in (x, w, out)]
    size = int(tvm_ffi.get_global_func(native.CONV2D_INT8_PACKED_SIZE)(attrs, *args))
    packed = np.zeros(size, np.int8)
    tvm_ffi.get_global_func(native.CONV2D_INT8_PACK_WEIGHT)(attrs, *args,
                                                             tvm_ffi.from_dlpack(packed))
    return packed


@pytest.mark.parametrize("xtype, groups, rq", [(np.uint8, 1, True), (np.int8, 2, False)])
def test_conv2d_int8_packed_weight_equals_the_plain_call(xtype, groups, rq):
    if not native.provides(native.CONV2D_INT8_PACK_WEIGHT):
        pytest.skip("the loaded native library predates the int8 weight packing")
    rng = np.random.default_rng(9)
    x = _ints(rng, xtype, (1, 4, 7, 7))
    w = _weights(rng, (8, 4 // groups, 3, 3))
    xzp = np.array([100 if xtype == np.uint8 else -4], np.int32)
    attrs = f"pad=1,1,1,1;groups={groups};xzp=1"
    operands = [xzp]
    out_type = np.int32
    if rq:
        attrs += ";scale=channel;bias=1;yzp=1;rq=1"
        operands += [np.full(8, 0.004, np.float32), np.arange(8, dtype=np.float32),
                     np.array([3], np.int32)]
        out_type = np.uint8
    plain = _call(native.CONV2D_INT8, attrs, [x, w, *operands], np.zeros((1, 8, 7, 7), out_type))
    packed = _pack(attrs, x, w, np.zeros((1, 8, 7, 7), out_type))
    assert packed.size > w.size  # header and compensation
    ours = _call(native.CONV2D_INT8, attrs + ";wpacked=1;kernel=3,3", [x, packed, *operands],
                 np.zeros((1, 8, 7, 7), out_type))
    assert np.array_equal(ours, plain)
    assert len(np.unique(plain)) > 4


def test_conv2d_int8_packed_weight_is_checked():
    if not native.provides(native.CONV2D_INT8_PACK_WEIGHT):
        pytest.skip("the loaded native library predates the int8 weight packing")
    rng = np.random.default_rng(10)
    x, w = _ints(rng, np.uint8, (1, 4, 5, 5)), _weights(rng, (4, 4, 3, 3))
    out = np.zeros((1, 4, 5, 5), np.int32)
    packed = _pack("pad=1,1,1,1", x, w, out)
    with pytest.raises(ValueError, match="another problem"):  # another padding
        _call(native.CONV2D_INT8, "wpacked=1;kernel=3,3", [x, packed],
              np.zeros((1, 4, 3, 3), np.int32))
    with pytest.raises(ValueError, match="must not set wpacked"):
        _pack("pad=1,1,1,1;wpacked=1;kernel=3,3", x, w, out)
    with pytest.raises(ValueError, match="needs kernel"):
        _call(native.CONV2D_INT8, "wpacked=1", [x, packed], out)


# --- repeated calls: one thread's memory objects are kept per primitive, handles reset ----------


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_int8_repeated_calls_read_each_calls_operands(layout):
    """The same attrs and shapes called again with new buffers and new zero points, scales,
    biases: every call reads its own operands (the kernel keeps its dnnl::memory objects per
    thread and primitive and only resets their data handles), also when calls of another
    problem come in between."""
    rng = np.random.default_rng(11)
    attrs = (f"layout={layout};klayout={'OIHW' if layout == 'NCHW' else 'OHWI'};pad=1,1,1,1;"
             "xzp=1;scale=channel;bias=1;yzp=1;rq=1")
    for step in range(4):
        x = _ints(rng, np.uint8, (1, 4, 6, 6))
        w = _weights(rng, (8, 4, 3, 3))
        xzp, yzp = int(rng.integers(0, 256)), int(rng.integers(0, 256))
        scale = (rng.integers(1, 16, 8) * 2.0 ** -12).astype(np.float32)
        bias = rng.integers(-500, 500, 8).astype(np.float32)
        acc = conv_ref(x, w, xzp, (1, 1), (1, 1, 1, 1), (1, 1), 1)
        ref = onnx_requantized(acc, bias.reshape(1, 8, 1, 1), scale.reshape(1, 8, 1, 1), yzp,
                               np.uint8)
        xs, ws, refs = x, w, ref
        if layout == "NHWC":
            xs, ws, refs = x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), ref.transpose(
                0, 2, 3, 1)
        out = _call(native.CONV2D_INT8, attrs,
                    [xs, ws, np.array([xzp], np.int32), scale, bias, np.array([yzp], np.int32)],
                    np.zeros(refs.shape, np.uint8))
        assert np.array_equal(out, refs), step
        # another problem in between (its own primitive and memory objects)
        other = _ints(rng, np.int8, (1, 3, 2, 5))
        got = _call(native.MATMUL_INT8, "xzp=1", [other, w.reshape(8, -1)[:, :5].T.copy(),
                                                  np.array([xzp % 100], np.int32)],
                    np.zeros((1, 3, 2, 8), np.int32))
        want = (other.astype(np.int64) - xzp % 100) @ w.reshape(8, -1)[:, :5].T.astype(np.int64)
        assert np.array_equal(got, want)


# --- packed matmul weights: matmul_int8_packed_size / matmul_int8_pack_weight, wpacked=1 --------

MATMUL_PACKED_SIZE = "tvm_ollie.cpu.matmul_int8_packed_size"
MATMUL_PACK_WEIGHT = "tvm_ollie.cpu.matmul_int8_pack_weight"


def _pack_matmul(attrs, a, b, out):
    import tvm_ffi

    args = [tvm_ffi.from_dlpack(np.ascontiguousarray(t)) for t in (a, b, out)]
    size = int(tvm_ffi.get_global_func(MATMUL_PACKED_SIZE)(attrs, *args))
    packed = np.zeros(size, np.int8)
    tvm_ffi.get_global_func(MATMUL_PACK_WEIGHT)(attrs, *args, tvm_ffi.from_dlpack(packed))
    return packed


@pytest.mark.parametrize("xtype, tb, rq", [(np.uint8, False, True), (np.int8, True, False),
                                           (np.uint8, True, True)])
def test_matmul_int8_packed_weight_equals_the_plain_call(xtype, tb, rq):
    """B packed once (header, the primitive's format, the zero point's compensation) gives the
    plain call's integers, with a batch folded into M; the header is checked."""
    if not native.provides(MATMUL_PACK_WEIGHT):
        pytest.skip("the loaded native library predates the int8 matmul packing")
    rng = np.random.default_rng(12)
    a = _ints(rng, xtype, (2, 3, 40))
    b = _weights(rng, (24, 40) if tb else (40, 24))
    xzp = np.array([77 if xtype == np.uint8 else -6], np.int32)
    attrs, operands, out_type = f"tb={int(tb)};xzp=1", [xzp], np.int32
    if rq:
        attrs += ";scale=channel;bias=1;yzp=1;rq=1"
        operands += [(rng.integers(1, 16, 24) * 2.0 ** -12).astype(np.float32),
                     rng.integers(-900, 900, 24).astype(np.float32), np.array([9], np.int32)]
        out_type = np.uint8
    plain = _call(native.MATMUL_INT8, attrs, [a, b, *operands], np.zeros((2, 3, 24), out_type))
    want = (a.astype(np.int64) - xzp[0]) @ (b.T if tb else b).astype(np.int64)
    if rq:
        want = onnx_requantized(want, operands[2], operands[1], 9, np.uint8)
    assert np.array_equal(plain, want)
    packed = _pack_matmul(attrs, a, b, np.zeros((2, 3, 24), out_type))
    assert packed.size > b.size
    for _ in range(2):
        ours = _call(native.MATMUL_INT8, attrs + ";wpacked=1", [a, packed, *operands],
                     np.zeros((2, 3, 24), out_type))
        assert np.array_equal(ours, plain)
    with pytest.raises(ValueError, match="another problem"):
        _call(native.MATMUL_INT8, attrs + ";wpacked=1", [a[:1], packed, *operands],
              np.zeros((1, 3, 24), out_type))
    with pytest.raises(ValueError, match="wpacked"):
        _pack_matmul(attrs + ";wpacked=1", a, b, np.zeros((2, 3, 24), out_type))


# --- packs and thread counts: a pack is made for the primitive of one OpenMP thread count --------


@pytest.fixture
def _two_threads_stall_on():
    """Two threads, every call parallel, the stall fallback on; restored after."""
    with two_threads_stall_on():
        yield


def _header_threads(packed: np.ndarray) -> int:
    return int(packed[:64].view(np.uint64)[2])


@pytest.mark.parametrize("how", ["stall window", "one thread"])
def test_int8_packs_stay_usable_at_another_thread_count(_two_threads_stall_on, how):
    """Packs made at two threads give the plain call's integers in the stall fallback's serial
    window and after set_num_threads(1): oneDNN's int8 weight format can differ by thread count,
    so such calls run at their pack's count (before, they raised "made for another problem")."""
    if not native.provides(native.STALL_STATS):
        pytest.skip("the loaded native library has no stall fallback (built before it)")
    rng = np.random.default_rng(21)
    # A 1x1 convolution to 512 channels over a 1x48 row: on this oneDNN (AVX-512) the weight
    # format of its one-thread primitive differs from the two-thread one's.
    x, w = _ints(rng, np.uint8, (1, 3, 1, 48)), _weights(rng, (512, 3, 1, 1))
    a, b = _ints(rng, np.uint8, (24, 512)), _weights(rng, (512, 256))
    xzp = np.array([100], np.int32)
    conv_attrs, mm_attrs = "xzp=1", "tb=0;xzp=1"
    conv_out, mm_out = np.zeros((1, 512, 1, 48), np.int32), np.zeros((24, 256), np.int32)
    conv_plain = _call(native.CONV2D_INT8, conv_attrs, [x, w, xzp], conv_out.copy())
    mm_plain = _call(native.MATMUL_INT8, mm_attrs, [a, b, xzp], mm_out.copy())
    conv_packed = _pack(conv_attrs, x, w, conv_out)
    mm_packed = _pack_matmul(mm_attrs, a, b, mm_out)
    assert _header_threads(conv_packed) == _header_threads(mm_packed) == 2
    if how == "stall window":
        native.hold_serial(10_000_000)  # 10 s
    else:
        native.set_num_threads(1)
    conv = _call(native.CONV2D_INT8, conv_attrs + ";wpacked=1;kernel=1,1",
                 [x, conv_packed, xzp], conv_out.copy())
    mm = _call(native.MATMUL_INT8, mm_attrs + ";wpacked=1", [a, mm_packed, xzp], mm_out.copy())
    assert np.array_equal(conv, conv_plain)
    assert np.array_equal(mm, mm_plain)
    assert native.get_num_threads() == (2 if how == "stall window" else 1)  # restored


def test_int8_packs_skip_the_stall_window(_two_threads_stall_on):
    """A pack made while a stall holds calls serial is still made for the parallel primitive:
    the window passes, the pack stays."""
    if not native.provides(native.STALL_STATS):
        pytest.skip("the loaded native library has no stall fallback (built before it)")
    rng = np.random.default_rng(22)
    x, w = _ints(rng, np.uint8, (1, 16, 9, 9)), _weights(rng, (16, 16, 3, 3))
    native.hold_serial(10_000_000)
    packed = _pack("pad=1,1,1,1", x, w, np.zeros((1, 16, 9, 9), np.int32))
    assert _header_threads(packed) == 2
