"""The unrolled steps of a recurrent layer: their input projections (``X[t] @ W^T + b``, one
weight, no state read) are one shared-weight group, merged into one GEMM over the stacked rows
with one bias add ("hoist the input projection", found by the groups, not by the importer)."""

import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie.derive.rules.inter import merge_shared_inputs_bias
from tvm_ollie.ir.interp import evaluate
from tvm_ollie.transform import optimize_module
from tvm_ollie.transform.groups import MAX_ROW_GROUP, find_shared_input_groups
from tvm_ollie.verify.tolerance import tolerance

from small_models import LLVM_CALIB

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))
# pylint: disable=wrong-import-position
from onnx_op_cases import max_error, recurrent_case, run_ort  # noqa: E402

from tvm_ollie.frontend.loader import load_onnx  # noqa: E402


def _imported(op, seq, **attrs):
    model, feeds = recurrent_case(op, seq=seq, **{"batch": 2, "size": 8, "hidden": 4, **attrs})
    return load_onnx(model, None, simplifier="none"), model, feeds


def _steps_group(mod):
    """The group of the steps' input projections (the calls sharing a constant weight)."""
    groups = [g for g in find_shared_input_groups(mod) if g.position == 1]
    assert len(groups) == 1, [g.describe() for g in groups]
    return groups[0]


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_step_projections_are_one_group_with_their_bias(op):
    seq = 6  # above the default bound (4): calls reading rows of one tensor may be more
    mod, _, _ = _imported(op, seq, initial=False)
    g = _steps_group(mod)
    assert g.size == seq and len(g.epilogues) == seq
    (prog,) = g.programs()
    assert prog.multi and len(prog.operators) == 1
    (mm,) = prog.operators
    assert (mm.attrs["M"], mm.attrs["K"]) == (seq * 2, 8)  # every step's rows in one GEMM
    assert "merge-shared-input-bias" in prog.explain()
    assert sum(s.label == "bias-add" for s in prog.stages) == 1
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal([int(d) for d in v.ty.shape]) for n, v in g.inputs()}
    for expr, out in zip(g.lifts(), prog.evaluate(feed)):
        np.testing.assert_allclose(out, evaluate(expr, feed), rtol=1e-10, atol=1e-10)


def test_row_group_bound_and_disabled():
    mod, _, _ = _imported("RNN", MAX_ROW_GROUP + 3, initial=False, hidden=2)
    sizes = sorted(g.size for g in find_shared_input_groups(mod) if g.position == 1)
    assert sizes == [3, MAX_ROW_GROUP]
    assert find_shared_input_groups(mod, max_ops=1) == []


def test_directions_group_by_weight_not_by_step_input():
    """Both directions read each step's input, each with its own weight: the rows of one
    weight group first (two groups of all steps), not the two directions of one step."""
    mod, _, _ = _imported("RNN", 3, initial=False, direction="bidirectional")
    groups = find_shared_input_groups(mod)
    assert sorted((g.position, g.size) for g in groups) == [(1, 3), (1, 3)]
    assert all(len(g.epilogues) == 3 for g in groups)


def _rows_with_biases(same_bias: bool, steps: int = 3):
    """``x[t] @ W + b_t`` for each row ``t`` of ``x``, each result read by a ``tanh``."""
    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((8, 4)).astype("float32"))
    biases = [relax.const(rng.standard_normal(4).astype("float32")) for _ in range(steps)]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((steps, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for t in range(steps):
                row = bb.emit(relax.op.strided_slice(x, [0], [t], [t + 1]))
                y = bb.emit(relax.op.matmul(row, w))
                y = bb.emit(relax.op.add(y, biases[0 if same_bias else t]))
                outs.append(bb.emit(relax.op.tanh(y)))
            out = bb.emit_output(relax.op.concat(outs, axis=0))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("same_bias", [True, False])
def test_stacked_rows_take_their_bias_only_when_it_is_one(same_bias):
    """Stacked rows get one bias add: with a bias per row the calls group without them."""
    (g,) = find_shared_input_groups(_rows_with_biases(same_bias))
    assert g.position == 1 and g.size == 3
    assert len(g.epilogues) == (3 if same_bias else 0)
    assert len(g.programs()) == 1


def _merged(sig, alts):
    """Chooser: the merged program of a group (else the cost model decides)."""
    return next((a for a in alts if a.program is not None and a.program.multi and
                 a.impl == "tvm"), None)


def _run(mod, feeds, names):
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[n]) for n in names])
    return [o.numpy() for o in ([out] if isinstance(out, tvm.runtime.Tensor) else list(out))]


@pytest.mark.parametrize("op,direction", [("LSTM", "forward"), ("GRU", "forward"),
                                          ("RNN", "bidirectional")])
def test_merged_steps_match_onnx_runtime(op, direction):
    mod, model, feeds = _imported(op, 5, direction=direction)
    before = mod["main"].script().count("R.matmul(")
    new, rep = optimize_module(mod, "llvm", calibration=LLVM_CALIB, library=False,
                               region_calls=1, chooser=_merged, search_time_s=1.0)
    groups = [r for r in rep.regions if " share " in r.contents]
    directions = 2 if direction == "bidirectional" else 1
    assert len(groups) == directions and all(g.rewritten for g in groups), \
        [g.reason for g in groups]
    # per direction five input projections became one; the recurrent ones stay (they read
    # the state)
    assert new["main"].script().count("R.matmul(") == before - 4 * directions
    names = [i.name for i in model.graph.input]
    assert max_error(_run(new, feeds, names), run_ort(model, feeds)) < tolerance("float32")
