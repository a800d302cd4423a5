"""transform/resize_kernel: resizes, the concatenation they feed and the transform after it as
one native call.

Before/Expected modules compared structurally for each rule (alone, concatenation with a copied
operand, the exit transform, the views of channels-last tokens, NHWC resizes); numerics against
TVM's build of the original; the cases the rule refuses; the rule inside ``optimize_module``
with ``norm_kernels`` on and off."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.codegen.builder import single_function_module as _module
from tvm_ollie.transform.optimize import optimize_module
from tvm_ollie.transform.resize_kernel import (RESIZE_ALONE, RESIZE_CONCAT, RESIZE_EXIT,
                                               RESIZE_VIEW, resize_kernels)

from small_models import random_inputs as _inputs

F32 = "float32"


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(lib.RESIZE2D):
        pytest.skip("native library without resize2d")


def _ty(shape, dtype=F32):
    return relax.TensorType(shape, dtype)


def _kernel(attrs, operands, shape):
    return relax.call_dps_packed(lib.RESIZE2D, [tvm.ir.StringImm(attrs)] + list(operands),
                                 _ty(shape))


def _resize(x, size, layout="NCHW", **kw):
    return relax.op.image.resize2d(x, size, layout=layout, **kw)


def _run(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _check(before, expected, counts_want):
    after, counts = resize_kernels(before)
    assert counts == counts_want
    tvm.ir.assert_structural_equal(after, expected)
    args = _inputs(before)
    np.testing.assert_allclose(_run(after, *args), _run(before, *args), rtol=1e-5, atol=1e-6)


def test_alone():
    x = relax.Var("x", _ty((1, 3, 5, 6)))
    before = _module([x], lambda bb, x: _resize(bb.emit(relax.op.nn.relu(x)), (10, 9)))
    expected = _module([x], lambda bb, x: _kernel(
        "method=linear;coord=half_pixel", [bb.emit(relax.op.nn.relu(x))], (1, 3, 10, 9)))
    _check(before, expected, {RESIZE_ALONE[0]: 1})


@pytest.mark.parametrize("method,coord,rounding,attrs", [
    ("nearest_neighbor", "asymmetric", "", "method=nearest;coord=asymmetric;round=floor"),
    ("nearest_neighbor", "align_corners", "", "method=nearest;coord=align_corners;round=round"),
    ("nearest_neighbor", "half_pixel", "round_prefer_ceil",
     "method=nearest;coord=half_pixel;round=round_prefer_ceil"),
    ("linear", "align_corners", "round", "method=linear;coord=align_corners"),
    ("linear", "pytorch_half_pixel", "", "method=linear;coord=pytorch_half_pixel"),
])
def test_modes(method, coord, rounding, attrs):
    x = relax.Var("x", _ty((2, 4, 3, 7)))
    kw = {"method": method, "coordinate_transformation_mode": coord, "rounding_method": rounding}
    before = _module([x], lambda bb, x: _resize(x, (8, 5), **kw))
    expected = _module([x], lambda bb, x: _kernel(attrs, [x], (2, 4, 8, 5)))
    _check(before, expected, {RESIZE_ALONE[0]: 1})


def test_concat_with_a_copied_operand():
    a, b, c = (relax.Var(n, _ty(s)) for n, s in
               (("a", (1, 4, 4, 4)), ("b", (1, 3, 8, 8)), ("c", (1, 5, 2, 2))))

    def before_body(bb, a, b, c):
        ra = bb.emit(_resize(a, (8, 8)))
        rc = bb.emit(_resize(c, (8, 8)))
        return relax.op.concat([ra, b, rc], axis=1)

    before = _module([a, b, c], before_body)
    expected = _module([a, b, c], lambda bb, a, b, c: _kernel(
        "method=linear;coord=half_pixel;copy=0,1,0", [a, b, c], (1, 12, 8, 8)))
    _check(before, expected, {RESIZE_CONCAT[0]: 1})


def _decode_head(bb, *tokens, size=(8, 8)):
    """Segformer's decode head as the PyTorch importer writes it: tokens ``[1, H*W, C]`` viewed
    as NCHW (``permute_dims`` + ``reshape``), resized, concatenated, then the transform into a
    channels-last chain."""
    maps = []
    for t in tokens:
        n, hw, ch = (int(s) for s in t.ty.shape)
        side = int(round(hw ** 0.5))
        p = bb.emit(relax.op.permute_dims(t, [0, 2, 1]))
        x = bb.emit(relax.op.reshape(p, (n, ch, side, side)))
        maps.append(bb.emit(_resize(x, size)))
    cat = bb.emit(relax.op.concat(maps, axis=1))
    return relax.op.layout_transform(cat, lambda n, c, h, w: (n, h, w, c))


def test_decode_head_exit_and_views():
    t1, t2 = relax.Var("t1", _ty((1, 16, 6))), relax.Var("t2", _ty((1, 64, 5)))
    before = _module([t1, t2], _decode_head)

    def expected_body(bb, t1, t2):
        v1 = bb.emit(relax.op.reshape(t1, (1, 4, 4, 6)))
        v2 = bb.emit(relax.op.reshape(t2, (1, 8, 8, 5)))
        return _kernel("method=linear;coord=half_pixel;src=nhwc,nhwc;dst=nhwc", [v1, v2],
                       (1, 8, 8, 11))

    expected = _module([t1, t2], expected_body)
    _check(before, expected, {RESIZE_CONCAT[0]: 1, RESIZE_EXIT[0]: 1, RESIZE_VIEW[0]: 2})


def test_views_kept_when_read_elsewhere():
    """A view with another reader stays; the kernel still reads its source."""
    t = relax.Var("t", _ty((1, 16, 6)))

    def before_body(bb, t):
        p = bb.emit(relax.op.permute_dims(t, [0, 2, 1]))
        x = bb.emit(relax.op.reshape(p, (1, 6, 4, 4)))
        r = bb.emit(_resize(x, (8, 8)))
        y = bb.emit(relax.op.layout_transform(r, lambda n, c, h, w: (n, h, w, c)))
        return relax.Tuple([y, relax.op.nn.relu(x)])

    after, counts = resize_kernels(_module([t], before_body))
    assert counts == {RESIZE_ALONE[0]: 1, RESIZE_EXIT[0]: 1, RESIZE_VIEW[0]: 1}
    text = after.script()
    assert "R.permute_dims" in text and "src=nhwc;dst=nhwc" in text
    args = _inputs(after)
    for got, want in zip(_run_tuple(after, *args), _run_tuple(_module([t], before_body), *args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _run_tuple(mod, *args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return [y.numpy() for y in vm["main"](*[tvm.runtime.tensor(a) for a in args])]


def test_nhwc_resizes_in_a_channels_last_concat():
    """What the layout step writes inside a channels-last chain: NHWC resizes, ``axis=3``."""
    a, b = relax.Var("a", _ty((1, 3, 3, 4))), relax.Var("b", _ty((1, 6, 6, 2)))

    def before_body(bb, a, b):
        ra = bb.emit(_resize(a, (6, 6), layout="NHWC", method="nearest_neighbor",
                             coordinate_transformation_mode="asymmetric",
                             rounding_method="floor"))
        return relax.op.concat([b, ra], axis=3)

    before = _module([a, b], before_body)
    expected = _module([a, b], lambda bb, a, b: _kernel(
        "method=nearest;coord=asymmetric;round=floor;src=nhwc,nhwc;copy=1,0;dst=nhwc", [b, a],
        (1, 6, 6, 6)))
    _check(before, expected, {RESIZE_CONCAT[0]: 1})


def test_a_resize_read_twice_is_a_call_of_its_own():
    a, b = relax.Var("a", _ty((1, 2, 4, 4))), relax.Var("b", _ty((1, 2, 4, 4)))

    def before_body(bb, a, b):
        ra = bb.emit(_resize(a, (8, 8)))
        rb = bb.emit(_resize(b, (8, 8)))
        cat = bb.emit(relax.op.concat([ra, rb], axis=1))
        return relax.Tuple([cat, relax.op.nn.relu(ra)])

    before = _module([a, b], before_body)

    def expected_body(bb, a, b):
        ra = bb.emit(_kernel("method=linear;coord=half_pixel", [a], (1, 2, 8, 8)))
        cat = bb.emit(_kernel("method=linear;coord=half_pixel;copy=1,0", [ra, b], (1, 4, 8, 8)))
        return relax.Tuple([cat, relax.op.nn.relu(ra)])

    after, counts = resize_kernels(before)
    assert counts == {RESIZE_CONCAT[0]: 1, RESIZE_ALONE[0]: 1}
    tvm.ir.assert_structural_equal(after, _module([a, b], expected_body))
    args = _inputs(before)
    for got, want in zip(_run_tuple(after, *args), _run_tuple(before, *args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_resizes_of_another_mode_are_calls_of_their_own():
    a, b = relax.Var("a", _ty((1, 2, 4, 4))), relax.Var("b", _ty((1, 3, 2, 2)))

    def before_body(bb, a, b):
        ra = bb.emit(_resize(a, (8, 8)))
        rb = bb.emit(_resize(b, (8, 8), method="nearest_neighbor"))
        return relax.op.concat([ra, rb], axis=1)

    after, counts = resize_kernels(_module([a, b], before_body))
    assert counts == {RESIZE_CONCAT[0]: 1, RESIZE_ALONE[0]: 1}
    assert "copy=0,1" in after.script()
    args = _inputs(after)
    np.testing.assert_allclose(_run(after, *args), _run(_module([a, b], before_body), *args),
                               rtol=1e-5, atol=1e-6)


def _refused_modules():
    x = relax.Var("x", _ty((1, 2, 4, 4)))
    h = relax.Var("x", _ty((1, 2, 4, 4), "float16"))
    n = tvm.tirx.Var("n", "int64")
    d = relax.Var("x", _ty((n, 2, 4, 4)))
    return {
        "cubic": _module([x], lambda bb, x: _resize(x, (8, 8), method="cubic")),
        "tf_crop_and_resize": _module([x], lambda bb, x: _resize(
            x, (8, 8), coordinate_transformation_mode="tf_crop_and_resize")),
        "align_corners-to-1": _module([x], lambda bb, x: _resize(
            x, (1, 8), coordinate_transformation_mode="align_corners")),
        "float16": _module([h], lambda bb, x: _resize(x, (8, 8))),
        "dynamic": _module([d], lambda bb, x: _resize(x, (8, 8))),
    }


@pytest.mark.parametrize("name", list(_refused_modules()))
def test_refused(name):
    mod = _refused_modules()[name]
    after, counts = resize_kernels(mod)
    assert counts == {} and after is mod


@pytest.mark.parametrize("on", [True, False])
def test_optimize_module_option(on):
    t1, t2 = relax.Var("t1", _ty((1, 16, 6))), relax.Var("t2", _ty((1, 64, 5)))
    mod = _module([t1, t2], _decode_head)
    new, report = optimize_module(mod, target="llvm", derive=False, model_guard=False,
                                  norm_kernels=on)
    assert (lib.RESIZE2D in new.script()) == on
    assert report.inference_folds.get(RESIZE_CONCAT[0], 0) == (1 if on else 0)
    args = _inputs(mod)
    np.testing.assert_allclose(_run(new, *args), _run(mod, *args), rtol=1e-5, atol=1e-6)


def test_a_blocked_transform_is_not_an_exit():
    """A transform into ``nChw4c`` (5-D) after the resize stays TVM's; the resize is a call."""
    x = relax.Var("x", _ty((1, 8, 3, 3)))

    def body(bb, x):
        r = bb.emit(_resize(x, (6, 6)))
        return relax.op.layout_transform(r, lambda n, c, h, w: (n, c // 4, h, w, c % 4))

    before = _module([x], body)
    after, counts = resize_kernels(before)
    assert counts == {RESIZE_ALONE[0]: 1}
    assert "R.layout_transform" in after.script()
    args = _inputs(before)
    np.testing.assert_allclose(_run(after, *args), _run(before, *args), rtol=1e-5, atol=1e-6)
