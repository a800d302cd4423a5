"""Library candidates: a heavy call's native kernel, with and without its post-op epilogue,
offered to the binary program beside TVM's kernels (pipeline.library_offers), costed like the
others (analytic estimate, or built and timed by ProfiledCost), emitted as the library call."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_ollie import native
from tvm_ollie.compat import relax, tvm
from tvm_ollie.orchestrate import (AnalyticCost, OrchestrateConfig, ProfiledCost,
                                   orchestrate_module, orchestrate_pipeline)
from tvm_ollie.orchestrate.candidates import make_candidate
from tvm_ollie.orchestrate.cost import CostModel
from tvm_ollie.orchestrate.fission import fission
from tvm_ollie.orchestrate.graph import build_graph
from tvm_ollie.orchestrate.joint import JointCost, find_groups
from tvm_ollie.orchestrate.profiled import cost_class
from tvm_ollie.pipeline.library_offers import library_offer, offer_library

from orch_helpers import CALIB, flatten, random_args, run

pytestmark = pytest.mark.skipif(not native.load(), reason="native library not loaded")

MATMUL = "tvm_ollie.cpu.matmul"
CONV = "tvm_ollie.cpu.conv2d"
CONV_BIAS = np.linspace(-1.0, 1.0, 8, dtype="float32").reshape(1, 8, 1, 1)


def _tensor(name, shape):
    return relax.Var(name, relax.TensorType(shape, "float32"))


def matmul_bias_relu(m=8, k=16, n=12):
    """``relu(matmul(x, w) + b)``, the tiny graph of the structural tests."""
    bb = relax.BlockBuilder()
    x, w, b = _tensor("x", (m, k)), _tensor("w", (k, n)), _tensor("b", (n,))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w), name_hint="y")
            z = bb.emit(relax.op.add(y, b), name_hint="z")
            r = bb.emit_output(relax.op.nn.relu(z), name_hint="r")
        bb.emit_func_output(r)
    return bb.get()


def conv_bias_act(act=relax.op.nn.relu):
    """``act(conv2d(x, w) + bias)`` (NCHW, a constant bias of shape ``1 x C x 1 x 1``)."""
    bb = relax.BlockBuilder()
    x, w = _tensor("x", (1, 8, 10, 10)), _tensor("w", (8, 8, 3, 3))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=(1, 1)), name_hint="y")
            z = bb.emit(relax.op.add(y, relax.const(CONV_BIAS)), name_hint="z")
            r = bb.emit_output(act(z), name_hint="r")
        bb.emit_func_output(r)
    return bb.get()


def batch_matmul_gelu():
    """``gelu(x @ w) + x`` on a batch (a batched library matmul; gelu is split by fission)."""
    bb = relax.BlockBuilder()
    x, w = _tensor("x", (2, 6, 8)), _tensor("w", (2, 8, 8))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w), name_hint="y")
            g = bb.emit(relax.op.nn.gelu(y), name_hint="g")
            r = bb.emit_output(relax.op.add(g, x), name_hint="r")
        bb.emit_func_output(r)
    return bb.get()


class TvmLinearCost(CostModel):
    """``linear_s`` per TVM-built linear primitive, 1 us per other primitive, 2 us per kernel;
    library calls are costed by their estimate (JointCost)."""

    name = "fake"

    def __init__(self, linear_s: float):
        self.linear_s = linear_s

    def kernel_seconds(self, graph, cand):
        return 2e-6 + sum(self.linear_s if graph.nodes[i].kind == "linear" else 1e-6
                          for i in cand.nodes)


class LibraryTimer:
    """Times a kernel module without building it: a library call alone (no PrimFunc) costs
    ``library_s`` (raises with ``fail``), a TVM kernel ``tvm_s``."""

    def __init__(self, library_s=1e-6, tvm_s=1e-3, fail=False):
        self.library_s, self.tvm_s, self.fail = library_s, tvm_s, fail
        self.library_calls = 0

    def __call__(self, fused, _target, _rpc):
        prims = [f for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        if prims:
            return self.tvm_s
        self.library_calls += 1
        if self.fail:
            raise RuntimeError("library kernel crashed")
        return self.library_s


def _library_calls(mod):
    return [str(b.value.args[0].global_symbol) for blk in mod["main"].body.blocks
            for b in blk.bindings if isinstance(b.value, relax.Call)
            and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == "relax.call_dps_packed"]


def _reference(mod, args):
    return run(tvm.compile(mod, "llvm"), args)


def _profiled(tmp_path, timer):
    config = OrchestrateConfig(profile_floor_s=0.0, work_dir=str(tmp_path))
    return ProfiledCost("llvm", config, AnalyticCost("llvm", CALIB), timer=timer,
                        overhead_s=0.0)


def test_offer_emits_the_library_call_and_its_folded_epilogue():
    mod = matmul_bias_relu()
    offered, table = offer_library(mod, calibration=CALIB)
    bb = relax.BlockBuilder()
    x, w, b = _tensor("x", (8, 16)), _tensor("w", (16, 12)), _tensor("b", (12,))
    out_ty = relax.TensorType((8, 12), "float32")
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, w), name_hint="y")
            bb.emit_output(relax.call_dps_packed(
                MATMUL, [tvm.ir.StringImm("ta=0;tb=0"), x, w], out_ty), name_hint="y__alt1")
            z = bb.emit(relax.op.add(y, b), name_hint="z")
            r = bb.emit_output(relax.op.nn.relu(z), name_hint="r")
            bb.emit_output(relax.call_dps_packed(
                MATMUL, [tvm.ir.StringImm("ta=0;tb=0;bias=1;act=relu"), x, w, b], out_ty),
                name_hint="y__alt2")
        bb.emit_func_output(r)
    tvm.ir.assert_structural_equal(offered["main"], bb.get()["main"])
    labels = [a.label for a in table.alts["y"]]
    assert labels == ["original", "library", "library + bias+relu"]
    assert all(a.profiled and a.native and a.estimate_s > 0 for a in table.alts["y"][1:])


def test_no_offer_without_a_library_form():
    """A matmul with a float16 operand has no native kernel: nothing is offered."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 4), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit_output(relax.op.matmul(x, x), name_hint="r")
        bb.emit_func_output(r)
    mod = bb.get()
    offered, table = offer_library(mod, calibration=CALIB)
    assert not table
    tvm.ir.assert_structural_equal(offered, mod)


def test_chosen_library_epilogue_is_emitted_as_one_call():
    """Before/Expected of the emission: TVM's linear kernels cost 1 s, so the selection takes
    the library call with bias and relu folded; main is that one call."""
    fused, report = orchestrate_module(matmul_bias_relu(), "llvm", cost=TvmLinearCost(1.0),
                                       offer=library_offer(calibration=CALIB))
    bb = relax.BlockBuilder()
    x, w, b = _tensor("x", (8, 16)), _tensor("w", (16, 12)), _tensor("b", (12,))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            r = bb.emit_output(relax.call_dps_packed(
                MATMUL, [tvm.ir.StringImm("ta=0;tb=0;bias=1;act=relu"), x, w, b],
                relax.TensorType((8, 12), "float32")), name_hint="r")
        bb.emit_func_output(r)
    tvm.ir.assert_structural_equal(fused["main"], bb.get()["main"])
    assert report.library == (1, 1)
    assert not [g for g, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


def test_cheap_tvm_kernels_keep_the_tvm_plan():
    """The converse: TVM's kernels cost microseconds, the library's estimate of a 256-cube
    matmul far more, so no library call is emitted."""
    fused, report = orchestrate_module(matmul_bias_relu(256, 256, 256), "llvm",
                                       cost=TvmLinearCost(0.0),
                                       offer=library_offer(calibration=CALIB))
    assert _library_calls(fused) == []
    assert report.library == (1, 0)


@pytest.mark.parametrize("make, split", [(matmul_bias_relu, False), (conv_bias_act, False),
                                         (batch_matmul_gelu, True)])
def test_library_build_matches_tvm(make, split):
    """Numerics of the built module, with the library kernels chosen, vs TVM's build of the
    original."""
    mod = make()
    reports: list = []
    ex = tvm.compile(mod, "llvm", relax_pipeline=orchestrate_pipeline(
        "llvm", cost=TvmLinearCost(1.0), reports=reports,
        fission=(lambda m: fission(m)[0]) if split else None,
        offer=library_offer(calibration=CALIB)))
    offered, chosen = reports[-1].library
    assert offered == chosen == 1
    args = random_args(mod)
    for got, want in zip(run(ex, args), _reference(mod, args)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_gelu_folds_after_fission():
    """The offer runs before fission, so a gelu (split into several primitives by fission)
    is still folded as the library's post-op, and its primitives are absorbed."""
    fused, _ = orchestrate_module(batch_matmul_gelu(), "llvm", cost=TvmLinearCost(1.0),
                                  fission=lambda m: fission(m)[0],
                                  offer=library_offer(calibration=CALIB))
    calls = [b.value for blk in fused["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
             and b.value.op.name == "relax.call_dps_packed"]
    assert len(calls) == 1 and "act=gelu" in str(calls[0].args[1].fields[0].value)


def test_profiled_cost_times_the_library_candidates(tmp_path):
    """ProfiledCost builds and times a library call like any candidate; measured faster than
    the TVM kernels, it is chosen."""
    timer = LibraryTimer(library_s=1e-6, tvm_s=1e-3)
    cost = _profiled(tmp_path, timer)
    fused, report = orchestrate_module(conv_bias_act(), "llvm", cost=cost,
                                       offer=library_offer(calibration=CALIB))
    assert timer.library_calls == 2  # the plain call and the folded one
    assert report.profile.library == 2
    assert report.library == (1, 1)
    assert _library_calls(fused) == [CONV]


def test_library_cost_class_and_estimate_reach_profiled_cost(tmp_path):
    """JointCost hands a profiled model the library estimate as the analytic cost."""
    offered, table = offer_library(matmul_bias_relu(), calibration=CALIB)
    mod = relax.transform.LegalizeOps()(offered)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    groups = find_groups(graph, table)
    cost = JointCost(_profiled(tmp_path, LibraryTimer()), groups, graph)
    last = groups[0].lasts[1]
    assert last in cost.estimates and not cost.fixed
    cand = make_candidate(graph, 1 << last)
    assert cost_class(graph, cand) == "library"
    assert cost.kernel_seconds(graph, cand) == pytest.approx(1e-6 + cost.inner.launch_s)
    analytic = JointCost(TvmLinearCost(0.0), groups, graph)
    assert analytic.kernel_seconds(graph, cand) == table.alts["y"][1].estimate_s


def test_library_that_fails_while_profiled_is_banned_and_the_build_completes(tmp_path):
    timer = LibraryTimer(fail=True)
    mod = conv_bias_act()
    reports: list = []
    ex = tvm.compile(mod, "llvm", relax_pipeline=orchestrate_pipeline(
        "llvm", cost=_profiled(tmp_path, timer), reports=reports,
        offer=library_offer(calibration=CALIB)))
    report = reports[-1]
    assert report.library == (1, 0)
    assert report.profile.failed == 2
    assert any("failed to build or run while profiled; banned" in f
               for p in report.partitions for f in p.fallbacks)
    args = random_args(mod)
    for got, want in zip(run(ex, args), _reference(mod, args)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_library_that_fails_its_check_is_banned_and_the_program_solved_again():
    """The selection's per-kernel check also builds library kernels: one that fails is cut
    and the program solved again (the existing fallback loop), here twice (the folded call,
    then the plain one), ending on TVM's kernels."""
    seen = []

    def check(kmod):
        calls = _library_calls(kmod)
        seen.append(calls)
        if calls:
            raise RuntimeError("no library here")

    fused, report = orchestrate_module(matmul_bias_relu(), "llvm", cost=TvmLinearCost(1.0),
                                       offer=library_offer(calibration=CALIB), check=check)
    assert _library_calls(fused) == []
    part = report.partitions[0]
    assert part.rounds >= 2
    assert sum("failed" in f and "banned" in f for f in part.fallbacks) >= 2
    assert [MATMUL] in seen
    args = random_args(matmul_bias_relu())
    ex = tvm.compile(fused, "llvm")
    want = _reference(matmul_bias_relu(), args)
    for got, ref in zip(flatten(relax.VirtualMachine(ex, tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in args])), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_library_candidates_are_built_and_timed_for_real(tmp_path):
    """The default timer builds the one-call module of each library candidate (its attribute
    string stays in the call, its tensor constants become parameters) and times it."""
    config = OrchestrateConfig(profile_floor_s=0.0, work_dir=str(tmp_path))
    cost = ProfiledCost("llvm", config, AnalyticCost("llvm", CALIB))
    _, report = orchestrate_module(conv_bias_act(), "llvm", cost=cost,
                                   offer=library_offer(calibration=CALIB))
    assert report.profile.library == 2 and report.profile.failed == 0, report.to_text()


def test_plain_library_call_with_a_tvm_epilogue_kernel():
    """When the folded call fails its check, the program mixes: the plain library call, then
    one TVM kernel of bias + relu reading its result (bound to the original value)."""

    def check(kmod):
        text = [str(b.value.args[1].fields[0].value) for blk in kmod["main"].body.blocks
                for b in blk.bindings if isinstance(b.value, relax.Call)
                and isinstance(b.value.op, tvm.ir.Op)
                and b.value.op.name == "relax.call_dps_packed"]
        if any("act=" in t for t in text):
            raise RuntimeError("no post-ops here")

    mod = matmul_bias_relu()
    fused, report = orchestrate_module(mod, "llvm", cost=TvmLinearCost(1.0),
                                       offer=library_offer(calibration=CALIB), check=check)
    assert _library_calls(fused) == [MATMUL]
    assert report.library == (1, 1)
    prims = [g.name_hint for g, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(prims) == 1 and "add" in prims[0] and "relu" in prims[0]
    args = random_args(mod)
    got = run(tvm.compile(fused, "llvm"), args)
    for g, want in zip(got, _reference(mod, args)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-4)


def _two_matmul_chains():
    """``relu(x @ w1 + b) + relu(x @ w2)``: two library calls with epilogues in one block."""
    bb = relax.BlockBuilder()
    x, w1, w2, b = (_tensor("x", (8, 16)), _tensor("w1", (16, 12)), _tensor("w2", (16, 12)),
                    _tensor("b", (12,)))
    with bb.function("main", [x, w1, w2, b]):
        with bb.dataflow():
            y1 = bb.emit(relax.op.matmul(x, w1), name_hint="y1")
            r1 = bb.emit(relax.op.nn.relu(relax.op.add(y1, b)), name_hint="r1")
            y2 = bb.emit(relax.op.matmul(x, w2), name_hint="y2")
            r2 = bb.emit(relax.op.nn.relu(y2), name_hint="r2")
            out = bb.emit_output(relax.op.add(r1, r2), name_hint="out")
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


def test_the_folded_offer_indexes_each_block_once(monkeypatch):
    """Every library call of a block folds against one index of the block (building it walks
    the whole block: once per call made the offer quadratic in the block's length)."""
    import tvm_ollie.pipeline.joint as joint_mod  # pylint: disable=import-outside-toplevel

    made = []
    real = joint_mod.block_index
    monkeypatch.setattr(joint_mod, "block_index", lambda b: made.append(len(b)) or real(b))
    _, table = offer_library(_two_matmul_chains(), "llvm", CALIB)
    folded = {n: [a.label for a in alts if a.base is not None] for n, alts in table.alts.items()}
    assert folded == {"y1": ["library + bias+relu"], "y2": ["library + relu"]}
    assert len(made) == 1
