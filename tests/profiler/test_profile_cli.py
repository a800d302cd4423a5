"""``tvm-ollie profile`` on a tiny ONNX model and its error cases, run by ``main(args)`` in this
process: the same code below the TVM import a new process pays (``tests/test_cli.py`` runs the
command line in real processes: exit codes, output, Ctrl-C)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "frontend"))

import tiny_models  # noqa: E402  pylint: disable=wrong-import-position


def in_process(capsys, *args):
    """Run ``main(args)`` here; returns (exit code, stdout, stderr)."""
    from tvm_ollie.cli import main  # pylint: disable=import-outside-toplevel

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors exit
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_profile_onnx_with_trace(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    model = tmp_path / "tiny.onnx"
    tiny_models.write_onnx(str(model))
    trace = tmp_path / "trace.json"
    # TVM kernels only and no derivation: the command's path, without the search's seconds
    code, out, err = in_process(capsys, "profile", model, "--runs", "2", "--no-derive",
                                "--no-library", "--trace", trace)
    assert code == 0, out + err
    assert "Traceback" not in err
    for title in ("ollie: by kind", "ollie: by name", "onnxruntime: by op type",
                  "without the profiler", f"wrote {trace}"):
        assert title in out
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
