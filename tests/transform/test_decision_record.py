"""The one decision record: calls, regions and shared-input groups are decided into the same
:class:`~tvm_ollie.transform.decision.Decision`, which the report holds as it is."""

import numpy as np
import pytest
from tvm import relax

from tvm_ollie.transform import Decision, OpDecision, optimize
from tvm_ollie.transform.alternatives import Alternative
from tvm_ollie.transform.choosing import Choice, decided
from tvm_ollie.transform.report import OptimizeReport, RegionDecision

from small_models import LLVM_CALIB

N, C = 8, 16


def _projections_then_matmul():
    """Three linears reading ``x`` (a group, each projection a region of several calls), their
    concatenation, then one more matmul (a call decided alone)."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((N, C), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for _ in range(3):
                w = relax.const(rng.standard_normal((C, C)).astype("float32"))
                y = bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w))))
                b = relax.const(rng.standard_normal((C,)).astype("float32"))
                outs.append(bb.emit(relax.op.add(y, b)))
            cat = bb.emit(relax.op.concat(outs, axis=-1))
            w2 = relax.const(rng.standard_normal((3 * C, C)).astype("float32"))
            out = bb.emit_output(relax.op.matmul(cat, w2))
        bb.emit_func_output(out)
    return bb.get()


def _keep_all(_sig, _alts):
    """Chooser: every unit keeps its original (so every unit gets decided)."""
    return Alternative(None, "tvm", 0.0)


def test_calls_regions_and_groups_are_one_record_held_as_is(monkeypatch):
    pairs = []
    loop = optimize._decide_units  # pylint: disable=protected-access

    def spy(units, choose, verbose, prepare=None):
        pairs.extend(loop(units, choose, verbose, prepare))
        return pairs

    monkeypatch.setattr(optimize, "_decide_units", spy)
    _, report = optimize.optimize_module(_projections_then_matmul(), "llvm", chooser=_keep_all,
                                         calibration=LLVM_CALIB, library=False, max_depth=1,
                                         search_time_s=1.0)
    records = [d for _, d in pairs]
    assert {d.kind for d in records} == {"call", "region", "group"}
    assert all(type(d) is Decision for d in records)  # pylint: disable=unidiomatic-typecheck
    # the report holds the decided objects themselves, calls apart from regions and groups
    assert [id(d) for d in report.decisions] == [id(d) for d in records if d.kind == "call"]
    assert [id(d) for d in report.regions] == [id(d) for d in records if d.kind != "call"]
    assert report.regions[0].kind == "group"  # groups are decided first
    for d in records:
        assert d.signature and d.chosen == "original" and d.reason == "forced: original"
        assert bool(d.op_name) == (d.kind == "call")
        assert bool(d.contents and d.expression) == (d.kind != "call")
    # each unit has its own copy of its signature's decision (a caller may revert one)
    calls = [d for d in records if d.kind == "call"]
    same = [d for d in calls if d.signature == calls[0].signature]
    assert len({id(d) for d in same}) == len(same)
    assert "region main." in report.to_text()


def test_record_fields_and_former_names():
    cut = decided(None, ["x", "w"], "native wins", 2.0, 1.0, True, 3, "why", impl="native")
    assert (cut.chosen, cut.rewritten, cut.label, cut.speedup) == \
        ("original [native]", True, "original [native]", 2.0)
    assert Choice is decided and OpDecision is Decision
    call = cut.for_unit(kind="call", function="main", var_name="y", op_name="relax.matmul",
                        signature="relax.matmul 2x2")
    assert (call.function, call.chosen, call.names) == ("main", "original [native]", ["x", "w"])
    assert cut.function == ""  # the signature's decision is not changed
    kept = cut.kept("apart; ")
    assert (kept.rewritten, kept.reason, kept.after_s, kept.program, kept.impl) == \
        (False, "apart; native wins", 1.0, None, "tvm")
    reg = RegionDecision("main", "lv6", "lv=nn.pad, lv1=take", "L<i:0:2> { x[i] }",
                         chosen="g2bmm(...)", before_s=2e-3, after_s=1e-3, measured=True)
    assert isinstance(reg, Decision) and reg.kind == "region"
    assert reg.to_text() == ("region main.lv6 [lv=nn.pad, lv1=take]\n"
                             "    lifted: L<i:0:2> { x[i] }\n"
                             "    -> g2bmm(...)  (2.00ms -> 1.00ms, measured)")
    report = OptimizeReport(decisions=[call, Decision("main", "z", "relax.matmul", "s")],
                            regions=[reg])
    assert report.rewritten == [call]
    with pytest.raises(ValueError, match="Decision.kind"):
        Decision(kind="block")
