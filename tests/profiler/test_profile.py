"""The profiler on tiny models: every VM call accounted for, grouped, traced; ONNX Runtime's side.

No timed assertion: the times only have to be positive and the groups have to cover every call.
"""

import json
import os
import sys

import numpy as np
import pytest

import tvm_ollie
from tvm_ollie import native
from tvm_ollie.profiler import kinds, profile_executable, vm_calls
from tvm_ollie.profiler.ort import parse_trace, profile_onnxruntime
from tvm_ollie.profiler.result import ProfileResult

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))

import tiny_models  # noqa: E402  pylint: disable=wrong-import-position

RUNS = 3


def conv_relu_matmul():
    """``matmul(reshape(relu(conv2d(x, w))), m)``: a conv, an activation, a matmul."""
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    w = relax.Var("w", relax.TensorType((8, 4, 3, 3), "float32"))
    m = relax.Var("m", relax.TensorType((512, 16), "float32"))
    with bb.function("main", [x, w, m]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=(1, 1))))
            r = bb.emit(relax.op.reshape(y, (1, 512)))
            out = bb.emit_output(relax.op.matmul(r, m))
        bb.emit_func_output(out)
    return tvm.IRModule(bb.get().functions)


def random_args(shapes):
    rng = np.random.default_rng(0)
    return [rng.uniform(-1, 1, s).astype("float32") for s in shapes]


ARG_SHAPES = [(1, 4, 8, 8), (8, 4, 3, 3), (512, 16)]


def check_accounted(profile, ex):
    """Every run made exactly main's calls; the groupings cover them; the sums are positive."""
    code = vm_calls(ex)
    assert profile.code_calls == len(code)
    assert len(profile.events) == RUNS * len(code)
    for run in range(RUNS):
        assert [e.name for e in profile.events if e.run == run] == code
    by_kind, by_name = profile.by_kind(), profile.by_name()
    assert sum(r.count for r in by_kind) == len(code)
    assert sum(r.count for r in by_name) == len(code)
    assert {r.key for r in by_name} == set(code)
    total = profile.calls_sum_s()
    assert total > 0
    assert sum(r.total_s for r in by_kind) == pytest.approx(total)
    assert all(t > 0 for t in profile.unprofiled_s + profile.profiled_s)


def test_tvm_build_every_call_accounted():
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    mod = conv_relu_matmul()
    ex = tvm.compile(mod, "llvm", relax_pipeline=relax.get_default_pipeline(tvm.target.Target(
        "llvm")))
    profile = profile_executable(ex, random_args(ARG_SHAPES), tvm.cpu(), runs=RUNS, system="tvm")
    check_accounted(profile, ex)
    found = {r.key for r in profile.by_kind()}
    assert kinds.TVM_CONV_MATMUL in found and kinds.VM_ALLOC in found
    trace = json.loads(json.dumps(ProfileResult("m", "llvm", 1, [profile]).to_chrome_trace()))
    calls = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in calls] == vm_calls(ex)  # one event per call of one run


def test_library_calls_appear_by_name():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((8, 16), "float32"))
    b = relax.Var("b", relax.TensorType((16, 4), "float32"))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            y = bb.emit(relax.call_dps_packed(native.MATMUL, [tvm.ir.StringImm("act=relu"), a, b],
                                              relax.TensorType((8, 4), "float32")))
            z = bb.emit_output(relax.op.add(y, y))
        bb.emit_func_output(z)
    ex = tvm.compile(bb.get(), target="llvm")
    profile = profile_executable(ex, random_args([(8, 16), (16, 4)]), tvm.cpu(), runs=RUNS)
    check_accounted(profile, ex)
    rows = {r.key: r for r in profile.by_name()}
    assert rows[native.MATMUL].kind == kinds.LIBRARY_MATMUL
    assert rows[native.MATMUL].count == 1


@pytest.mark.slow
def test_profile_model_ollie_and_trace():
    result = tvm_ollie.profile_model(conv_relu_matmul(), runs=RUNS, baseline=True,
                                     search_time_s=2.0)
    assert [s.system for s in result.systems] == ["ollie", "tvm"]
    assert result.ort is None
    for profile in result.systems:
        assert profile.calls_per_run() == profile.code_calls > 0
        assert sum(r.count for r in profile.by_kind()) == profile.code_calls
        assert profile.calls_sum_s() > 0 and profile.unprofiled_median_s() > 0
        assert profile.kernel_calls() >= 2  # at least the conv and the matmul
    text = result.to_text()
    for title in ("ollie: by kind", "ollie: by name", "tvm: by kind", "without the profiler"):
        assert title in text
    trace = json.loads(json.dumps(result.to_chrome_trace()))
    for pid, profile in enumerate(result.systems, start=1):
        calls = [e for e in trace["traceEvents"] if e["pid"] == pid and e["ph"] == "X"]
        assert len(calls) == profile.code_calls
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in calls)


@pytest.mark.parametrize("name,kind", [
    ("tvm_ollie.cpu.conv2d", kinds.LIBRARY_CONV),
    ("tvm_ollie.cuda.conv2d", kinds.LIBRARY_CONV),
    ("tvm_ollie.cpu.conv2d_pack_weight", kinds.LIBRARY_CONV),
    ("tvm_ollie.cpu.matmul", kinds.LIBRARY_MATMUL),
    ("tvm_ollie.cuda.batch_matmul", kinds.LIBRARY_MATMUL),
    ("tvm_ollie.cpu.g2bmm", kinds.LIBRARY_MATMUL),
    ("fused_conv2d_add_relu", kinds.TVM_CONV_MATMUL),
    ("fused_matmul1_add3", kinds.TVM_CONV_MATMUL),
    ("ollie_region_matmul_1", kinds.TVM_CONV_MATMUL),
    ("max_pool2d", kinds.TVM_REDUCE),
    ("fused_mean_reshape", kinds.TVM_REDUCE),
    ("softmax2", kinds.TVM_REDUCE),
    ("fused_add_maximum_minimum", kinds.TVM_ELEMWISE),
    ("fused_multiply_add_relu", kinds.TVM_ELEMWISE),
    ("fused_ollie_region_eop_0_reshape", kinds.TVM_EOP),
    ("ollie_conv2d_eop_3", kinds.TVM_EOP),
    ("fused_relu_ollie_conv2d_eop_01_reshape3", kinds.TVM_EOP),
    ("ollie_conv2d_matmul_0", kinds.TVM_CONV_MATMUL),
    ("fused_ollie_merge_batch_matmul_2_add", kinds.TVM_CONV_MATMUL),
    ("reshape", kinds.TVM_LAYOUT),
    ("fused_transpose_reshape1", kinds.TVM_LAYOUT),
    ("layout_transform", kinds.TVM_LAYOUT),
    ("concatenate", kinds.TVM_LAYOUT),
    ("vm.builtin.alloc_storage", kinds.VM_ALLOC),
    ("vm.builtin.null_value", kinds.VM_ALLOC),
    ("vm.builtin.match_shape", kinds.VM_CHECK),
    ("vm.builtin.reshape", kinds.VM_OTHER),
])
def test_kind_of(name, kind):
    assert kinds.kind_of(name) == kind


def test_parse_ort_trace_drops_warm_up_and_groups_by_run():
    events = [{"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
              {"cat": "Node", "name": "c_kernel_time", "ts": 10, "dur": 50,
               "args": {"op_name": "Conv", "provider": "CPUExecutionProvider"}},
              {"cat": "Session", "name": "model_run", "ts": 200, "dur": 100},
              {"cat": "Node", "name": "c_kernel_time", "ts": 210, "dur": 40,
               "args": {"op_name": "Conv", "provider": "CPUExecutionProvider"}},
              {"cat": "Node", "name": "c_fence_before", "ts": 209, "dur": 0, "args": {}},
              {"cat": "Node", "name": "r_kernel_time", "ts": 260, "dur": 5,
               "args": {"op_name": "Relu", "provider": "CPUExecutionProvider"}}]
    nodes, run_us = parse_trace(events, skip_runs=1)
    assert run_us == [100.0]
    assert [(n.name, n.op_type, n.run, n.dur_us) for n in nodes] == [
        ("c", "Conv", 0, 40.0), ("r", "Relu", 0, 5.0)]


def test_onnxruntime_profile_of_tiny_onnx(tmp_path):
    pytest.importorskip("onnxruntime")
    path = str(tmp_path / "tiny.onnx")
    tiny_models.write_onnx(path)
    x = random_args([tiny_models.X_SHAPE])
    ort = profile_onnxruntime(path, x, runs=RUNS, threads=1)
    assert ort.runs == RUNS and len(ort.unprofiled_s) == RUNS
    per_run = len(ort.nodes) / RUNS
    assert per_run >= 1 and per_run == int(per_run)
    assert any("Conv" in n.op_type for n in ort.nodes)
    assert all(n.dur_us >= 0 for n in ort.nodes)
    text = ProfileResult(path, "llvm", 1, [], ort).to_text()
    assert "onnxruntime: by op type" in text and "Conv" in text
    trace = ProfileResult(path, "llvm", 1, [], ort).to_chrome_trace()
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == per_run


def test_typical_run_per_call_median_or_min_and_mean_when_runs_differ():
    from tvm_ollie.profiler.result import _typical  # pylint: disable=import-outside-toplevel

    same = [[("a", 1.0), ("b", 5.0)], [("a", 3.0), ("b", 2.0)], [("a", 2.0), ("b", 9.0)]]
    assert _typical(same) == [("a", 2.0, 1.0), ("b", 5.0, 1.0)]
    assert _typical(same, "min") == [("a", 1.0, 1.0), ("b", 2.0, 1.0)]
    differ = [[("a", 1.0)], [("a", 3.0), ("b", 2.0)]]
    assert _typical(differ) == [("a", 1.0, 0.5), ("a", 3.0, 0.5), ("b", 2.0, 0.5)]


def test_model_time_is_the_benchmarks_warm_samples(monkeypatch):
    """Both sides' "model without the profiler" are warm samples under the benchmark's
    protocol (untimed warm-up calls, then at least 20 ms of calls per sample)."""
    import tvm  # pylint: disable=import-outside-toplevel

    from tvm_ollie.bench import timing  # pylint: disable=import-outside-toplevel
    from tvm_ollie.profiler import api, ort  # pylint: disable=import-outside-toplevel

    seen = []

    def spy(fn, samples, protocol=None):
        got = timing.warm_samples(fn, samples, protocol)
        seen.append(got)
        return got

    monkeypatch.setattr(api, "warm_samples", spy)
    monkeypatch.setattr(ort, "warm_samples", spy)
    ex = tvm.compile(conv_relu_matmul(), target="llvm")
    profile = profile_executable(ex, random_args(ARG_SHAPES), tvm.cpu(0), runs=RUNS)
    (samples,) = seen
    assert profile.unprofiled_s == samples.seconds and len(samples.seconds) == RUNS
    assert samples.warmup >= timing.WARM.min_warmup
