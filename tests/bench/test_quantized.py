"""The quantized-exports benchmark (``python -m tvm_ollie.bench.quantized``): its table, the
CLI latency parser, and one quantized export that imports through the ONNX path."""

import pytest

from tvm_ollie.bench import quantized


def test_table_lists_each_system_error_and_ratio():
    rows = [quantized.Row("fsrcnn", "qoperator", "ollie", ms=2.0, error=0.0, compile_s=3.0),
            quantized.Row("fsrcnn", "qoperator", "tvm", note="build failed: x"),
            quantized.Row("fsrcnn", "qoperator", "onnxruntime", ms=1.0, error=0.0)]
    text = quantized.table(rows, threads=2, repeat=5)
    line = next(l for l in text.splitlines() if l.startswith("| fsrcnn (qoperator)"))
    assert line == "| fsrcnn (qoperator) | 2.000 | failed | 1.000 | 0 | - | 0.50 |"
    assert "- fsrcnn (qoperator) tvm: build failed: x" in text
    assert "2 thread(s)" in text


def test_latency_is_read_in_ms():
    assert quantized._latency_ms("latency: 250.0 us (median of 50, cpu(0))") == pytest.approx(0.25)
    assert quantized._latency_ms("latency: 1.5 ms") == 1.5
    with pytest.raises(RuntimeError, match="no latency"):
        quantized._latency_ms("nothing")


@pytest.mark.slow  # torch export, calibration and quantization: ~20 s
def test_quantized_export_has_integer_operators(tmp_path):
    pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    path = quantized.quantize("fsrcnn", "qoperator", str(tmp_path))
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert "QLinearConv" in ops and "Conv" not in ops
