"""Rule ``space_to_depth_conv``: Before/Expected modules and numerics against TVM's build of the
original (the ``r * r`` phase slices, their concatenation and the convolution)."""

import itertools

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.config import OllieConfig
from tvm_ollie.transform.inference_fold import fold_inference
from tvm_ollie.transform.optimize import optimize_module
from tvm_ollie.transform.space_to_depth import SPACE_TO_DEPTH_RULES, phase_weight

_END = 9223372036854775807


def _phases(r, order):
    """``order``: a permutation of the ``r * r`` phase indices ``a * r + b``."""
    return [(q // r, q % r) for q in order]


def _focus(shape, r, offsets, weight, padding, weight_param=False, extra=False):
    """main(x) = conv(concat_q x[:, :, a_q::r, b_q::r], W) (+ the concatenation again)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [x]
    w = relax.const(weight)
    if weight_param:
        w = relax.Var("w", relax.TensorType(weight.shape, "float32"))
        params.append(w)
    with bb.function("main", params):
        with bb.dataflow():
            parts = [bb.emit(relax.op.strided_slice(x, [2, 3], [a, b], [_END, _END], [r, r]))
                     for a, b in offsets]
            cat = bb.emit(relax.op.concat(parts, axis=1))
            out = bb.emit(relax.op.nn.conv2d(cat, w, padding=padding))
            if extra:
                out = bb.emit(relax.op.add(out, relax.op.sum(cat)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _strided(shape, weight, r, padding):
    """The expected form: one convolution of ``x`` with stride ``r``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(relax.op.nn.conv2d(x, relax.const(weight), strides=(r, r),
                                                   padding=[r * p for p in padding],
                                                   data_layout="NCHW", kernel_layout="OIHW"))
        bb.emit_func_output(gv)
    return relax.transform.Normalize()(bb.get())


def _run(mod, *args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _rng_case(n, c, h, w, r, k, out_c=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w)).astype("float32")
    weight = rng.standard_normal((out_c, r * r * c, k, k)).astype("float32")
    return x, weight


def test_focus_stem_before_expected():
    """YOLOX's order (``::2, ::2``, ``1::2, ::2``, ``::2, 1::2``, ``1::2, 1::2``), k 3, p 1:
    one conv with kernel 6, stride 2, padding 2, the weight rearranged by phase."""
    r, offsets = 2, [(0, 0), (1, 0), (0, 1), (1, 1)]
    x, weight = _rng_case(1, 3, 8, 8, r, 3)
    before = _focus(x.shape, r, offsets, weight, [1, 1, 1, 1])
    after, counts = fold_inference(before, SPACE_TO_DEPTH_RULES)
    assert counts == {"space_to_depth_conv": 1}
    big = phase_weight(weight, r, offsets)
    assert big.shape == (4, 3, 6, 6)
    tvm.ir.assert_structural_equal(after, _strided(x.shape, big, r, [1, 1, 1, 1]))
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-4, atol=1e-4)


def test_phase_weight_taps():
    """Tap ``(r u + a, r v + b)`` of the big kernel is phase ``(a, b)``'s tap ``(u, v)``."""
    r, offsets = 3, _phases(3, [4, 0, 8, 1, 7, 2, 6, 3, 5])
    _, weight = _rng_case(1, 2, 6, 6, r, 2, out_c=3)
    big = phase_weight(weight, r, offsets)
    for q, (a, b) in enumerate(offsets):
        for u, v in itertools.product(range(2), range(2)):
            np.testing.assert_array_equal(big[:, :, r * u + a, r * v + b],
                                          weight[:, 2 * q:2 * q + 2, u, v])


@pytest.mark.parametrize("n, r, k, padding, order", [
    (1, 2, 3, [1, 1, 1, 1], [0, 1, 2, 3]),
    (2, 2, 1, [0, 0, 0, 0], [3, 1, 2, 0]),
    (1, 2, 3, [0, 1, 2, 0], [1, 3, 0, 2]),
    (3, 3, 2, [1, 1, 1, 1], [8, 0, 4, 2, 6, 1, 7, 3, 5]),
    (1, 4, 3, [1, 1, 1, 1], list(range(16))[::-1]),
])
def test_numerics_against_tvm(n, r, k, padding, order):
    """Any r, kernel, padding (asymmetric too), phase order and batch: equal to TVM's build
    of the original module."""
    offsets = _phases(r, order)
    x, weight = _rng_case(n, 2, 4 * r, 3 * r, r, k, seed=r * 10 + k)
    before = _focus(x.shape, r, offsets, weight, padding)
    after, counts = fold_inference(before, SPACE_TO_DEPTH_RULES)
    assert counts == {"space_to_depth_conv": 1}
    assert "strided_slice" not in after.script() and "concat" not in after.script()
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-4, atol=1e-4)


def test_weight_given_at_run_time():
    """A weight that is a parameter is rearranged by Relax ops."""
    r, offsets = 2, _phases(2, [2, 0, 3, 1])
    x, weight = _rng_case(2, 3, 6, 6, r, 3)
    before = _focus(x.shape, r, offsets, weight, [1, 1, 1, 1], weight_param=True)
    after, counts = fold_inference(before, SPACE_TO_DEPTH_RULES)
    assert counts == {"space_to_depth_conv": 1}
    np.testing.assert_allclose(_run(after, x, weight), _run(before, x, weight),
                               rtol=1e-4, atol=1e-4)


def test_concat_kept_for_another_reader():
    """A concatenation that another operator reads stays for it; the conv reads ``x``."""
    r, offsets = 2, _phases(2, [0, 1, 2, 3])
    x, weight = _rng_case(1, 2, 4, 4, r, 3)
    before = _focus(x.shape, r, offsets, weight, [1, 1, 1, 1], extra=True)
    after, counts = fold_inference(before, SPACE_TO_DEPTH_RULES)
    assert counts == {"space_to_depth_conv": 1}
    assert "concat" in after.script()
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-4, atol=1e-3)


def _sliced(shape, slices, weight, padding=(1, 1, 1, 1), strides=(1, 1), groups=1):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = [bb.emit(relax.op.strided_slice(x, *s)) for s in slices]
            cat = bb.emit(relax.op.concat(parts, axis=1))
            gv = bb.emit_output(relax.op.nn.conv2d(cat, relax.const(weight), strides=strides,
                                                   padding=padding, groups=groups))
        bb.emit_func_output(gv)
    return bb.get()


def _slice(a, b, r=2, end=_END):
    return ([2, 3], [a, b], [end, end], [r, r])


@pytest.mark.parametrize("case", ["phase missing", "phase twice", "partial slice",
                                  "conv stride 2", "grouped conv", "one axis"])
def test_does_not_apply(case):
    """Not every phase once, slices that stop short, a conv the equation does not cover, or
    phases of one axis only: the module is left as it was."""
    shape, weight = (1, 2, 8, 8), np.ones((4, 8, 3, 3), "float32")
    slices = [_slice(0, 0), _slice(1, 0), _slice(0, 1), _slice(1, 1)]
    options = {}
    if case == "phase missing":
        slices, weight = slices[:3], weight[:, :6]
    elif case == "phase twice":
        slices[3] = _slice(0, 0)
    elif case == "partial slice":
        slices = [_slice(a, b, end=6) for a, b in [(0, 0), (1, 0), (0, 1), (1, 1)]]
    elif case == "conv stride 2":
        options = {"strides": (2, 2)}
    elif case == "grouped conv":
        options, weight = {"groups": 2}, weight[:, :4]
    elif case == "one axis":
        slices = [([2], [a], [_END], [2]) for a in (0, 1)]
        weight = weight[:, :4]
    before = _sliced(shape, slices, weight, **options)
    after, counts = fold_inference(before, SPACE_TO_DEPTH_RULES)
    assert counts == {}
    tvm.ir.assert_structural_equal(after, before)


def _focus_bn_silu(shape, weight):
    """YOLOX's Focus: phases, concat, conv, batch norm, ``x * sigmoid(x)``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    out_c = weight.shape[0]
    rng = np.random.default_rng(1)
    gamma, beta, mean = (relax.const(rng.standard_normal(out_c).astype("float32"))
                         for _ in range(3))
    var = relax.const(rng.uniform(0.5, 2.0, out_c).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = [bb.emit(relax.op.strided_slice(x, [2, 3], [a, b], [_END, _END], [2, 2]))
                     for a, b in [(0, 0), (1, 0), (0, 1), (1, 1)]]
            cat = bb.emit(relax.op.concat(parts, axis=1))
            y = bb.emit(relax.op.nn.conv2d(cat, relax.const(weight), padding=1))
            bn = bb.emit(relax.op.nn.batch_norm(y, gamma, beta, mean, var, axis=1,
                                                training=False))
            z = bb.emit(relax.TupleGetItem(bn, 0))
            gv = bb.emit_output(relax.op.multiply(z, relax.op.sigmoid(z)))
        bb.emit_func_output(gv)
    return bb.get()


def test_in_the_pass_after_the_batch_norm_fold():
    """In :func:`optimize_module` (library kernels where the native library is loaded): the
    batch norm folds first, then the stem becomes one strided convolution; the result equals
    TVM's build of the original."""
    x, weight = _rng_case(2, 3, 12, 10, 2, 3, out_c=8)
    before = _focus_bn_silu(x.shape, weight)
    after, report = optimize_module(before, target="llvm",
                                    config=OllieConfig(derive=False, trials=0))
    assert report.inference_folds.get("bn_into_conv") == 1
    assert report.inference_folds.get("space_to_depth_conv") == 1
    np.testing.assert_allclose(_run(after, x), _run(before, x), rtol=1e-4, atol=1e-4)
