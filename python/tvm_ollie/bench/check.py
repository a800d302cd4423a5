"""Output agreement with PyTorch eager, relative to the scale of the reference output.

A system's time only counts if every output element satisfies
``|out - ref| <= atol * scale + rtol * |ref|`` with ``scale = max |ref|`` (1 if that is 0):
absolute errors are judged against the output's magnitude, so randomly initialized models with
large or tiny activations are treated alike.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

import numpy as np

RTOL = 1e-3
ATOL = 1e-3


@dataclasses.dataclass
class Agreement:
    """Result of comparing a system's outputs with the reference."""

    ok: bool
    max_abs_err: float
    scale: float
    reason: str = ""

    @property
    def rel_err(self) -> float:
        """``max_abs_err / scale``."""
        return self.max_abs_err / self.scale


def compare_outputs(
    outputs: Sequence[np.ndarray],
    reference: Sequence[np.ndarray],
    rtol: float = RTOL,
    atol: float = ATOL,
) -> Agreement:
    """Compare two output lists element-wise (shapes must match exactly)."""
    if len(outputs) != len(reference):
        reason = f"{len(outputs)} outputs, expected {len(reference)}"
        return Agreement(False, float("inf"), 1.0, reason)
    worst, worst_scale = 0.0, 1.0
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
        if out.shape != ref.shape:
            reason = f"output {i}: shape {out.shape} != {ref.shape}"
            return Agreement(False, float("inf"), 1.0, reason)
        scale = float(np.max(np.abs(ref))) if ref.size else 1.0
        scale = scale if scale > 0 and np.isfinite(scale) else 1.0
        if not np.all(np.isfinite(out)):
            return Agreement(False, float("inf"), scale, f"output {i}: non-finite values")
        err = np.abs(out - ref)
        max_err = float(err.max()) if err.size else 0.0
        if max_err / scale > worst / worst_scale:
            worst, worst_scale = max_err, scale
        if np.any(err > atol * scale + rtol * np.abs(ref)):
            rel = max_err / scale
            return Agreement(False, max_err, scale, f"output {i}: max error {rel:.2e} x scale")
    return Agreement(True, worst, worst_scale)


def as_numpy_list(value) -> List[np.ndarray]:
    """Flatten a system's raw output (tensor, array, tuple/list of them) into numpy arrays."""
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            out.extend(as_numpy_list(item))
        return out
    if hasattr(value, "detach"):  # torch.Tensor
        return [value.detach().cpu().numpy()]
    if hasattr(value, "numpy"):  # tvm.runtime.Tensor, onnxruntime.OrtValue
        return [value.numpy()]
    is_sequence = hasattr(value, "__len__") and hasattr(value, "__getitem__")
    if is_sequence and not isinstance(value, np.ndarray):  # tvm ffi Array
        return as_numpy_list([value[i] for i in range(len(value))])
    return [np.asarray(value)]
