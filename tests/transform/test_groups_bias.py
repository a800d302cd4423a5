"""Groups of projections ``x @ W_i + b_i``: the bias adds join the group (one concatenated bias,
one add on the merged product, then the slices); on constant weights the concatenations fold
at build time and the Decider's estimate leaves them out."""

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.ir.interp import evaluate
from tvm_ollie.transform import optimize_module
from tvm_ollie.transform.decide import Decider, constant_inputs, unit_module
from tvm_ollie.transform.groups import find_shared_input_groups
from tvm_ollie.tune.analytic import folded_stages, program_seconds
from tvm_ollie.tune.metaschedule import default_pipeline

from small_models import LLVM_CALIB

M, K = 6, 16


def _projections(widths=(16, 8, 24), bias_first=True, constants=True, skip_bias=(),
                 extra_reader=False):
    """``x`` (``M x K``) through linears as ``from_exported_program`` imports them:
    ``permute_dims(W)``, ``matmul``, ``add(b, y)`` (``bias_first``); weights constants or
    parameters; ``skip_bias``: projections without a bias; ``extra_reader``: the first product
    is also read before its bias add."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((M, K), "float32"))
    params, consts = [x], []
    for k, n in enumerate(widths):
        w = rng.standard_normal((n, K)).astype("float32")
        b = rng.standard_normal((n,)).astype("float32")
        consts.append((w, b))
        if not constants:
            params += [relax.Var(f"w{k}", relax.TensorType(w.shape, "float32")),
                       relax.Var(f"b{k}", relax.TensorType(b.shape, "float32"))]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            outs = []
            for k, (w, b) in enumerate(consts):
                wv = relax.const(w) if constants else params[1 + 2 * k]
                bv = relax.const(b) if constants else params[2 + 2 * k]
                y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(wv))))
                if extra_reader and k == 0:
                    outs.append(bb.emit(relax.op.nn.relu(y)))
                if k not in skip_bias:
                    y = bb.emit(relax.op.add(bv, y) if bias_first else relax.op.add(y, bv))
                outs.append(y)
            out = bb.emit_output(relax.op.concat(outs, axis=-1))
        bb.emit_func_output(out)
    return bb.get(), [a for w, b in consts for a in (w, b)]


def _merged(sig, alts):
    """Chooser: the merged program of a group on TVM kernels."""
    return next((a for a in alts if a.program is not None and a.program.multi and
                 a.impl == "tvm"), None)


def _run(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


@pytest.mark.parametrize("bias_first", [True, False])
def test_bias_adds_join_the_group_and_the_merge_is_exact(bias_first):
    mod, _ = _projections(bias_first=bias_first)
    (g,) = find_shared_input_groups(mod)
    assert g.size == 3 and len(g.epilogues) == 3
    assert [str(v.name) for v in g.outputs] == [str(b.var.name) for b in g.epilogues]
    (prog,) = g.programs()
    assert [s.kind for s in prog.operators] == ["matmul"]
    assert [s.label for s in prog.stages].count("bias-add") == 1
    assert "merge-shared-input-bias" in prog.explain()
    rng = np.random.default_rng(1)
    feed = {n: rng.standard_normal([int(d) for d in v.ty.shape]) for n, v in g.inputs()}
    for expr, out in zip(g.lifts(), prog.evaluate(feed)):
        np.testing.assert_allclose(out.reshape(expr.shape), evaluate(expr, feed), rtol=1e-10)


@pytest.mark.parametrize("case", ["one-without-bias", "product-read-twice"])
def test_bias_adds_stay_out_when_not_every_product_has_one_alone(case):
    kw = {"skip_bias": (1,)} if case == "one-without-bias" else {"extra_reader": True}
    mod, _ = _projections(**kw)
    groups = find_shared_input_groups(mod)
    assert groups and all(not g.epilogues for g in groups)
    assert all(len(g.programs()) == 1 for g in groups)  # the plain merge still applies


@pytest.mark.parametrize("constants", [True, False])
def test_merged_projections_with_bias_match_tvm(constants):
    mod, arrays = _projections(constants=constants)
    new, rep = optimize_module(mod, "llvm", calibration=LLVM_CALIB, library=False,
                               chooser=_merged, search_time_s=1.0)
    (group,) = [r for r in rep.regions if " share " in r.contents]
    assert group.rewritten, group.reason
    script = new["main"].script()
    assert script.count("R.matmul(") == 1 and script.count("R.add(") == 1
    x = np.random.default_rng(2).standard_normal((M, K)).astype("float32")
    args = [x] if constants else [x] + arrays
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-4, atol=1e-4)


def test_constant_weight_and_bias_concatenations_fold_at_build():
    (g,) = find_shared_input_groups(_projections()[0])
    (prog,) = g.programs()
    consts = constant_inputs(g)
    assert consts == {n for n, v in g.inputs() if n != "x"}
    folded = folded_stages(prog, consts)
    concats = {s.name for s in prog.stages if s.label == "concat"}
    # one weight concatenation (the pairwise ones of the merges fused), one bias concatenation
    assert folded == concats and len(concats) == 2
    unit = unit_module(g, prog)
    names = {f"ollie_merge_eop_{k}" for k, s in enumerate(prog.stages) if s.name in folded}
    assert names <= {gv.name_hint for gv, _ in unit.functions_items()}
    built = default_pipeline(tvm.target.Target("llvm"))(unit)
    assert not names & {gv.name_hint for gv, _ in built.functions_items()}
    # the estimate is the program as it runs: without the folded concatenations
    assert program_seconds(prog, LLVM_CALIB, constants=consts) < \
        program_seconds(prog, LLVM_CALIB)


def test_weights_as_parameters_are_not_folded_and_decide_apart():
    (gp,) = find_shared_input_groups(_projections(constants=False)[0])
    (gc,) = find_shared_input_groups(_projections()[0])
    assert constant_inputs(gp) == frozenset()
    assert folded_stages(gp.programs()[0], constant_inputs(gp)) == frozenset()
    # the same shapes, another decision: constness is part of the signature
    assert gp.signature() != gc.signature()
    dec = Decider("llvm", calibration=LLVM_CALIB, library=False)
    est = {}
    for name, g in (("params", gp), ("constants", gc)):
        alts, n_cand, _ = dec.alternatives(g, 1.0)
        assert n_cand == 1
        est[name] = next(a.estimate for a in alts if a.program is not None)
    assert est["constants"] < est["params"]


@pytest.mark.skipif(not native.load(), reason="native library not built")
def test_native_merged_gemm_takes_the_bias_as_its_epilogue():
    (g,) = find_shared_input_groups(_projections()[0])
    (prog,) = g.programs()
    script = unit_module(g, prog, impl="native")["main"].script()
    assert "R.call_dps_packed" in script and "R.add(" not in script
    apart = unit_module(g, None, impl="native")["main"].script()
    assert apart.count("R.call_dps_packed") == 3 and "R.add(" not in apart
