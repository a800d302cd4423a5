"""tvm_ollie.cpu.matmul against numpy: shapes, transposes, broadcasting, epilogues, errors."""

import numpy as np
import pytest

from native_util import ACTS, PARAM_ACTS, act_ref, call_direct, call_relax, require_native
from tvm_ollie import native

LIBS = ["onednn", "openblas"]


@pytest.fixture(autouse=True)
def _native():
    require_native()


def _case(rng, a_shape, b_shape, ta, tb, bias, res, act, lib=None):
    """Run one matmul case directly and compare with numpy (float64 reference)."""
    a = rng.standard_normal(a_shape).astype("float32")
    b = rng.standard_normal(b_shape).astype("float32")
    a_l = np.swapaxes(a, -1, -2) if ta else a
    b_l = np.swapaxes(b, -1, -2) if tb else b
    ref = np.matmul(a_l.astype("float64"), b_l.astype("float64"))
    arrays = [a, b]
    attrs = f"ta={int(ta)};tb={int(tb)};bias={int(bias)};res={int(res)};act={act}"
    if lib:
        attrs += f";lib={lib}"
    if bias:
        bv = rng.standard_normal(ref.shape[-1]).astype("float32")
        arrays.append(bv)
        ref = ref + bv
    if res:
        rv = rng.standard_normal(ref.shape).astype("float32")
        arrays.append(rv)
        ref = ref + rv
    ref = act_ref(ref, act)
    out = call_direct(native.MATMUL, attrs, arrays, ref.shape)
    k = a_l.shape[-1]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(k, 1) ** 0.5 + 1e-5)
    return out


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
def test_odd_shapes_and_transposes(lib, ta, tb):
    rng = np.random.default_rng(ta * 2 + tb)
    m, k, n = 7, 13, 5
    _case(rng, (k, m) if ta else (m, k), (n, k) if tb else (k, n), ta, tb, 0, 0, "none", lib)
    # batched with the same transposes
    _case(rng, (3, k, m) if ta else (3, m, k), (3, n, k) if tb else (3, k, n), ta, tb, 1, 1,
          "relu", lib)


@pytest.mark.parametrize("lib", [None, "openblas"])
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("m,k,n", [(1, 256, 320), (1, 13, 5), (70, 33, 1), (1, 9, 1)])
def test_matrix_vector_calls(lib, ta, tb, m, k, n):
    """M == 1 or N == 1: the BLAS path's gemv loops (tvm_ollie/gemv.cc), each batch one product."""
    rng = np.random.default_rng(m + k + n + 2 * ta + tb)
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)
    _case(rng, a_shape, b_shape, ta, tb, 0, 0, "none", lib)
    _case(rng, a_shape, b_shape, ta, tb, 1, 1, "relu", lib)
    _case(rng, (3,) + a_shape, b_shape, ta, tb, 1, 0, "none", lib)  # B shared (folded if ta=0)
    _case(rng, (2, 1) + a_shape, (3,) + b_shape, ta, tb, 0, 1, "relu", lib)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((4, 7, 13), (13, 5)),  # B shared by the batch (folded into one GEMM)
        ((7, 13), (2, 13, 5)),  # A shared
        ((2, 1, 7, 13), (3, 13, 5)),  # both broadcast: out [2, 3, 7, 5]
        ((1, 3, 7, 13), (2, 1, 13, 5)),
        ((2, 3, 7, 13), (1, 13, 5)),
    ],
)
def test_batch_broadcast(lib, a_shape, b_shape):
    rng = np.random.default_rng(len(a_shape) + len(b_shape))
    _case(rng, a_shape, b_shape, 0, 0, 1, 1, "silu", lib)


@pytest.mark.parametrize("lib", LIBS)
def test_batch_broadcast_transposed(lib):
    rng = np.random.default_rng(3)
    _case(rng, (2, 1, 13, 7), (3, 5, 13), 1, 1, 1, 0, "tanh", lib)
    _case(rng, (4, 13, 7), (5, 13), 1, 1, 0, 1, "none", lib)


@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("act", ACTS + PARAM_ACTS)
def test_epilogues(lib, act):
    rng = np.random.default_rng(len(act))
    for bias, res in [(0, 0), (1, 0), (0, 1), (1, 1)]:
        _case(rng, (2, 9, 17), (17, 6), 0, 0, bias, res, act, lib)


@pytest.mark.parametrize("lib", LIBS)
def test_clip_bounds_as_python_repr(lib):
    """The pass writes clip bounds with repr(): 0.0, 6.0, -inf, 1e-05."""
    rng = np.random.default_rng(1)
    for act in ("clip_0.0_6.0", "clip_-inf_0.5", "clip_1e-05_inf", "clip_-1.5_-0.5"):
        _case(rng, (5, 11), (11, 4), 0, 0, 1, 0, act, lib)


def test_default_lib_larger_shapes():
    rng = np.random.default_rng(7)
    _case(rng, (64, 256), (256, 96), 0, 0, 1, 1, "gelu")
    _case(rng, (1, 300), (200, 300), 0, 1, 1, 0, "none")
    _case(rng, (49, 120), (120, 33), 0, 0, 0, 0, "relu")


def test_libs_agree_and_residual_before_activation():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((5, 8)).astype("float32")
    b = rng.standard_normal((8, 4)).astype("float32")
    r = np.full((5, 4), -100.0, dtype="float32")  # drives everything negative before relu
    for lib in LIBS:
        out = call_direct(native.MATMUL, f"res=1;act=relu;lib={lib}", [a, b, r], (5, 4))
        np.testing.assert_array_equal(out, np.zeros((5, 4), "float32"))


@pytest.mark.parametrize("lib", LIBS)
def test_empty_reduction(lib):
    """K == 0: the product is all zeros, Out = act(bias + residual)."""
    a = np.zeros((3, 0), "float32")
    b = np.zeros((0, 4), "float32")
    bias = np.arange(4, dtype="float32") - 1.5
    out = call_direct(native.MATMUL, f"bias=1;act=relu;lib={lib}", [a, b, bias], (3, 4))
    np.testing.assert_array_equal(out, np.tile(np.maximum(bias, 0), (3, 1)))


def test_primitives_are_cached():
    import tvm_ffi

    stats = tvm_ffi.get_global_func(native.CACHE_STATS)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((6, 10)).astype("float32")
    b = rng.standard_normal((10, 3)).astype("float32")
    call_direct(native.MATMUL, "lib=onednn;act=sigmoid", [a, b], (6, 3))
    size0 = dict(kv.split("=") for kv in stats().split(";"))["size"]
    for _ in range(3):
        call_direct(native.MATMUL, "lib=onednn;act=sigmoid", [a, b], (6, 3))
    size1 = dict(kv.split("=") for kv in stats().split(";"))["size"]
    assert size0 == size1


def test_through_relax_call_dps_packed():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((2, 7, 13)).astype("float32")
    b = rng.standard_normal((5, 13)).astype("float32")
    bias = rng.standard_normal(5).astype("float32")
    res = rng.standard_normal((2, 7, 5)).astype("float32")
    out = call_relax(native.MATMUL, "tb=1;bias=1;res=1;act=gelu", [a, b, bias, res], (2, 7, 5))
    ref = act_ref(a.astype("float64") @ b.T.astype("float64") + bias + res, "gelu")
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "attrs,match",
    [
        ("tx=1", "unknown attribute"),
        ("ta=2", "bad value '2' for attribute 'ta'"),
        ("act=swish", "bad activation"),
        ("act=clip_6_0", "bad activation"),
        ("act=clip_a_b", "bad activation"),
        ("act=clip_nan_1", "bad activation"),
        ("act=clip_1", "bad activation"),
        ("act=leaky_relu_", "bad activation"),
        ("act=leaky_relu_0.1_2", "bad activation"),
        ("act=hardswish_0.2", "bad activation"),
        ("act=hardsigmoid_0.2_inf", "bad activation"),
        ("act=hardsigmoid_a_0.5", "bad activation"),
        ("act=scale_", "bad activation"),
        ("act=scale_inf", "bad activation"),
        ("act=scale_0.5_1", "bad activation"),
        ("lib=mkl", "bad value 'mkl'"),
        ("ta", "expected key=value"),
        ("ta=0;ta=1", "given twice"),
    ],
)
def test_bad_attrs_raise(attrs, match):
    a = np.ones((2, 3), "float32")
    b = np.ones((3, 4), "float32")
    with pytest.raises(ValueError, match=match):
        call_direct(native.MATMUL, attrs, [a, b], (2, 4))


def test_bad_arguments_raise():
    a = np.ones((2, 3), "float32")
    b = np.ones((3, 4), "float32")
    with pytest.raises(TypeError, match="expected 5 arguments"):
        call_direct(native.MATMUL, "bias=1", [a, b], (2, 4))
    with pytest.raises(ValueError, match="inner dimensions differ"):
        call_direct(native.MATMUL, "", [a, np.ones((4, 4), "float32")], (2, 4))
    with pytest.raises(ValueError, match="Out has shape"):
        call_direct(native.MATMUL, "", [a, b], (2, 5))
    with pytest.raises(ValueError, match="do not broadcast"):
        call_direct(native.MATMUL, "", [np.ones((2, 2, 3), "f4"), np.ones((3, 3, 4), "f4")],
                    (3, 2, 4))
    with pytest.raises(ValueError, match="bias has shape"):
        call_direct(native.MATMUL, "bias=1", [a, b, np.ones(3, "float32")], (2, 4))
    with pytest.raises(ValueError, match="residual has shape"):
        call_direct(native.MATMUL, "res=1", [a, b, np.ones((1, 4), "float32")], (2, 4))
    with pytest.raises(TypeError, match="float32"):
        call_direct(native.MATMUL, "", [a.astype("float64"), b], (2, 4))
    with pytest.raises(ValueError, match="rank >= 2"):
        call_direct(native.MATMUL, "", [np.ones(3, "float32"), b], (4,))


def test_non_contiguous_raises():
    import tvm_ffi

    a = np.ones((3, 2), "float32").T  # a transposed view: not row-major
    b = np.ones((3, 4), "float32")
    out = np.zeros((2, 4), "float32")
    f = tvm_ffi.get_global_func(native.MATMUL)
    with pytest.raises(ValueError, match="contiguous"):
        f("", tvm_ffi.from_dlpack(a), tvm_ffi.from_dlpack(b), tvm_ffi.from_dlpack(out))


def test_takes_activation_probes_the_loaded_library():
    """native.takes_activation: what this library parses, not what it rejects; asked twice,
    the same answer (cached)."""
    assert native.takes_activation("scale_0.125") and native.takes_activation("relu")
    assert not native.takes_activation("swish")
    assert not native.takes_activation("scale_")
    assert native.takes_activation("scale_0.125") and not native.takes_activation("swish")
