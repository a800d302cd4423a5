"""tvm_ollie.cpu.resize2d against TVM's own ``image.resize2d``: every accepted method, coordinate
mode and rounding, up, down, non-integer and identity sizes, both formats of operands and
output, concatenations with copied operands, one and two threads, through Relax, and its
argument errors."""

import itertools

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib

from native_util import require_native, two_threads_stall_on

COORDS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
          "tf_half_pixel_for_nn")
ROUNDS = ("round", "floor", "ceil", "round_prefer_floor", "round_prefer_ceil")
#: (in H, in W) -> (out H, out W): up 2x, up by a non-integer factor, down, identity, from 1
SIZES = [((4, 5), (8, 10)), ((3, 7), (7, 16)), ((9, 8), (4, 3)), ((5, 6), (5, 6)),
         ((1, 3), (4, 6))]


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(lib.RESIZE2D):
        pytest.skip("native library built before resize2d")


def _inputs(channels=3):
    """One input per size of :data:`SIZES` (NCHW, batch 2)."""
    rng = np.random.default_rng(0)
    return [rng.standard_normal((2, channels) + hw).astype("float32") for hw, _ in SIZES]


def _tvm_resizes(modes, channels=3):
    """TVM's outputs of one resize2d (NCHW) per mode of ``modes`` and size of :data:`SIZES`,
    and the inputs: one function per mode, all in one module built once (most of a build of
    a module this small is the build's fixed cost, paid once instead of once per mode)."""
    bb = relax.BlockBuilder()
    for k, (method, coord, rounding) in enumerate(modes):
        params = [relax.Var(f"x{i}", relax.TensorType((2, channels) + hw, "float32"))
                  for i, (hw, _) in enumerate(SIZES)]
        with bb.function(f"mode{k}", params):
            with bb.dataflow():
                outs = [bb.emit(relax.op.image.resize2d(
                    p, size, layout="NCHW", method=method, coordinate_transformation_mode=coord,
                    rounding_method=rounding)) for p, (_, size) in zip(params, SIZES)]
                out = bb.emit_output(relax.Tuple(outs))
            bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    xs = _inputs(channels)
    args = [tvm.runtime.tensor(x) for x in xs]
    return xs, {mode: [y.numpy() for y in vm[f"mode{k}"](*args)]
                for k, mode in enumerate(modes)}


def _attrs(method, coord, rounding, **extra):
    attrs = {"method": "linear" if method == "linear" else "nearest", "coord": coord}
    if method != "linear" and rounding:
        attrs["round"] = rounding
    attrs.update(extra)
    return ";".join(f"{k}={v}" for k, v in attrs.items())


def call(attrs, xs, out_shape):
    out = np.full(out_shape, np.nan, dtype="float32")
    tvm_ffi.get_global_func(lib.RESIZE2D)(
        attrs, *[tvm_ffi.from_dlpack(np.ascontiguousarray(x)) for x in xs],
        tvm_ffi.from_dlpack(out))
    return out


def _nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def _modes():
    linear = [("linear", c, "") for c in COORDS]
    nearest = [("nearest_neighbor", c, r) for c, r in itertools.product(COORDS, ROUNDS + ("",))]
    return linear + nearest


@pytest.fixture(name="tvm_resizes", scope="module")
def _tvm_resizes_of_every_mode():
    """TVM's outputs of every mode of :func:`_modes` (one build for the module's tests)."""
    return _tvm_resizes(_modes())


@pytest.mark.parametrize("method,coord,rounding", _modes())
def test_every_mode_against_tvm(method, coord, rounding, tvm_resizes):
    xs, outputs = tvm_resizes
    expected = outputs[(method, coord, rounding)]
    for x, want, (_, size) in zip(xs, expected, SIZES):
        if coord == "align_corners" and min(size) == 1:
            continue
        for src, dst in itertools.product(("nchw", "nhwc"), repeat=2):
            got = call(_attrs(method, coord, rounding, src=src, dst=dst),
                       [_nhwc(x) if src == "nhwc" else x],
                       want.shape if dst == "nchw" else _nhwc(want).shape)
            got = got.transpose(0, 3, 1, 2) if dst == "nhwc" else got
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6,
                                       err_msg=f"{x.shape} -> {size}, {src} -> {dst}")


@pytest.mark.parametrize("dst", ["nchw", "nhwc"])
def test_concatenation_with_copies_against_tvm(dst):
    """``concat(resize(a), b, resize(c), axis=1)``: the slices of one output."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 4, 4, 4)).astype("float32")
    b = rng.standard_normal((1, 3, 8, 8)).astype("float32")
    c = rng.standard_normal((1, 5, 2, 2)).astype("float32")
    bb = relax.BlockBuilder()
    params = [relax.Var(n, relax.TensorType(v.shape, "float32")) for n, v in zip("abc", (a, b, c))]
    with bb.function("main", params):
        with bb.dataflow():
            ra = bb.emit(relax.op.image.resize2d(params[0], (8, 8), layout="NCHW"))
            rc = bb.emit(relax.op.image.resize2d(params[2], (8, 8), layout="NCHW"))
            out = bb.emit_output(relax.op.concat([ra, params[1], rc], axis=1))
        bb.emit_func_output(out)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    want = vm["main"](*[tvm.runtime.tensor(v) for v in (a, b, c)]).numpy()
    xs = [a, _nhwc(b), c]
    got = call(f"method=linear;coord=half_pixel;src=nchw,nhwc,nchw;copy=0,1,0;dst={dst}", xs,
               want.shape if dst == "nchw" else _nhwc(want).shape)
    got = got.transpose(0, 3, 1, 2) if dst == "nhwc" else got
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_two_threads_give_the_one_thread_result():
    x = np.random.default_rng(2).standard_normal((1, 48, 32, 32)).astype("float32")
    for attrs, out_shape in (("src=nchw;dst=nhwc", (1, 64, 64, 48)),
                             ("src=nchw;dst=nchw", (1, 48, 64, 64)),
                             ("src=nhwc;dst=nhwc", (1, 64, 64, 32))):
        one = call(attrs, [x], out_shape)
        with two_threads_stall_on():
            two = call(attrs, [x], out_shape)
        np.testing.assert_array_equal(one, two)


def test_nearest_copies_infinities():
    """A nearest resize reads one tap: an infinite value stays infinite, never NaN."""
    x = np.array([[[[np.inf, -np.inf], [1.0, 2.0]]]], dtype="float32")
    got = call("method=nearest;coord=asymmetric", [x], (1, 1, 4, 4))
    assert np.isinf(got).sum() == 8 and not np.isnan(got).any()


def test_through_relax():
    x = np.random.default_rng(3).standard_normal((1, 6, 5, 4)).astype("float32")
    bb = relax.BlockBuilder()
    param = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [param]):
        with bb.dataflow():
            y = bb.emit_output(relax.call_dps_packed(
                lib.RESIZE2D, [tvm.ir.StringImm("method=linear;coord=half_pixel"), param],
                relax.TensorType((1, 6, 10, 8), "float32")))
        bb.emit_func_output(y)
    got = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())["main"](
        tvm.runtime.tensor(x)).numpy()
    _, want = _tvm_single(x, (10, 8))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _tvm_single(x, size):
    bb = relax.BlockBuilder()
    param = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [param]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.image.resize2d(param, size, layout="NCHW"))
        bb.emit_func_output(y)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    return x, vm["main"](tvm.runtime.tensor(x)).numpy()


@pytest.mark.parametrize("attrs,xs,out_shape,error,match", [
    ("method=cubic", [(1, 1, 2, 2)], (1, 1, 4, 4), ValueError, "method"),
    ("round=floor", [(1, 1, 2, 2)], (1, 1, 4, 4), ValueError, "nearest only"),
    ("coord=tf_crop_and_resize", [(1, 1, 2, 2)], (1, 1, 4, 4), ValueError, "coord"),
    ("src=nhwc,nhwc", [(1, 1, 2, 2)], (1, 1, 4, 4), ValueError, "one entry per operand"),
    ("", [(1, 2, 2, 2)], (1, 3, 4, 4), ValueError, "expected 2 channels"),
    ("", [(2, 1, 2, 2)], (1, 1, 4, 4), ValueError, "expected batch 1"),
    ("copy=1", [(1, 1, 2, 2)], (1, 1, 4, 4), ValueError, "copy=1 needs"),
    ("coord=align_corners", [(1, 1, 2, 2)], (1, 1, 1, 4), ValueError, "at least 2x2"),
    ("", [(1, 2, 2)], (1, 1, 4, 4), ValueError, "rank"),
    ("bogus=1", [(1, 1, 2, 2)], (1, 1, 4, 4), ValueError, "bogus"),
])
def test_argument_errors(attrs, xs, out_shape, error, match):
    with pytest.raises(error, match=match):
        call(attrs, [np.ones(s, dtype="float32") for s in xs], out_shape)


def test_argument_count_and_types():
    func = tvm_ffi.get_global_func(lib.RESIZE2D)
    x = tvm_ffi.from_dlpack(np.ones((1, 1, 2, 2), dtype="float32"))
    with pytest.raises(TypeError, match="at least one operand"):
        func("", x)
    with pytest.raises(TypeError, match="X1 must be a tensor"):
        func("", 1, x)
