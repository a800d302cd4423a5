"""The joint build's plans carry the sequential build's layout step (chains of library
convolutions kept in oneDNN's format): its ``derivation`` plan is the module the ``ollie``
build makes, so the never-worse guard compares the plans users would otherwise get.

Before the fix the joint build decided its calls after the regions pass and never ran the
layout step: on YOLOX (one chain of 101 convolutions) every plan the guard could keep ran 1.4x
slower than the ``ollie`` build, and the guard, timing only those plans, kept one of them.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi

from tvm_ollie import native
from tvm_ollie.compat import relax, tvm
from tvm_ollie.config import OllieConfig
from tvm_ollie.pipeline import joint_plans
from tvm_ollie.pipeline.joint import library_plan
from tvm_ollie.pipeline.joint_plans import joint_build
from tvm_ollie.transform.alternatives import Alternative
from tvm_ollie.transform.optimize import optimize_module

from orch_helpers import CALIB

X_SHAPE = (1, 8, 8, 8)


@pytest.fixture(autouse=True)
def _native():
    if not native.available() or not native.provides(native.CONV2D_PREFERRED_FORMAT):
        pytest.skip("native library without conv2d_preferred_format")


def _chain(tail: bool = False, prefix: str = "lv") -> "tvm.IRModule":
    """conv + bias + relu, twice (a chain of two convolutions once both run on the library);
    ``tail``: then ``exp``, an operator outside any chain (it reads the chain's exit)."""
    rng = np.random.default_rng(4)
    shapes = [(16, 8, 3, 3), (1, 16, 1, 1), (16, 16, 3, 3), (1, 16, 1, 1)]
    w1, b1, w2, b2 = [relax.const((rng.standard_normal(s) * 0.3).astype("float32"))
                      for s in shapes]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X_SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=(1, 1)), name_hint=f"{prefix}_c1")
            y = bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(y, b1))))
            z = bb.emit(relax.op.nn.conv2d(y, w2, padding=(1, 1)), name_hint=f"{prefix}_c2")
            z = relax.op.nn.relu(bb.emit(relax.op.add(z, b2)))
            z = bb.emit_output(relax.op.exp(bb.emit(z)) if tail else z)
        bb.emit_func_output(z)
    return bb.get()


def _native_everywhere(_sig, alternatives):
    """Every conv on its library kernel (the decision the layout step needs to find a chain)."""
    return next((a for a in alternatives if a.program is None and a.impl == "native"), None)


_OPTS = dict(target="llvm", calibration=CALIB, check_untuned=False, search_time_s=0.5,
             max_depth=1, derive=False, region_calls=1, trials=0, derivation_cache=False)


def _timer(fastest: str):
    """A plan timer under which ``fastest`` wins (the others twice as slow)."""
    def timer(runs):
        for run in runs.values():
            run()
        return {name: 1e-3 if name == fastest else 2e-3 for name in runs}

    return timer


def _run(ex, x):
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


@pytest.fixture(name="tvm_chain", scope="module")
def _tvm_chain():
    """TVM's build of :func:`_chain` (no tail), the reference several tests compare with: built
    once for the module (``_chain`` is seeded, every call builds the same module)."""
    return tvm.compile(_chain(), "llvm")


def _compiled_modules(monkeypatch) -> list:
    """Record every module the joint build hands to ``compile_module`` (the ``derivation``
    and ``original`` plans)."""
    seen = []
    real = joint_plans.compile_module

    def recording(module, *args, **kwargs):
        seen.append(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(joint_plans, "compile_module", recording)
    return seen


def test_the_derivation_plan_is_the_ollie_build(monkeypatch, tvm_chain):
    """The ``derivation`` plan's module is structurally the sequential build's
    (``optimize_module``, what the ``ollie`` system compiles), layout step included; the guard
    keeping it reports the same chains and computes what TVM's build of the original does; the
    ``library`` plan, which would repeat it, is skipped (one joint build for both checks)."""
    mod = _chain()
    want, ollie = optimize_module(mod, chooser=_native_everywhere, **_OPTS)
    assert ollie.layouts is not None and ollie.layouts.chains == [(2, ollie.layouts.chains[0][1])]
    seen = _compiled_modules(monkeypatch)
    ex, report, _ = joint_build(mod, guard=True, plan_timer=_timer("derivation"),
                                chooser=_native_everywhere, **_OPTS)
    assert report.plans.winner == "derivation"
    derivation = [m for m in seen if not tvm_ffi.structural_equal(m, mod)]
    assert len(derivation) == 1
    tvm.ir.assert_structural_equal(derivation[0], want)
    assert report.layouts.chains == ollie.layouts.chains
    assert "dst_fmt" in derivation[0].script()
    # every call decided on the library already: the library plan would repeat this one
    library = next(p for p in report.plans.plans if p.name == "library")
    assert library.dropped.startswith("skipped: "), library
    x = np.random.default_rng(1).standard_normal(X_SHAPE).astype("float32")
    np.testing.assert_allclose(_run(ex, x), _run(tvm_chain, x),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("fastest", ["sequential", "refined", "joint"])
def test_every_plan_computes_the_original_and_reports_its_layouts(fastest, tvm_chain):
    """The orchestrated plans built from decided calls (``sequential``; ``refined`` when the
    joint selection picked other alternatives) carry the layout step too (the BLP then places
    the chain's exit transform: alone or fused into its TVM consumer); whichever the guard
    keeps computes what TVM's build of the original does, and the report says its layouts
    (none for the joint plan, whose calls are chosen inside the selection)."""
    mod = _chain()
    ex, report, _ = joint_build(mod, guard=True, plan_timer=_timer(fastest),
                                chooser=_native_everywhere, **_OPTS)
    kept = report.plans.winner
    plan = next(p for p in report.plans.plans if p.name == fastest)
    assert kept == fastest or plan.dropped, report.plans.to_text()
    if kept in ("sequential", "refined"):
        assert report.layouts is not None and report.layouts.chains
    elif kept == "joint":
        assert report.layouts is None
    x = np.random.default_rng(2).standard_normal(X_SHAPE).astype("float32")
    np.testing.assert_allclose(_run(ex, x), _run(tvm_chain, x),
                               rtol=1e-4, atol=1e-4)


def test_without_the_layout_step_the_derivation_plan_stays_nchw(monkeypatch):
    """``blocked_layout=False`` holds for the joint build as for the sequential one."""
    mod = _chain()
    opts = dict(_OPTS, blocked_layout=False)
    want, _ = optimize_module(mod, chooser=_native_everywhere, **opts)
    seen = _compiled_modules(monkeypatch)
    _, report, _ = joint_build(mod, guard=True, plan_timer=_timer("derivation"),
                               chooser=_native_everywhere, **opts)
    derivation = [m for m in seen if not tvm_ffi.structural_equal(m, mod)]
    tvm.ir.assert_structural_equal(derivation[0], want)
    assert "dst_fmt" not in derivation[0].script() and report.layouts is None


def _native_first_conv_only(_sig, alternatives):
    """The first conv (8 input channels) on the library, the second on TVM: the per-call
    decisions split the chain."""
    if " 1x8x8x8:" not in _sig:
        return Alternative(None, "tvm", 0.0)  # the original, on TVM
    return _native_everywhere(_sig, alternatives)


def test_the_library_plan_keeps_the_chain_the_decisions_split(monkeypatch, tvm_chain):
    """With the second conv decided on TVM, the ``derivation`` plan has no chain; the
    ``library`` plan puts every call on the library and the layout step keeps the chain; kept,
    it reports the chain and the library decisions, and computes what TVM's build does."""
    mod = _chain()
    seen = _compiled_modules(monkeypatch)
    ex, report, _ = joint_build(mod, guard=True, plan_timer=_timer("library"),
                                chooser=_native_first_conv_only, **_OPTS)
    assert report.plans.winner == "library", report.plans.to_text()
    built = [m.script() for m in seen if not tvm_ffi.structural_equal(m, mod)]
    assert len(built) == 2  # derivation, then library
    assert "dst_fmt" not in built[0] and built[0].count("tvm_ollie.cpu.conv2d") == 1
    assert "dst_fmt" in built[1] and built[1].count("tvm_ollie.cpu.conv2d") == 2
    assert report.layouts.chains and report.layouts.chains[0][0] == 2
    assert all(d.chosen.endswith("[native]") for d in report.decisions), report.decisions
    x = np.random.default_rng(3).standard_normal(X_SHAPE).astype("float32")
    np.testing.assert_allclose(_run(ex, x), _run(tvm_chain, x),
                               rtol=1e-4, atol=1e-4)


def test_the_orchestration_plan_weighs_library_kernels(tvm_chain):
    """The ``orchestration`` plan (the module as given, no derivation) has the library's
    kernels as candidates of the binary program; kept, it computes what TVM's build does."""
    mod = _chain()
    ex, report, orch = joint_build(mod, guard=True, plan_timer=_timer("orchestration"),
                                   chooser=_native_everywhere, **_OPTS)
    assert report.plans.winner == "orchestration"
    assert orch is not None and orch.library is not None, orch
    x = np.random.default_rng(5).standard_normal(X_SHAPE).astype("float32")
    np.testing.assert_allclose(_run(ex, x), _run(tvm_chain, x),
                               rtol=1e-4, atol=1e-4)


def _calls(func) -> list:
    """``(callee, operand names)`` of the bindings of ``func``'s one dataflow block."""
    out = []
    for b in func.body.blocks[0].bindings:
        call = b.value
        callee = call.args[0]
        name = getattr(callee, "name_hint", None) or str(getattr(callee, "global_symbol",
                                                                   callee))
        out.append((call.op.name, name))
    return out


def test_the_program_places_the_chain_exit_in_its_tvm_consumer():
    """Before: the laid-out module (the sequential plan's): entry transform, two library
    convolutions in nhwc, exit transform back to NCHW, ``exp`` on TVM. Expected after the
    orchestration: the exit transform is no kernel of its own; the binary program fuses it,
    a layout primitive with its traffic as cost, into the TVM kernel of its consumer, which
    reads the chain's nhwc tensor; the result computes what TVM's build of the original does.
    """
    from tvm_ollie.orchestrate import orchestrate_module
    from tvm_ollie.orchestrate.cost import AnalyticCost

    mod = _chain(tail=True)
    laid_out, report = optimize_module(mod, chooser=_native_everywhere, **_OPTS)
    assert report.layouts.chains == [(2, "nhwc")] and report.layouts.exits == 1
    before = [op for op, _ in _calls(laid_out["main"])]
    assert before == ["relax.layout_transform", "relax.call_dps_packed",
                      "relax.call_dps_packed", "relax.layout_transform", "relax.exp"]
    fused, orch = orchestrate_module(laid_out, "llvm", cost=AnalyticCost(tvm.target.Target(
        "llvm")))
    after = _calls(fused["main"])
    assert [op for op, _ in after] == ["relax.call_tir", "relax.call_dps_packed",
                                       "relax.call_dps_packed", "relax.call_tir"]
    assert "layout_transform" in after[0][1] and "exp" not in after[0][1]
    assert "layout_transform" in after[3][1] and "exp" in after[3][1]
    last = fused["main"].body.blocks[0].bindings
    assert last[3].value.args[1][0].same_as(last[2].var)  # reads the nhwc tensor
    kernels = [k for p in orch.partitions for k in p.kernels]
    assert any(sorted(k.kinds) == ["elementwise", "layout"] for k in kernels), kernels
    x = np.random.default_rng(6).standard_normal(X_SHAPE).astype("float32")
    built = tvm.compile(laid_out, "llvm", relax_pipeline=joint_plans.ollie_orchestration(
        "llvm", cost=AnalyticCost(tvm.target.Target("llvm"))))
    np.testing.assert_allclose(_run(built, x), _run(tvm.compile(mod, "llvm"), x),
                               rtol=1e-4, atol=1e-4)


def test_calls_renamed_by_the_regions_pass_are_still_decided(monkeypatch):
    """The regions pass re-emits the module, and its bindings get other names (on YOLOX quick
    69 of the 89 heavy calls after it): the joint build decides the calls by the signatures
    of the module as given, so every conv is still decided (here, on the library) and the
    derivation plan is still the ``ollie`` build's module."""
    from tvm_ollie.transform.report import OptimizeReport

    mod = _chain()
    renamed = _chain(prefix="renamed")
    monkeypatch.setattr(joint_plans, "_rewrite_regions",
                        lambda *_args, **_kw: (renamed, OptimizeReport(target="llvm")))
    want, _ = optimize_module(mod, chooser=_native_everywhere, **_OPTS)
    seen = _compiled_modules(monkeypatch)
    _, report, _ = joint_build(mod, guard=True, plan_timer=_timer("derivation"),
                               chooser=_native_everywhere, **_OPTS)
    assert [d.var_name for d in report.decisions] == ["renamed_c1", "renamed_c2"]
    assert all(d.chosen == "original [native]" for d in report.decisions)
    derivation = [m for m in seen if not tvm_ffi.structural_equal(m, mod)]
    tvm.ir.assert_structural_equal(derivation[0], want)


def test_the_library_plan_puts_small_calls_on_the_library_too(tvm_chain):
    """``library_plan`` decides every call, whatever ``min_share`` says: a call skipped as too
    small (here the smaller convolution, a third of the estimate, at min_share 0.5) would stay
    on TVM and split the chain; in the plan both convolutions are native calls in one
    channels-last chain."""
    mod = _chain()
    skipping, _ = optimize_module(mod, config=OllieConfig(**_OPTS, min_share=0.5),
                                  chooser=_native_everywhere)
    assert skipping.script().count("R.nn.conv2d(") == 1  # the smaller conv skipped, on TVM
    plan, report = library_plan(mod, OllieConfig(**_OPTS, min_share=0.5))
    text = plan.script()
    assert "R.nn.conv2d(" not in text and text.count("tvm_ollie.cpu.conv2d") == 2
    assert report.layouts is not None  # (a chain when oneDNN prefers a blocked format here)
    assert all(convs == 2 for convs, _ in report.layouts.chains)
    x = np.random.default_rng(6).standard_normal(X_SHAPE).astype("float32")
    np.testing.assert_allclose(_run(tvm.compile(plan, "llvm"), x),
                               _run(tvm_chain, x), rtol=1e-4, atol=1e-4)
