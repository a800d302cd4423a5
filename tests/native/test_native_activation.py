"""The native activations (activation.cc, the epilogue of the GEMM deconvolution, the OpenBLAS
and matrix-vector matmuls and the norms) against numpy: each implementation this CPU runs
(tvm_ollie.cpu.activation_with_vectors: avx2, baseline), every kind, lengths reaching every
vector tail, large, tiny, zero, infinite and NaN inputs, one and two threads; and the GEMM
deconvolution's tanh and sigmoid epilogues, which run these loops since 2026-12-05."""

import numpy as np
import pytest
import tvm_ffi

from tvm_ollie import native

from native_util import act_ref, call_direct, require_native, two_threads_stall_on

WITH_VECTORS = "tvm_ollie.cpu.activation_with_vectors"
VECTORS = "tvm_ollie.cpu.activation_vectors"
KINDS = ["relu", "clip_0_6", "leaky_relu_0.1", "hardswish_0.16666667_0.5",
         "hardsigmoid_0.2_0.5", "scale_0.125", "sigmoid", "silu", "tanh", "gelu", "gelu_tanh"]


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(WITH_VECTORS):
        pytest.skip("native library built before activation_with_vectors")


def runs(vectors):
    """Skip unless this CPU (and the loaded library) runs the implementation ``vectors``."""
    available = tvm_ffi.get_global_func(VECTORS)().split(",")
    if vectors not in available:
        pytest.skip(f"this CPU runs {available}, not {vectors}")


def reference(x, act):
    """``act`` of ``x`` in float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return act_ref(x.astype(np.float64), act)


def call(vectors, act, x):
    out = np.full(x.shape, np.nan, dtype="float32")
    tvm_ffi.get_global_func(WITH_VECTORS)(vectors, act, tvm_ffi.from_dlpack(x),
                                          tvm_ffi.from_dlpack(out))
    return out


def inputs(n, seed):
    """``n`` floats: normal spread over [-12, 12] and every scale down to 1e-6 (both signs)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * 4.0
    scales = 10.0 ** rng.uniform(-6, 1.2, n)
    x[::3] = np.sign(x[::3]) * scales[::3]
    return x.astype("float32")


@pytest.mark.parametrize("vectors", ["avx2", "baseline"])
@pytest.mark.parametrize("act", KINDS)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 17, 31, 1000])
def test_every_kind_and_tail_against_numpy(vectors, act, n):
    runs(vectors)
    x = inputs(n, n + len(act))
    np.testing.assert_allclose(call(vectors, act, x), reference(x, act), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("vectors", ["avx2", "baseline"])
@pytest.mark.parametrize("act", ["sigmoid", "silu", "tanh", "gelu_tanh"])
def test_special_values(vectors, act):
    runs(vectors)
    x = np.array([0.0, -0.0, 1e-30, -1e-30, 0.124999, 0.125, -0.125, 30.0, -30.0, 88.0, -88.0,
                  100.0, -100.0, 1e30, -1e30, np.inf, -np.inf, np.nan], dtype="float32")
    got = call(vectors, act, x)
    ref = reference(x, act)
    finite = np.isfinite(ref)
    np.testing.assert_allclose(got[finite], ref[finite], rtol=2e-6, atol=1e-30)
    assert np.isnan(got[-1])
    if act == "tanh":
        assert got[-3] == 1.0 and got[-2] == -1.0
        assert np.signbit(got[1])  # tanh(-0) = -0
    if act == "sigmoid":
        assert got[-3] == 1.0 and got[-2] == 0.0


@pytest.mark.parametrize("vectors", ["avx2", "baseline"])
def test_implementations_agree_within_rounding(vectors):
    runs(vectors)
    x = inputs(4096, 7)
    for act in KINDS:
        np.testing.assert_allclose(call(vectors, act, x), call("baseline", act, x), rtol=1e-6,
                                   atol=1e-7)


@pytest.mark.parametrize("act", ["relu", "tanh", "silu"])
def test_two_threads_give_the_one_thread_result(act):
    # above 32768 elements the loops are split over the OpenMP threads, at vector boundaries
    x = inputs(100_003, 3)
    best = tvm_ffi.get_global_func(VECTORS)().split(",")[0]
    one = call(best, act, x)
    with two_threads_stall_on():
        two = call(best, act, x)
    np.testing.assert_array_equal(one, two)


def test_in_place_and_errors():
    x = inputs(33, 1)
    y = x.copy()
    buf = tvm_ffi.from_dlpack(y)
    tvm_ffi.get_global_func(WITH_VECTORS)("baseline", "tanh", buf, buf)
    np.testing.assert_allclose(y, np.tanh(x.astype(np.float64)), rtol=2e-6, atol=1e-7)
    f = tvm_ffi.get_global_func(WITH_VECTORS)
    with pytest.raises(ValueError, match="not available on this CPU"):
        f("avx1024", "relu", tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(x.copy()))
    with pytest.raises(ValueError, match="activation"):
        f("baseline", "swoosh", tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(x.copy()))
    with pytest.raises(ValueError, match="expected X's"):
        f("baseline", "relu", tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(x[:5].copy()))
    with pytest.raises(TypeError, match="expected 4 arguments"):
        f("baseline", "relu", tvm_ffi.from_dlpack(x))


@pytest.mark.parametrize("act", ["tanh", "sigmoid", "silu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("bias", [False, True])
def test_gemm_deconvolution_epilogue(act, bias):
    # DCGAN's last layer, small: 8 -> 3 channels, k4 s2 p1, fmt=gemm (fewer than 16 outputs)
    rng = np.random.default_rng(len(act))
    x = rng.standard_normal((1, 8, 9, 7)).astype("float32")
    w = rng.standard_normal((8, 3, 4, 4)).astype("float32")
    b = rng.standard_normal(3).astype("float32")
    attrs = ("layout=NCHW;klayout=IOHW;stride=2,2;pad=1,1,1,1;opad=0,0;dil=1,1;groups=1;"
             f"bias={int(bias)};res=0;act=none;fmt=gemm")
    shape = (1, 3, 18, 14)
    bare = call_direct(native.CONV2D_TRANSPOSE, attrs, [x, w] + ([b] if bias else []), shape)
    got = call_direct(native.CONV2D_TRANSPOSE, attrs.replace("act=none", f"act={act}"),
                      [x, w] + ([b] if bias else []), shape)
    np.testing.assert_allclose(got, reference(bare, act), rtol=2e-6, atol=1e-6)
