"""Activations as exporters write them (transform/activations.py): Before/Expected modules
compared structurally, and numerics against TVM's build of the unfolded module."""

import math

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.transform.activations import (ACTIVATION_RULES, hardsigmoid_composite,
                                             hardswish_composite)
from tvm_ollie.transform.inference_fold import fold_inference
from tvm_ollie.verify.tolerance import tolerance

SHAPE = (2, 3, 4, 5)
op = relax.op


def _c(value):
    return relax.const(np.float32(value))


def _module(*bodies, shape=SHAPE):
    """main(x) = body(bb, x) (a tuple of them for several), each op of a chain bound on its
    own (as exporters do)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if len(bodies) == 1:
                gv = bb.emit_output(bodies[0](bb, x))
            else:
                gv = bb.emit_output(relax.Tuple([bb.emit(body(bb, x)) for body in bodies]))
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x))


def _x(seed=0):
    return (np.random.default_rng(seed).standard_normal(SHAPE) * 4).astype("float32")


def _gelu_erf(bb, x):
    erf = bb.emit(op.erf(bb.emit(op.divide(x, _c(1.4142135)))))
    return op.multiply(bb.emit(op.multiply(x, bb.emit(op.add(erf, _c(1.0))))), _c(0.5))


def _gelu_erf_half_first(bb, x):
    erf = bb.emit(op.erf(bb.emit(op.multiply(x, _c(0.70710677)))))
    return op.multiply(bb.emit(op.multiply(_c(0.5), x)), bb.emit(op.add(_c(1.0), erf)))


def _gelu_tanh_form(bb, x):
    cube = bb.emit(op.power(x, _c(3.0)))
    inner = bb.emit(op.add(x, bb.emit(op.multiply(_c(0.044715), cube))))
    t = bb.emit(op.tanh(bb.emit(op.multiply(inner, _c(math.sqrt(2 / math.pi))))))
    return op.multiply(bb.emit(op.multiply(x, _c(0.5))), bb.emit(op.add(t, _c(1.0))))


def _gelu_tanh_xxx(bb, x):
    cube = bb.emit(op.multiply(bb.emit(op.multiply(x, x)), x))
    inner = bb.emit(op.add(bb.emit(op.multiply(cube, _c(0.044715))), x))
    t = bb.emit(op.tanh(bb.emit(op.multiply(_c(0.7978846), inner))))
    return op.multiply(x, bb.emit(op.multiply(bb.emit(op.add(t, _c(1.0))), _c(0.5))))


def _gelu_tanh_fast(bb, x):
    """onnxruntime's FastGelu as TVM's ONNX frontend writes it."""
    k = math.sqrt(2 / math.pi)
    term1 = bb.emit(op.multiply(_c(0.5), x))
    term2 = bb.emit(op.multiply(_c(k), x))
    cube = bb.emit(op.multiply(bb.emit(op.multiply(x, x)), x))
    term3 = bb.emit(op.multiply(_c(0.044715 * k), cube))
    t = bb.emit(op.tanh(bb.emit(op.add(term2, term3))))
    return op.multiply(term1, bb.emit(op.add(_c(1.0), t)))


def _relu6_min_max(bb, x):
    return op.minimum(bb.emit(op.maximum(x, _c(0.0))), _c(6.0))


def _relu6_max_min(bb, x):
    return op.maximum(_c(0.0), bb.emit(op.minimum(x, _c(6.0))))


def _hardswish_div(bb, x):
    r6 = bb.emit(op.clip(bb.emit(op.add(x, _c(3.0))), 0, 6))
    return op.divide(bb.emit(op.multiply(x, r6)), _c(6.0))


def _hardswish_mul(bb, x):
    r6 = bb.emit(op.clip(bb.emit(op.add(_c(3.0), x)), 0, 6))
    return op.multiply(_c(1 / 6), bb.emit(op.multiply(r6, x)))


def _hardswish_inner(bb, x):
    r6 = bb.emit(op.clip(bb.emit(op.add(x, _c(3.0))), 0, 6))
    return op.multiply(x, bb.emit(op.divide(r6, _c(6.0))))


def _relu6_clip_clip(bb, x):
    """TVM's PyTorch frontend: clip(clip(x, 0, inf), -inf, 6)."""
    return op.clip(bb.emit(op.clip(x, 0, float("inf"))), float("-inf"), 6)


def _hardswish_torch_frontend(bb, x):
    r6 = bb.emit(_relu6_clip_clip(bb, bb.emit(op.add(x, _c(3.0)))))
    return op.divide(bb.emit(op.multiply(x, r6)), _c(6.0))


def _hardsigmoid_torch(bb, x):
    return op.divide(bb.emit(op.clip(bb.emit(op.add(x, _c(3.0))), 0, 6)), _c(6.0))


def _hardsigmoid_onnx_swapped(bb, x):
    return op.clip(bb.emit(op.add(_c(0.5), bb.emit(op.multiply(_c(0.2), x)))), 0, 1)


def _leaky_where(bb, x):
    cond = bb.emit(op.greater(x, _c(0.0)))
    return op.where(cond, x, bb.emit(op.multiply(x, _c(0.1))))


def _leaky_max(bb, x):
    return op.maximum(bb.emit(op.multiply(_c(0.01), x)), x)


CASES = {
    "gelu-erf-div": (_gelu_erf, lambda x: op.nn.gelu(x), "gelu"),
    "gelu-erf-half-first": (_gelu_erf_half_first, lambda x: op.nn.gelu(x), "gelu"),
    "gelu-tanh-power": (_gelu_tanh_form, lambda x: op.nn.gelu_tanh(x), "gelu_tanh"),
    "gelu-tanh-xxx": (_gelu_tanh_xxx, lambda x: op.nn.gelu_tanh(x), "gelu_tanh"),
    "gelu-tanh-fast": (_gelu_tanh_fast, lambda x: op.nn.gelu_tanh(x), "gelu_tanh"),
    "relu6-min-max": (_relu6_min_max, lambda x: op.clip(x, 0.0, 6.0), "clip"),
    "relu6-max-min": (_relu6_max_min, lambda x: op.clip(x, 0.0, 6.0), "clip"),
    "relu6-clip-clip": (_relu6_clip_clip, lambda x: op.clip(x, 0.0, 6.0), "clip_of_clip"),
    "hardswish-torch-frontend": (_hardswish_torch_frontend,
                                 lambda x: hardswish_composite(x, 1 / 6, 0.5), None),
    "hardswish-div": (_hardswish_div, lambda x: hardswish_composite(x, 1 / 6, 0.5),
                      "hardswish"),
    "hardswish-mul": (_hardswish_mul, lambda x: hardswish_composite(x, 1 / 6, 0.5),
                      "hardswish"),
    "hardswish-inner": (_hardswish_inner, lambda x: hardswish_composite(x, 1 / 6, 0.5),
                        "hardsigmoid"),
    "hardsigmoid-torch": (_hardsigmoid_torch, lambda x: hardsigmoid_composite(x, 1 / 6, 0.5),
                          "hardsigmoid"),
    "hardsigmoid-onnx": (_hardsigmoid_onnx_swapped,
                         lambda x: hardsigmoid_composite(x, np.float32(0.2), np.float32(0.5)),
                         "hardsigmoid"),
    "leaky-where": (_leaky_where, lambda x: op.nn.leakyrelu(x, np.float32(0.1)), "leaky_relu"),
    "leaky-max": (_leaky_max, lambda x: op.nn.leakyrelu(x, np.float32(0.01)), "leaky_relu"),
}


def test_rules_have_names_and_equations():
    assert [r.name for r in ACTIVATION_RULES] == ["clip", "clip_of_clip", "gelu", "gelu_tanh",
                                                  "hardswish", "hardsigmoid", "leaky_relu"]
    for rule in ACTIVATION_RULES:
        assert "=" in rule.rewrite.__doc__ and rule.rewrite.__doc__.startswith(f"``{rule.name}``")


@pytest.mark.parametrize("case", list(CASES))
def test_rewritten_to_one_activation(case):
    before_body, expected_body, rule = CASES[case]
    before = _module(before_body)
    got, counts = fold_inference(before)
    assert counts == ({rule: 1} if rule else {"clip_of_clip": 1, "hardswish": 1})
    tvm.ir.assert_structural_equal(got, _module(lambda bb, x: expected_body(x)))
    # a fixed point: folding again changes nothing
    assert fold_inference(got)[1] == {}


def test_rewritten_numerics_match_tvm_build_of_the_chains():
    """Every case at once (one build each side): the folded module computes the chains."""
    before = _module(*(body for body, _, _ in CASES.values()))
    got, counts = fold_inference(before)
    # (TVM's rewriter shares identical rewritten chains, so some cases count once for two)
    assert set(counts) == {rule for _, _, rule in CASES.values() if rule}
    x = _x()
    tol = tolerance("float32")
    for want, have in zip(_run(before, x), _run(got, x)):
        want, have = want.numpy(), have.numpy()
        np.testing.assert_allclose(have, want, rtol=tol, atol=tol * np.abs(want).max())


def test_float16_constants_match_with_float16_rounding():
    """1/sqrt(2) rounded to float16 (0.70703125) still reads as GELU in a float16 model."""
    def body(bb, x):
        half = relax.const(np.float16(0.5))
        erf = bb.emit(op.erf(bb.emit(op.multiply(x, relax.const(np.float16(0.7071068))))))
        one_erf = bb.emit(op.add(erf, relax.const(np.float16(1.0))))
        return op.multiply(bb.emit(op.multiply(x, half)), one_erf)

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(body(bb, x))
        bb.emit_func_output(gv)
    assert fold_inference(bb.get())[1] == {"gelu": 1}


def _wrong_constant(bb, x):
    erf = bb.emit(op.erf(bb.emit(op.divide(x, _c(1.5)))))
    return op.multiply(bb.emit(op.multiply(x, bb.emit(op.add(erf, _c(1.0))))), _c(0.5))


def _read_twice(bb, x):
    r6 = bb.emit(op.clip(bb.emit(op.add(x, _c(3.0))), 0, 6))
    hs = bb.emit(op.divide(bb.emit(op.multiply(x, r6)), _c(6.0)))
    return op.add(hs, r6)


def _steep_leaky(bb, x):
    return op.maximum(x, bb.emit(op.multiply(x, _c(1.5))))


def _clip_bounds_swapped(bb, x):
    return op.minimum(bb.emit(op.maximum(x, _c(6.0))), _c(0.0))


def _widening_constant(bb, x):
    return op.minimum(bb.emit(op.maximum(x, relax.const(np.zeros((1, 1, 1, 1, 1), "float32")))),
                      _c(6.0))


@pytest.mark.parametrize("body", [_wrong_constant, _read_twice, _steep_leaky,
                                  _clip_bounds_swapped, _widening_constant],
                         ids=["wrong-constant", "intermediate-read-twice", "slope-over-one",
                              "lo-above-hi", "constant-widens-the-shape"])
def test_guards_keep_the_module(body):
    before = _module(body)
    got, counts = fold_inference(before)
    assert counts == {}
    tvm.ir.assert_structural_equal(got, before)
