"""Roofline figures: FLOPs and bytes of a Relax model, and the machine's measured peaks.

Counting rules (walk of the high-level Relax ``main`` as imported, one entry per op call):

* FLOPs: a multiply-add counts 2.
  - ``conv1d/2d/3d``: ``2 * out_elems * prod(weight.shape[1:])`` (OIHW weight: C_in/groups x
    kernel); ``conv2d_transpose``: ``2 * in_elems * prod(weight.shape[1:])`` (IOHW weight), the
    useful work of the scatter definition, not of TVM's zero-stuffed lowering.
  - ``matmul``/``linear``: ``2 * out_elems * K``; ``einsum`` with ``n`` operands:
    ``n * prod(all index extents)`` (n - 1 multiplies and one add per point; 2 for a pair).
  - pooling: ``out_elems * window``; adaptive pooling: ``in_elems``.
  - data movement (reshape, transpose, take, concat, slice, pad, broadcast, cast, ...): 0.
  - every other op (elementwise, activations, reductions, norms, softmax, resize): one FLOP per
    element of its largest tensor (input or output). Transcendentals count 1, as is usual.
* Bytes (``bytes``): for each op, the bytes of its distinct tensor inputs (weights included)
  plus its outputs: the traffic of an unfused execution where every op reads its operands from
  and writes its result to memory. View ops (reshape, expand_dims, squeeze, flatten) move
  nothing and count 0.
* ``bytes_min``: the compulsory traffic, i.e. the bytes of ``main``'s parameters (inputs and
  weights), of its non-scalar constants (weights bound into the module) and of its outputs,
  each once: no execution can move less.

The roofline bound is ``max(flops / peak_flops, bytes / peak_bandwidth)``; a system's fraction of
the roofline is ``bound / measured time`` (``bytes`` makes this the unfused bound, so a system
that fuses memory-bound ops well can exceed 1; ``bound_min`` uses ``bytes_min`` and cannot).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, Optional, Tuple

import numpy as np

from ..compat import relax, tvm

_MOVEMENT = {
    "relax.reshape", "relax.permute_dims", "relax.take", "relax.concat", "relax.split",
    "relax.strided_slice", "relax.dynamic_strided_slice", "relax.broadcast_to",
    "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.nn.pad", "relax.astype",
    "relax.repeat", "relax.tile", "relax.gather_elements", "relax.gather_nd", "relax.flip",
    "relax.zeros_like", "relax.ones_like", "relax.full_like", "relax.zeros", "relax.ones",
    "relax.full", "relax.arange", "relax.layout_transform", "relax.scatter_elements",
    "relax.index_tensor", "relax.collapse_sum_like", "relax.collapse_sum_to",
}  # fmt: skip
_VIEW = {"relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten"}
_POOL = {"relax.nn.max_pool1d", "relax.nn.max_pool2d", "relax.nn.max_pool3d",
         "relax.nn.avg_pool1d", "relax.nn.avg_pool2d", "relax.nn.avg_pool3d"}  # fmt: skip
_CONV = {"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"}
_OPAQUE = {"relax.call_tir", "relax.call_dps_packed", "relax.call_tir_inplace"}


@dataclasses.dataclass
class OpCount:
    """Totals for one op kind."""

    calls: int = 0
    flops: float = 0.0
    bytes: float = 0.0


@dataclasses.dataclass
class ModelCounts:
    """FLOPs and bytes of a model (see the module docstring for the rules)."""

    flops: float
    bytes: float
    bytes_min: float
    per_op: Dict[str, OpCount]

    def bound_s(self, peaks: "MachinePeaks") -> float:
        """Roofline lower bound in seconds using the unfused ``bytes``."""
        return max(self.flops / peaks.flops_per_s, self.bytes / peaks.bytes_per_s)

    def bound_min_s(self, peaks: "MachinePeaks") -> float:
        """Roofline lower bound in seconds using the compulsory ``bytes_min``."""
        return max(self.flops / peaks.flops_per_s, self.bytes_min / peaks.bytes_per_s)

    def intensity(self) -> float:
        """Arithmetic intensity in FLOP per (unfused) byte."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclasses.dataclass
class MachinePeaks:
    """Measured peak compute and memory bandwidth."""

    flops_per_s: float
    bytes_per_s: float
    how: str


def _shape(ty) -> Optional[Tuple[int, ...]]:
    """Static shape of a TensorType, or None (unknown rank/shape, non-tensor)."""
    shape = getattr(ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None:
        return None
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        return None


def _tensor_bytes(ty) -> float:
    """Bytes of a tensor type, or of all tensors in a tuple type; 0 when unknown."""
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return float(sum(_tensor_bytes(f) for f in fields))
    shape, dtype = _shape(ty), getattr(ty, "dtype", None)
    if shape is None or not dtype:
        return 0.0

    return float(np.prod(shape, dtype=np.float64)) * tvm.runtime.DataType(str(dtype)).bits / 8


def _elems(ty) -> float:
    fields = getattr(ty, "fields", None)
    if fields is not None:
        return float(sum(_elems(f) for f in fields))
    shape = _shape(ty)
    return float(np.prod(shape, dtype=np.float64)) if shape is not None else 0.0


def _einsum_flops(subscripts: str, arg_types) -> float:
    """``n * prod(extents)`` for ``n`` operands, from the subscripts and operand shapes."""
    lhs = subscripts.replace(" ", "").split("->")[0]
    extents: Dict[str, int] = {}
    for term, ty in zip(lhs.split(","), arg_types):
        shape = _shape(ty)
        if shape is None or "." in term:
            return 0.0
        for letter, extent in zip(term, shape):
            extents[letter] = extent
    total = float(np.prod(list(extents.values()), dtype=np.float64))
    return float(max(1, len(arg_types))) * total


def op_flops(name: str, call, out_ty) -> float:
    """FLOPs of one high-level Relax call (rules in the module docstring)."""
    args = [a.ty for a in call.args if hasattr(a, "ty")]
    out = _elems(out_ty)
    if name in _CONV:
        weight = _shape(args[1])
        return 2.0 * out * float(np.prod(weight[1:])) if weight else 0.0
    if name == "relax.nn.conv2d_transpose":
        weight = _shape(args[1])
        return 2.0 * _elems(args[0]) * float(np.prod(weight[1:])) if weight else 0.0
    if name in ("relax.matmul", "relax.linear"):
        a_shape = _shape(args[0])
        return 2.0 * out * a_shape[-1] if a_shape else 0.0
    if name == "relax.einsum":
        tuple_ty = args[0]
        return _einsum_flops(str(call.attrs.subscripts), list(getattr(tuple_ty, "fields", [])))
    if name in _POOL:
        return out * float(np.prod([int(k) for k in call.attrs.pool_size]))
    if name.startswith("relax.nn.adaptive_avg_pool"):
        return _elems(args[0])
    if name in _MOVEMENT:
        return 0.0
    return max([out] + [_elems(a) for a in args])


def op_bytes(name: str, call, out_ty) -> float:
    """Bytes read and written by one call in an unfused execution (0 for views)."""
    if name in _VIEW:
        return 0.0
    seen, total = [], _tensor_bytes(out_ty)
    for arg in call.args:
        if not hasattr(arg, "ty") or any(arg.same_as(other) for other in seen):
            continue
        seen.append(arg)
        total += _tensor_bytes(arg.ty)
    return total


def _constant_bytes(func) -> float:
    """Bytes of the distinct non-scalar tensor constants ``func`` reads (bound weights)."""

    found: Dict[int, float] = {}

    def visit(expr):
        if isinstance(expr, tvm.ir.expr.Constant) and isinstance(expr.ty, relax.TensorType) \
                and expr.ty.shape is not None and len(expr.ty.shape) > 0:
            found[hash(expr)] = _tensor_bytes(expr.ty)

    relax.analysis.post_order_visit(func, visit)
    return float(sum(found.values()))


def count_module(mod, func_name: str = "main") -> ModelCounts:
    """Count FLOPs and bytes of ``mod[func_name]`` (a high-level Relax function).

    Calls to anything other than a Relax operator (``call_tir`` and friends after legalization,
    calls to other functions) are counted as unknown ops with bytes but no FLOPs.
    """

    func = mod[func_name]
    per_op: Dict[str, OpCount] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            name = value.op.name if isinstance(value.op, tvm.ir.Op) else "<call>"
            out_ty = binding.var.ty
            known = name.startswith("relax.") and name not in _OPAQUE
            flops = op_flops(name, value, out_ty) if known else 0.0
            entry = per_op.setdefault(name, OpCount())
            entry.calls += 1
            entry.flops += flops
            entry.bytes += op_bytes(name, value, out_ty)
    bytes_min = sum(_tensor_bytes(p.ty) for p in func.params) + _tensor_bytes(func.body.body.ty)
    bytes_min += _constant_bytes(func)
    return ModelCounts(
        flops=sum(e.flops for e in per_op.values()),
        bytes=sum(e.bytes for e in per_op.values()),
        bytes_min=float(bytes_min),
        per_op=per_op,
    )


def measure_cpu_peaks(
    matmul_size: int = 1024, copy_mib: int = 128, repeats: int = 5
) -> MachinePeaks:
    """Peak FLOP/s from a numpy (BLAS) fp32 matmul and bandwidth from a numpy array copy.

    Both are the best of ``repeats`` after a warm-up. The copy moves ``2 * size`` bytes (read +
    write); numpy copies on one thread, so on many-core machines this underestimates the
    bandwidth all cores together can draw.
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((matmul_size, matmul_size), dtype=np.float32)
    b = rng.standard_normal((matmul_size, matmul_size), dtype=np.float32)
    best_mm = _best_time(lambda: a @ b, repeats)
    src = np.ones(copy_mib * (1 << 20) // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best_copy = _best_time(lambda: np.copyto(dst, src), repeats)
    return MachinePeaks(
        flops_per_s=2.0 * matmul_size**3 / best_mm,
        bytes_per_s=2.0 * src.nbytes / best_copy,
        how=f"numpy fp32 matmul {matmul_size}^3, numpy copy {copy_mib} MiB, best of {repeats}",
    )


def measure_cuda_peaks(matmul_size: int = 8192, copy_mib: int = 1024, repeats: int = 5):
    """Peak FLOP/s and bandwidth of GPU 0 via torch (fp32, TF32 off); None without CUDA torch."""
    try:
        # lazy: torch is a heavy, optional dependency
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(matmul_size, matmul_size, device="cuda")
    b = torch.randn(matmul_size, matmul_size, device="cuda")
    src = torch.ones(copy_mib * (1 << 20) // 4, device="cuda")
    dst = torch.empty_like(src)

    def timed(fn):
        def run():
            fn()
            torch.cuda.synchronize()

        return _best_time(run, repeats)

    best_mm = timed(lambda: a @ b)
    best_copy = timed(lambda: dst.copy_(src))
    return MachinePeaks(
        flops_per_s=2.0 * matmul_size**3 / best_mm,
        bytes_per_s=2.0 * src.numel() * 4 / best_copy,
        how=f"torch cuda fp32 matmul {matmul_size}^3 (no TF32), copy {copy_mib} MiB",
    )


def _best_time(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
