"""The one isolated-module builder (:func:`~tvm_ollie.transform.units.build_isolated_module`):
a unit's own computation as a Before/Expected structural check, and a program in its place
(with the program's own input names) checked numerically against TVM running the original."""

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie.derive.targets import match_scope
from tvm_ollie.derive.program import instantiate
from tvm_ollie.ir.parser import parse
from tvm_ollie.transform.units import build_isolated_module

F32 = "float32"
#: ``x @ w`` written with the program's own names ``A`` and ``B``.
MATMUL = "L<i:0:4, j:0:5> Σ<k:0:3> { A[i, k] * B[k, j] } where A: float32[4, 3]; B: float32[3, 5]"


# pylint: disable=invalid-name
@I.ir_module
class Expected:
    @R.function
    def main(x: R.Tensor((4, 3), "float32"),
             w: R.Tensor((3, 5), "float32")) -> R.Tensor((4, 5), "float32"):
        with R.dataflow():
            y = R.nn.relu(R.matmul(x, w))
            R.output(y)
        return y


def _relu_matmul(bb, values):
    h = bb.emit(R.matmul(values["x"], values["w"]))
    return R.nn.relu(h)


def _run(mod, args):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_original_is_the_units_own_computation_on_parameters():
    """Variable inputs become parameters in input order; ``original`` fills the block."""
    x = relax.Var("x", relax.TensorType((4, 3), F32))
    w = relax.Var("w", relax.TensorType((3, 5), F32))
    got = build_isolated_module([("x", x), ("w", w)], _relu_matmul, (4, 5))
    tvm.ir.assert_structural_equal(got, Expected)


def test_constant_inputs_stay_constants():
    """A constant input is not a parameter: ``main`` takes ``x`` alone and reads the constant."""
    rng = np.random.default_rng(0)
    wv = rng.standard_normal((3, 5)).astype(F32)
    x = relax.Var("x", relax.TensorType((4, 3), F32))
    mod = build_isolated_module([("x", x), ("w", relax.const(wv))], _relu_matmul, (4, 5))
    assert [str(p.name) for p in mod["main"].params] == ["x"]
    xv = rng.standard_normal((4, 3)).astype(F32)
    np.testing.assert_allclose(_run(mod, [xv]), np.maximum(xv @ wv, 0), rtol=1e-5, atol=1e-5)


def test_program_in_place_of_the_unit_matches_tvm():
    """A program over its own names (``A``, ``B``) computes, on the unit's inputs (``x``, a
    constant ``w``), what the unit's original computes when TVM runs it."""
    expr = parse(MATMUL)
    program = instantiate(expr, expr, match_scope(expr, ("matmul",))[0])
    rng = np.random.default_rng(1)
    wv = rng.standard_normal((3, 5)).astype(F32)
    x = relax.Var("x", relax.TensorType((4, 3), F32))
    inputs = [("x", x), ("w", relax.const(wv))]

    def original(_bb, values):
        return R.matmul(values["x"], values["w"])

    derived = build_isolated_module(inputs, original, (4, 5), program, names=["A", "B"],
                                    impl="tir", prefix="ollie_unit")
    assert any("ollie_unit" in gv.name_hint for gv in derived.get_global_vars())
    xv = rng.standard_normal((4, 3)).astype(F32)
    want = _run(build_isolated_module(inputs, original, (4, 5)), [xv])
    np.testing.assert_allclose(_run(derived, [xv]), want, rtol=1e-5, atol=1e-5)
