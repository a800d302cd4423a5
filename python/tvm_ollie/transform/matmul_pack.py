"""Constant matmul weights packed once into oneDNN's format, where that measures faster.

oneDNN's matmul reads a plain ``B`` through a copy into its blocked format on every call;
ONNX Runtime's MLAS packs constant weights once when the session starts. For every native
``matmul`` call whose ``B`` is a constant matrix, this step makes the copy at build time
(``tvm_ollie.cpu.matmul_pack_weight``) and gives the call ``wpacked=1`` and the pack::

    lv = R.call_dps_packed("tvm_ollie.cpu.matmul", ("tb=1;bias=1", x, W, b), out)
      ->
    lv = R.call_dps_packed("tvm_ollie.cpu.matmul", ("tb=1;bias=1;wpacked=1", x, P, b), out)

with ``P`` the 1-D pack (a header naming the problem, the format and the machine, then ``W``
in the primitive's format). A pack is made for one call's attributes and shapes, on this
machine: it runs after every other rewrite of the call (epilogues, layouts). Elsewhere (another
CPU or thread count) the kernel reorders the pack from its header's format tag on each call.

Eligible: ``ta=0`` (the packed call folds ``A``'s batch into the rows), ``B`` a float32
constant of rank 2, static shapes, and a problem the kernel gives oneDNN (more than one row
and column: matrix-vector products stay on OpenBLAS). Each distinct problem is timed plain and
packed on the native kernel itself (interleaved rounds, medians of the rounds' per-call times),
and packed only when it measures faster: the pack costs a call its plain weight's reads where
oneDNN would have used ``B`` as it is.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..codegen import library as lib
from ..compat import relax, tirx, tvm

__all__ = ["PackReport", "packed_weight", "pack_matmul_weights", "time_plain_packed"]

#: ``timer(call, shapes, weight, packed) -> (plain seconds, packed seconds)`` per call.
Timer = Callable[[lib.LibCall, dict, np.ndarray, np.ndarray], Tuple[float, float]]


@dataclass
class PackReport:
    """What :func:`pack_matmul_weights` did: ``packed`` and ``kept`` hold one line per call
    site (``MxKxN`` of the folded problem, the per-call times when measured, why kept)."""

    packed: List[str] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)

    def to_text(self) -> str:
        """One line."""
        return f"matmul weights packed: {len(self.packed)} calls ({len(self.kept)} kept plain)"


def _static(shape) -> Optional[List[int]]:
    if shape is None or not all(isinstance(d, tirx.IntImm) for d in shape):
        return None
    return [int(d) for d in shape]


def _t(array: np.ndarray):
    return tvm_ffi.from_dlpack(array)


def packed_weight(call: lib.LibCall, a_shape: Sequence[int], weight: np.ndarray,
                  out_shape: Sequence[int]) -> np.ndarray:
    """The pack of ``weight`` (``B`` as ``call`` stores it) for ``call`` with ``wpacked=1``
    and an ``A`` of ``a_shape`` (``tvm_ollie.cpu.matmul_pack_weight``; only the shapes of ``A``
    and ``Out`` are read)."""
    text = call.with_attrs(wpacked=1).text()
    a = np.zeros(a_shape, "float32")
    out = np.zeros(out_shape, "float32")
    w = np.ascontiguousarray(weight, "float32")
    size = int(tvm_ffi.get_global_func(native.MATMUL_PACKED_SIZE)(text, _t(a), _t(w), _t(out)))
    packed = np.zeros(size, "float32")
    tvm_ffi.get_global_func(native.MATMUL_PACK_WEIGHT)(text, _t(a), _t(w), _t(out), _t(packed))
    return packed


def time_plain_packed(call: lib.LibCall, shapes: dict, weight: np.ndarray, packed: np.ndarray,
                      rounds: int = 7, calls: int = 10) -> Tuple[float, float]:
    """Seconds per call of ``call`` on ``weight`` and with ``wpacked=1`` on ``packed``:
    ``rounds`` interleaved rounds of ``calls`` calls each (random operands of ``shapes``:
    ``a``, ``out`` and the optional ``bias``, ``res``), the median of the rounds."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shapes["a"], dtype=np.float32)
    extra = [rng.standard_normal(shapes[k], dtype=np.float32) for k in ("bias", "res")
             if k in shapes]
    out = np.zeros(shapes["out"], "float32")
    func = tvm_ffi.get_global_func(lib.MATMUL)
    plain = (call.text(), _t(a), _t(np.ascontiguousarray(weight)), *map(_t, extra), _t(out))
    pack = (call.with_attrs(wpacked=1).text(), _t(a), _t(packed), *map(_t, extra), _t(out))
    times: Dict[int, List[float]] = {0: [], 1: []}
    for args in (plain, pack):
        func(*args)  # primitives created, caches warm
    for r in range(rounds):
        for which in ((0, 1) if r % 2 == 0 else (1, 0)):
            args = plain if which == 0 else pack
            start = time.perf_counter()
            for _ in range(calls):
                func(*args)
            times[which].append((time.perf_counter() - start) / calls)
    return statistics.median(times[0]), statistics.median(times[1])


def _eligible(call: lib.LibCall, ops: list, out_shape) -> Optional[dict]:
    """The operand shapes of a native matmul whose constant ``B`` may be packed, else None."""
    if call.func != lib.MATMUL or call.get("wpacked", "0") == "1" or call.get("ta", "0") == "1" \
            or call.get("lib", "auto") == "openblas":
        return None
    if len(ops) < 2 or not isinstance(ops[1], tvm.ir.expr.Constant):
        return None
    a_shape, out_shape = _static(ops[0].ty.shape), _static(out_shape)
    b_shape = [int(d) for d in ops[1].value.shape]
    if a_shape is None or out_shape is None or len(b_shape) != 2 or len(a_shape) < 2 \
            or str(ops[1].value.dtype) != "float32":
        return None
    rows, n = int(np.prod(a_shape[:-1])), out_shape[-1]
    if rows <= 1 or n <= 1 or a_shape[-1] == 0:
        return None
    shapes = {"a": a_shape, "out": out_shape}
    rest = list(ops[2:])
    if call.get("bias", "0") == "1":
        shapes["bias"] = [n]
    if call.get("res", "0") == "1":
        shapes["res"] = out_shape
    if len(rest) != len(shapes) - 2:
        return None
    return shapes


def _problem(shapes: dict) -> str:
    a = shapes["a"]
    return f"{int(np.prod(a[:-1]))}x{a[-1]}x{shapes['out'][-1]}"


class _Packer:
    """Decides and makes the packs of one module (one timing per distinct problem)."""

    def __init__(self, timer: Optional[Timer]):
        self.timer = timer or time_plain_packed
        self.report = PackReport()
        self.verdicts: Dict[tuple, Optional[Tuple[float, float]]] = {}

    def binding(self, var, value) -> Optional["relax.Call"]:
        """The packed call replacing ``value`` (bound to ``var``), or None."""
        found = lib.lib_call_of(value)
        if found is None:
            return None
        call, ops = found
        shapes = _eligible(call, ops, var.ty.shape)
        if shapes is None:
            return None
        weight = ops[1].value.numpy()
        packed = packed_weight(call, shapes["a"], weight, shapes["out"])
        key = (call.text(), tuple(shapes["a"]), weight.shape, tuple(shapes["out"]))
        if key not in self.verdicts:
            self.verdicts[key] = self.timer(call, shapes, weight, packed)
        plain_s, packed_s = self.verdicts[key]
        line = f"{_problem(shapes)} {call.text()}: plain {plain_s * 1e6:.1f} us, packed " \
               f"{packed_s * 1e6:.1f} us"
        if packed_s >= plain_s:
            self.report.kept.append(line + " (packed not faster)")
            return None
        self.report.packed.append(line)
        return lib.emit_call(call.with_attrs(wpacked=1), [ops[0], relax.const(packed)] + ops[2:],
                             shapes["out"])


def _rewritten(func: "relax.Function", packer: _Packer) -> Optional["relax.Function"]:
    blocks, changed = [], False
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            packed = packer.binding(b.var, b.value) if isinstance(b, relax.VarBinding) else None
            changed |= packed is not None
            bindings.append(b if packed is None else relax.VarBinding(b.var, packed))
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    if not changed:
        return None
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)


def pack_matmul_weights(mod: "tvm.IRModule", timer: Optional[Timer] = None
                        ) -> Tuple["tvm.IRModule", PackReport]:
    """``mod`` with the constant ``B`` of each eligible native matmul call packed where the
    packed call measures faster (module docstring), and what was done. ``mod`` as it is when
    the loaded library cannot pack.

    Parameters
    ----------
    mod : IRModule
        A Relax module after the rewrite (native calls as ``call_dps_packed``), its layouts
        and epilogues decided.
    timer : callable, optional
        ``timer(call, shapes, weight, packed) -> (plain s, packed s)`` (tests);
        default :func:`time_plain_packed`.
    """
    packer = _Packer(timer)
    if not native.available() or not native.provides(native.MATMUL_PACK_WEIGHT):
        packer.report.kept.append("the native library has no matmul_pack_weight")
        return mod, packer.report
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            new = _rewritten(func, packer)
            if new is not None:
                updates[gv] = new
    if not updates:
        return mod, packer.report
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(
        dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return relax.transform.Normalize()(out), packer.report
