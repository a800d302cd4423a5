"""``tvm-ollie profile`` as a user runs it: in a subprocess, on a tiny ONNX model; its error
cases in this process (``main(args)``: the same code below the TVM import a process pays)."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))

import tiny_models  # noqa: E402  pylint: disable=wrong-import-position


def cli(*args, timeout=600):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "tvm_ollie.cli", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def in_process(capsys, *args):
    """Run ``main(args)`` here; returns (exit code, stdout, stderr)."""
    from tvm_ollie.cli import main  # pylint: disable=import-outside-toplevel

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors exit
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_profile_onnx_with_trace(tmp_path):
    pytest.importorskip("onnxruntime")
    model = tmp_path / "tiny.onnx"
    tiny_models.write_onnx(str(model))
    trace = tmp_path / "trace.json"
    # TVM kernels only and no derivation: the command's path, without the search's seconds
    proc = cli("profile", model, "--runs", "2", "--no-derive", "--no-library", "--trace", trace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for title in ("ollie: by kind", "ollie: by name", "onnxruntime: by op type",
                  "without the profiler", f"wrote {trace}"):
        assert title in proc.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {"ollie (TVM VM)", "onnxruntime"}
    calls = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert any(e["cat"] == "TVM conv/matmul (+epilogue)" for e in calls)


def test_profile_bad_model_is_one_line(tmp_path, capsys):
    code, out, err = in_process(capsys, "profile", tmp_path / "missing.onnx")
    assert code == 2, out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tvm-ollie: error: ")
    code, out, err = in_process(capsys, "profile", "zoo:no_such_model")
    assert code == 2, out + err
    assert "unknown model" in err


def test_profile_bad_runs(capsys):
    code, _, err = in_process(capsys, "profile", "zoo:resnet18", "--runs", "0")
    assert code == 2
    assert "--runs must be >= 1" in err
