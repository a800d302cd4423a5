"""The harness end to end on a tiny model, with fake systems covering every outcome.

These run the interleaved mode (every system in this process, where the fake systems live);
the isolated mode, the default, has its own tests in test_bench_isolated.py."""

import functools
import json
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tvm_ollie.bench import __main__ as cli  # noqa: E402
from tvm_ollie.bench.harness import (  # noqa: E402
    default_slow_call_s, guard_agreement, run_bench)
from tvm_ollie.bench.report import markdown  # noqa: E402
from tvm_ollie.bench.systems import (  # noqa: E402
    Prepared,
    SystemUnavailable,
    get_system,
    list_systems,
    register_system,
)


def _eager(spec):
    with torch.no_grad():
        return spec.module(*spec.example_inputs).numpy()


@register_system("test_close")
def _close(spec, ctx):
    """Eager output times (1 + 1e-6): agrees."""
    out = _eager(spec) * (1 + 1e-6)
    return Prepared(lambda: out, compile_s=0.5, tune_s=1.5, info={"note": "fake"})


@register_system("test_wrong")
def _wrong(spec, ctx):
    """Eager output plus 1% of its scale: a mismatch."""
    out = _eager(spec)
    out = out + 0.01 * np.abs(out).max()
    return Prepared(lambda: out)


@register_system("test_missing")
def _missing(spec, ctx):
    """A system whose package is absent."""
    raise SystemUnavailable("fakepkg is not installed")


@register_system("test_broken")
def _broken(spec, ctx):
    """A system that fails to build."""
    raise RuntimeError("boom")


@register_system("test_slow_call")
def _slow_call(spec, ctx):
    """Eager's outputs after 200 ms: a call slower than the tests' ``slow_call_s``."""
    out = _eager(spec)

    def run():
        time.sleep(0.2)
        return out

    return Prepared(run)


@register_system("test_built_only")
def _built_only(spec, ctx):
    """Built but nothing to run it on."""
    return Prepared(None, compile_s=0.1)


def test_registry():
    assert {"tvm", "onnxruntime", "torch", "torch_compile"} <= set(list_systems())
    assert get_system("tvm").tvm_based and not get_system("torch").tvm_based
    with pytest.raises(KeyError):
        get_system("nope")
    with pytest.raises(ValueError):
        register_system("torch")(lambda spec, ctx: None)


def test_every_outcome_is_reported(tmp_path):
    systems = ["torch", "test_close", "test_wrong", "test_missing", "test_broken"]
    systems.append("test_built_only")
    results = run_bench(models=["infogan"], quick=True, systems=systems, reference="torch",
                        out_dir=str(tmp_path), time_budget_s=0.05, min_rounds=4,
                        log=lambda _: None, mode="interleaved")  # fmt: skip
    entry = results["models"]["infogan"]
    status = {name: r["status"] for name, r in entry["systems"].items()}
    assert status == {"torch": "ok", "test_close": "ok", "test_wrong": "mismatch",
                      "test_missing": "skipped", "test_broken": "error",
                      "test_built_only": "built"}  # fmt: skip
    close = entry["systems"]["test_close"]
    assert close["ratio_to_ref"] > 0 and close["median_s"] > 0 and close["tune_s"] == 1.5
    assert entry["systems"]["torch"]["ratio_to_ref"] == 1.0
    assert tuple(entry["systems"]["torch"]["ratio_quartiles"]) == (1.0, 1.0)
    assert close["rounds"] >= 4  # min_rounds, whatever the budget
    assert "median_s" not in entry["systems"]["test_wrong"]
    assert entry["flops"] > 0 and entry["bytes"] > entry["bytes_min"] > 0
    assert 0 < close["roofline_fraction"]
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        assert json.load(f)["models"]["infogan"]["systems"]["test_missing"]["reason"]
    report = (tmp_path / "results.md").read_text()
    assert "| infogan |" in report and "mismatch" in report and "fakepkg" in report
    assert "Spread: first and third quartiles" in report and "interleaved mode" in report
    assert results["config"]["mode"] == "interleaved"
    assert os.path.getsize(tmp_path / "speedups.png") > 0


def test_tvm_and_torch_agree_through_the_harness(tmp_path):
    results = run_bench(models=["csrnet"], quick=True, systems=["tvm", "torch"],
                        reference="tvm", out_dir=str(tmp_path), time_budget_s=0.05, plot=False,
                        log=lambda _: None, mode="interleaved")  # fmt: skip
    systems = results["models"]["csrnet"]["systems"]
    assert systems["tvm"]["status"] == "ok", systems["tvm"]
    assert systems["torch"]["status"] == "ok"
    assert systems["tvm"]["ratio_to_ref"] == 1.0
    assert systems["tvm"]["rel_err"] < 1e-4
    assert "tune_s" not in systems["tvm"]  # trials=0: untuned default pipeline


def test_ollie_column_agrees_and_is_the_default_reference(tmp_path, monkeypatch):
    """The ``ollie`` system's build agrees with TVM and torch. Its derivation budget is cut to
    2 s (the default 20 s spends most of this test searching infogan's signatures: what is
    checked here is the column, not what a longer search finds)."""
    from tvm_ollie.bench import systems as bench_systems  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(bench_systems, "ollie_build",
                        functools.partial(bench_systems.ollie_build, search_time_s=2.0))
    results = run_bench(models=["infogan"], quick=True, systems=["ollie", "tvm", "torch"],
                        out_dir=str(tmp_path), time_budget_s=0.05, plot=False,
                        log=lambda _: None, mode="interleaved")  # fmt: skip
    systems = results["models"]["infogan"]["systems"]
    assert systems["ollie"]["status"] == "ok", systems["ollie"]
    assert systems["ollie"]["rel_err"] < 1e-4
    assert systems["ollie"]["ratio_to_ref"] == 1.0
    assert systems["tvm"]["ratio_to_ref"] > 0


@pytest.mark.slow
def test_tvm_orch_lib_agrees_with_tvm_and_chooses_library_kernels(tmp_path):
    """The ``tvm-orch-lib`` system (orchestration with library candidates, profiled costs)."""
    results = run_bench(models=["infogan"], quick=True, systems=["tvm", "tvm-orch-lib"],
                        reference="tvm", out_dir=str(tmp_path), time_budget_s=0.05, plot=False,
                        log=lambda _: None, mode="interleaved")  # fmt: skip
    got = results["models"]["infogan"]["systems"]["tvm-orch-lib"]
    assert got["status"] == "ok", got
    assert got["rel_err"] < 1e-4
    offered, chosen = got["library"]
    assert offered >= 1 and 0 <= chosen <= offered


def test_cli_list_and_bad_model(capsys):
    assert cli.main(["--list"]) == 0
    assert "longformer" in capsys.readouterr().out
    assert cli.main(["--models", "nope"]) == 2


def test_cuda_target_builds_tvm_and_skips_what_cannot_run(tmp_path):
    results = run_bench(models=["infogan"], quick=True, target="cuda",
                        systems=["tvm", "torch", "onnxruntime"], out_dir=str(tmp_path),
                        time_budget_s=0.05, plot=False, log=lambda _: None,
                        mode="interleaved")  # fmt: skip
    systems = results["models"]["infogan"]["systems"]
    if results["peaks"] is None:  # no GPU here: TVM is compiled for CUDA but not run
        assert systems["tvm"]["status"] == "built" and systems["tvm"]["compile_s"] > 0
        assert systems["torch"]["status"] == "skipped"
        assert "built" in (tmp_path / "results.md").read_text()
    else:
        assert systems["tvm"]["status"] == "ok"


def test_thread_environment_defaults_and_overrides(monkeypatch):
    from tvm_ollie.bench.env import configure_threads

    for key in ("TVM_NUM_THREADS", "OMP_WAIT_POLICY", "TVM_THREAD_POOL_SPIN_COUNT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    state = configure_threads(3)
    assert state["TVM_NUM_THREADS"] == "3"
    assert state["TVM_THREAD_POOL_SPIN_COUNT"] == "0"
    assert state["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's choice is kept
    assert state["torch_preloaded"] == "True"


def test_the_guards_timing_of_the_kept_plan_is_set_beside_the_fresh_one():
    """``kept_s`` (the never-worse guard's median of the plan it kept) over the benchmark's
    median of the finished executable, per guard, and a table of them in the report."""
    result = {"status": "ok", "median_s": 2e-3,
              "model_guard": {"winner": "original", "kept_s": 1e-3},
              "plans": {"winner": "joint", "kept_s": None}}
    guard_agreement(result)
    assert result["guard_vs_fresh"] == {"model_guard": pytest.approx(0.5)}
    untimed = {"status": "ok", "median_s": 2e-3}
    guard_agreement(untimed)
    assert "guard_vs_fresh" not in untimed
    cfg = dict(systems=["ollie"], reference="ollie", target="llvm", quick=True, batch=1,
               threads=1, trials=0, started="now")
    text = markdown({"config": cfg, "models": {"m": {"systems": {"ollie": result}}}})
    row = next(line for line in text.splitlines() if "whole model" in line)
    assert "| m | ollie | whole model | original | 1.000 | 2.000 | 0.50 |" in row, text
    assert "## Never-worse guards" in text
    assert "Never-worse guards" not in markdown(
        {"config": cfg, "models": {"m": {"systems": {"ollie": untimed}}}})


@pytest.mark.parametrize("protocol", ["warm", "cold"])
def test_the_timing_protocol_is_recorded(tmp_path, protocol):
    results = run_bench(models=["infogan"], quick=True, systems=["torch"], reference="torch",
                        out_dir=str(tmp_path), time_budget_s=0.0, min_rounds=2, plot=False,
                        log=lambda _: None, mode="interleaved", protocol=protocol)
    recorded = results["config"]["protocol"]
    assert recorded["name"] == protocol
    with open(tmp_path / "results.json", encoding="utf-8") as f:
        assert json.load(f)["config"]["protocol"] == recorded
    torch_result = results["models"]["infogan"]["systems"]["torch"]
    report = (tmp_path / "results.md").read_text()
    if protocol == "cold":
        assert torch_result["calls_per_sample"] == 1 and torch_result["warmup_calls"] == 0
        assert "cold protocol: one call per sample, no warm-up" in report
    else:
        assert torch_result["warmup_calls"] >= 1
        assert "warm protocol: samples of at least 20 ms" in report
    with pytest.raises(ValueError, match="protocol"):
        run_bench(models=["infogan"], quick=True, systems=["torch"], out_dir=str(tmp_path),
                  protocol="lukewarm", log=lambda _: None)


def test_cli_cold_option():
    from tvm_ollie.bench.__main__ import build_parser  # pylint: disable=import-outside-toplevel

    assert build_parser().parse_args(["--cold"]).cold
    assert not build_parser().parse_args([]).cold


def test_the_load_average_is_recorded(tmp_path):
    results = run_bench(models=["infogan"], quick=True, systems=["torch"], reference="torch",
                        out_dir=str(tmp_path), time_budget_s=0.0, min_rounds=2, plot=False,
                        log=lambda _: None, mode="interleaved")
    load = results["models"]["infogan"]["load"]
    assert len(load) == 2 and all(v >= 0 for v in load)
    assert "Load average (1 minute)" in (tmp_path / "results.md").read_text()


def test_a_system_with_slow_calls_is_timed_once(tmp_path):
    results = run_bench(models=["infogan"], quick=True, systems=["test_close", "test_slow_call"],
                        reference="test_close", out_dir=str(tmp_path), time_budget_s=0.0,
                        min_rounds=3, plot=False, log=lambda _: None, mode="interleaved",
                        slow_call_s=0.1)  # fmt: skip
    assert results["config"]["slow_call_s"] == 0.1
    systems = results["models"]["infogan"]["systems"]
    slow, ref = systems["test_slow_call"], systems["test_close"]
    assert slow["timed_once"] and slow["rounds"] == 1 and slow["warmup_calls"] == 0
    assert slow["median_s"] >= 0.2 and slow.get("ratio_quartiles") is None
    assert slow["ratio_to_ref"] == pytest.approx(slow["median_s"] / ref["median_s"])
    assert ref["rounds"] == 3 and "timed_once" not in ref
    report = (tmp_path / "results.md").read_text()
    assert f"{slow['median_s'] * 1e3:.3f} (once)" in report and "timed once" in report


def test_cli_slow_call_option():
    from tvm_ollie.bench.__main__ import build_parser  # pylint: disable=import-outside-toplevel

    assert build_parser().parse_args(["--slow-call-s", "2.5"]).slow_call_s == 2.5
    assert build_parser().parse_args([]).slow_call_s is None


def test_the_default_slow_call_limit_is_a_share_of_the_budget_with_a_floor(tmp_path):
    assert default_slow_call_s(20.0) == pytest.approx(4.0)  # paper sizes
    assert default_slow_call_s(10.0) == pytest.approx(2.0)  # quick
    assert default_slow_call_s(0.05) == 1.0  # a test's short budget: the floor
    results = run_bench(models=["infogan"], quick=True, systems=["test_close"],
                        reference="test_close", out_dir=str(tmp_path), min_rounds=2,
                        time_budget_s=0.05, plot=False, log=lambda _: None,
                        mode="interleaved")  # fmt: skip
    assert results["config"]["slow_call_s"] == 1.0
