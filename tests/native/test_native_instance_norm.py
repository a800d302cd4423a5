"""tvm_ollie.cpu.instance_norm against numpy: affine, residual, activations, ranks, errors."""

import numpy as np
import pytest

from tvm_ollie import native
from tvm_ollie.codegen import library as lib

from native_util import call_direct, call_relax, require_native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(lib.INSTANCE_NORM):
        pytest.skip("native library built before instance_norm")


def reference(x, scale=None, bias=None, res=None, act=None, eps=1e-5):
    """Instance norm of each (n, c) plane in float64, then the epilogue."""
    x64 = x.astype(np.float64)
    axes = tuple(range(2, x.ndim))
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + eps)
    view = (1, -1) + (1,) * (x.ndim - 2)
    if scale is not None:
        y = y * scale.reshape(view)
    if bias is not None:
        y = y + bias.reshape(view)
    if res is not None:
        y = y + res
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "sigmoid":
        y = 1 / (1 + np.exp(-y))
    return y.astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 8, 16, 16), (2, 3, 5, 7), (1, 4, 9), (2, 2, 3, 4, 5),
                                   (1, 64, 64, 64)])
@pytest.mark.parametrize("affine", [False, True])
def test_planes_against_numpy(shape, affine):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 3 + 5).astype("float32")
    c = shape[1]
    scale = rng.standard_normal(c).astype("float32") if affine else None
    bias = rng.standard_normal(c).astype("float32") if affine else None
    attrs = "eps=1e-05" + (";scale=1;bias=1" if affine else "")
    args = [x] + ([scale, bias] if affine else [])
    out = call_direct(lib.INSTANCE_NORM, attrs, args, shape)
    np.testing.assert_allclose(out, reference(x, scale, bias), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_residual_and_activation(act):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 10, 10)).astype("float32")
    scale, bias = (rng.standard_normal(6).astype("float32") for _ in range(2))
    res = rng.standard_normal(x.shape).astype("float32")
    out = call_direct(lib.INSTANCE_NORM, f"eps=0.001;scale=1;bias=1;res=1;act={act}",
                      [x, scale, bias, res], x.shape)
    np.testing.assert_allclose(out, reference(x, scale, bias, res, act, eps=1e-3),
                               rtol=1e-5, atol=2e-5)


def test_scale_only_shaped_vectors_and_relax():
    """A per-channel operand of any shape with C elements; the kernel inside a Relax build."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 5, 6, 6)).astype("float32")
    scale = rng.standard_normal((5, 1, 1)).astype("float32")
    out = call_relax(lib.INSTANCE_NORM, "scale=1", [x, scale], x.shape)
    np.testing.assert_allclose(out, reference(x, scale.reshape(5)), rtol=1e-5, atol=2e-5)


def test_constant_plane_is_beta():
    """var = 0: the plane normalizes to 0 (eps keeps it finite), so Out = beta."""
    x = np.full((1, 2, 4, 4), 3.0, "float32")
    bias = np.array([0.5, -1.0], "float32")
    out = call_direct(lib.INSTANCE_NORM, "bias=1", [x, bias], x.shape)
    np.testing.assert_allclose(out, np.broadcast_to(bias.reshape(1, 2, 1, 1), x.shape))


@pytest.mark.parametrize("offset, first", [(300.0, None), (-2.0e3, None), (0.0, 1.0e3)])
def test_one_pass_moments_far_from_the_shift(offset, first):
    """The mean and variance come from one pass of sums shifted by the plane's first value:
    planes whose mean is far from zero (|mean| >> std), and a plane whose first value is an
    outlier far from the rest, normalize as the float64 two-pass reference does. Counts of
    1000 and 37 floats: full 32-lane blocks with and without a tail."""
    rng = np.random.default_rng(3)
    for shape in [(1, 3, 10, 100), (2, 2, 37)]:
        x = (rng.standard_normal(shape) + offset).astype("float32")
        if first is not None:
            x.reshape(-1, x.shape[-1])[:, 0] = first
        out = call_direct(lib.INSTANCE_NORM, "eps=1e-05", [x], shape)
        np.testing.assert_allclose(out, reference(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs, arrays, match", [
    ("eps=-1", [np.ones((1, 2, 3, 3), "float32")], "eps"),
    ("bogus=1", [np.ones((1, 2, 3, 3), "float32")], "bogus"),
    ("scale=1", [np.ones((1, 2, 3, 3), "float32"), np.ones(3, "float32")], "scale"),
    ("", [np.ones((2, 3), "float32")], "rank"),
    ("scale=1", [np.ones((1, 2, 3, 3), "float32")], "arguments"),
])
def test_errors(attrs, arrays, match):
    shape = arrays[0].shape if attrs != "scale=1" or len(arrays) > 1 else (1, 2, 3, 3)
    with pytest.raises((ValueError, TypeError), match=match):
        call_direct(lib.INSTANCE_NORM, attrs, arrays, shape)
