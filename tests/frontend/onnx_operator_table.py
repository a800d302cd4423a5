"""Print the table of docs/onnx-operators.md: the ONNX operators TVM's importer lacks, how
tvm-ollie routes each, and the measured error of each route against ONNX Runtime.

Run from the repository root::

    TVM_NUM_THREADS=1 python tests/frontend/onnx_operator_table.py > /tmp/table.md

Every case is imported through :func:`tvm_ollie.frontend.loader.load_onnx` (preparation and
decomposition), built with ``tvm.compile(..., "llvm")`` and run in the Relax VM; the reference is
ONNX Runtime 1.32 on CPU, or the specification's arithmetic where ONNX Runtime does not run the
case (per-channel ``ConvInteger``/per-row ``MatMulInteger`` zero points, full-range u8s8 integer
products, which its x86 kernels saturate in int16).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# pylint: disable=wrong-import-position
import onnx_op_cases as cases  # noqa: E402

#: operator -> [(case description, builder, reference: "ort" | "spec" | "numpy")].
CASES = {
    "LSTM": [
        ("bidirectional, peepholes, clip, input_forget, initial states", lambda:
         cases.recurrent_case("LSTM", "bidirectional", peepholes=True, clip=0.7,
                              input_forget=1), "ort"),
        ("bidirectional, sequence_lens [4, 2, 1]", lambda:
         cases.recurrent_case("LSTM", "bidirectional", lens=[4, 2, 1]), "ort"),
        ("HardSigmoid/LeakyRelu/ScaledTanh with alpha, beta", lambda:
         cases.recurrent_case("LSTM", activations=["HardSigmoid", "LeakyRelu", "ScaledTanh"],
                              activation_alpha=[0.3, 0.2, 0.8], activation_beta=[0.4, 1.3]),
         "ort"),
    ],
    "GRU": [
        ("bidirectional, linear_before_reset=1", lambda:
         cases.recurrent_case("GRU", "bidirectional", linear_before_reset=1), "ort"),
        ("reverse, linear_before_reset=0, sequence_lens [1, 4, 3]", lambda:
         cases.recurrent_case("GRU", "reverse", lens=[1, 4, 3]), "ort"),
        ("Elu/Affine, clip", lambda:
         cases.recurrent_case("GRU", activations=["Elu", "Affine"], activation_alpha=[0.5, 2.0],
                              activation_beta=[0.1], clip=1.0), "ort"),
    ],
    "RNN": [
        ("bidirectional, ThresholdedRelu/Softsign", lambda:
         cases.recurrent_case("RNN", "bidirectional",
                              activations=["ThresholdedRelu", "Softsign"],
                              activation_alpha=[0.1]), "ort"),
        ("Relu, sequence_lens [2, 4, 3]", lambda:
         cases.recurrent_case("RNN", activations=["Relu"], lens=[2, 4, 3]), "ort"),
    ],
    "ConvInteger": [
        ("s8 x s8, group 2, pads, strides", lambda:
         cases.conv_integer_case(np.int8, np.int8, False, group=2, pads=[1, 1, 1, 1],
                                 strides=[2, 2]), "ort"),
        ("u8 x s8, per-channel w zero point", lambda: cases.conv_integer_case(), "spec"),
    ],
    "MatMulInteger": [
        ("s8 x u8, per-tensor zero points", lambda:
         cases.matmul_integer_case(np.int8, np.uint8, False), "ort"),
        ("u8 x s8, per-row a / per-column b zero points", lambda: cases.matmul_integer_case(),
         "spec"),
    ],
    "QLinearConv": [
        ("u8 x s8 (7-bit w), per-channel scales, bias", lambda: cases.qlinear_conv_case(),
         "ort"),
        ("s8 x s8, saturating at -128/127, pads", lambda:
         cases.qlinear_conv_case(np.int8, np.int8, False, y_scale=0.005, pads=[1, 1, 1, 1]),
         "ort"),
        ("u8 x s8 full range", lambda: cases.qlinear_conv_case(full_range=True), "spec"),
    ],
    "QLinearMatMul": [
        ("u8 x s8 (7-bit b)", lambda: cases.qlinear_matmul_case(), "ort"),
        ("s8 x s8, per-column scales, saturating", lambda:
         cases.qlinear_matmul_case(np.int8, np.int8, True, y_scale=0.002), "ort"),
    ],
    "QLinearAdd (com.microsoft)": [
        ("u8, broadcast", lambda: cases.qlinear_binary_case(), "ort"),
    ],
    "QLinearMul (com.microsoft)": [
        ("s8, broadcast", lambda: cases.qlinear_binary_case("QLinearMul", np.int8), "ort"),
    ],
    "LpNormalization": [
        ("p=2, axis=1", lambda: cases.unary_case("LpNormalization", axis=1), "ort"),
        ("p=1, axis=-1", lambda: cases.unary_case("LpNormalization", p=1), "ort"),
    ],
    "ReverseSequence": [
        ("time_axis 0, lens an input", lambda: cases.reverse_sequence_case(), "ort"),
        ("batch_axis 0, constant lens", lambda:
         cases.reverse_sequence_case(1, 0, constant_lens=True), "ort"),
    ],
    "CumProd": [
        ("opset 26, exclusive, reverse", lambda: cases.cumprod_case(1, 1, 1), "numpy"),
    ],
    "Celu": [("opset 17 (context-dependent body)", lambda:
              cases.unary_case("Celu", alpha=0.7), "ort")],
    "Swish": [("opset 24 (function body)", lambda:
               cases.unary_case("Swish", opset=24, alpha=1.3), "ort")],
    "HannWindow": [("size 8, periodic", lambda: cases.window_case(), "ort")],
    "HammingWindow": [("size 7, symmetric", lambda:
                       cases.window_case("HammingWindow", 7, 0), "ort")],
    "BlackmanWindow": [("size 8, periodic", lambda:
                        cases.window_case("BlackmanWindow"), "ort")],
    "SoftmaxCrossEntropyLoss": [("reduction mean", lambda: cases.loss_case(), "ort")],
    "NegativeLogLikelihoodLoss": [("reduction sum", lambda:
                                   cases.loss_case("NegativeLogLikelihoodLoss", "sum"), "ort")],
    "RotaryEmbedding": [("opset 23, [b, heads, seq, head], position ids", lambda:
                         cases.rotary_case(), "ort")],
}


def _reference(kind: str, model, feeds):
    if kind == "spec":
        return cases.integer_reference(model, feeds)
    if kind == "numpy":
        return [cases.cumprod_reference(feeds["x"], 1, 1, 1)]
    return cases.run_ort(model, feeds)


def measure(op: str):
    """Rows ``(op, case, imported, error, reference, seconds)`` for one operator."""
    rows = []
    for description, build, kind in CASES[op]:
        model, feeds = build()
        start = time.perf_counter()
        try:
            ours = cases.run_tvm(model, feeds)
        except Exception as err:  # pylint: disable=broad-except  # reported in the table
            rows.append((op, description, f"no: {str(err).splitlines()[0][:80]}", "", kind, 0.0))
            continue
        seconds = time.perf_counter() - start
        error = cases.max_error(ours, _reference(kind, model, feeds))
        rows.append((op, description, "yes", f"{error:.2g}", kind, seconds))
    return rows


def missing_operators():
    """(operator, route) for every standard operator TVM's importer lacks (newest opset)."""
    # pylint: disable=import-outside-toplevel
    import onnx

    from tvm_ollie.frontend.onnx_decompose import importer_ops
    from tvm_ollie.frontend.onnx_rules import RULES

    known = importer_ops()
    routes = []
    for schema in sorted(onnx.defs.get_all_schemas(), key=lambda s: s.name):
        if schema.domain not in ("", "ai.onnx") or schema.deprecated or schema.name in known:
            continue
        if schema.name in RULES:
            route = "rule"
        elif schema.all_function_opset_versions:
            route = "schema function, inlined"
        else:
            route = "none (stops the load)"
        routes.append((schema.name, route))
    return routes


def main() -> None:
    """Print both tables as Markdown."""
    print("| operator | case | imported | max abs error | reference | build + run (s) |")
    print("|---|---|---|---|---|---|")
    for op in CASES:
        for row in measure(op):
            print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]} | {row[5]:.1f} |",
                  flush=True)  # fmt: skip
    print()
    print("| operator TVM lacks | route |")
    print("|---|---|")
    for name, route in missing_operators():
        print(f"| {name} | {route} |")


if __name__ == "__main__":
    main()
