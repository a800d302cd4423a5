"""Tuner.apply: a tuning record that does not replay on its kernel leaves that kernel untuned
instead of failing the build."""

from __future__ import annotations

import tvm
from tvm import relax, te

from tvm_ollie.tune import Tuner


def _prim(scale: float) -> "tvm.tirx.PrimFunc":
    a = te.placeholder((4,), "float32", name="a")
    b = te.compute((4,), lambda i: a[i] * scale, name="b")
    return te.create_prim_func([a, b])


_Two = tvm.IRModule({"good": _prim(1.0), "bad": _prim(2.0)})


def _fake_apply(enable_warning=False):  # noqa: ARG001
    """Applies a 'record' (an attribute) to every PrimFunc, and fails on any module that holds
    the PrimFunc named ``bad``, as MetaSchedule does when one trace does not replay."""

    def run(mod):
        names = [gv.name_hint for gv, _ in mod.functions_items()]
        if "bad" in names:
            raise RuntimeError("ScheduleError: reverse-compute-at")
        out = tvm.IRModule(dict(mod.functions_items()))
        for gv, func in mod.functions_items():
            out[gv] = func.with_attr("applied", 1)
        return out

    return run


def test_a_record_that_fails_leaves_only_its_kernel_untuned(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(relax.transform, "MetaScheduleApplyDatabase", _fake_apply)
    out = Tuner("llvm", str(tmp_path)).apply(_Two)
    funcs = {gv.name_hint: f for gv, f in out.functions_items()}
    assert funcs["good"].attrs["applied"] == 1
    assert "applied" not in (funcs["bad"].attrs or {})
    assert funcs["bad"].same_as(_Two["bad"])
    assert "kernel by kernel" in caplog.text and "bad" in caplog.text
