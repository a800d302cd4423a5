"""Constant matmul weights stored in the form the kernel reads fastest: as they are, in the
other order, or packed once into oneDNN's format.

oneDNN's matmul reads a plain ``B`` through a copy into its blocked format on every call where
it cannot use it as stored (measured: a transposed ``B`` of a few-row product, e.g. 4x128x512
with ``tb=1`` 13.4 us plain against 7.1 us packed); ONNX Runtime's MLAS packs constant weights
once when the session starts. For every native ``matmul`` call whose ``B`` is a constant
matrix, this step times three forms of the call on the kernel itself, :data:`FORMS`::

    lv = R.call_dps_packed("tvm_ollie.cpu.matmul", ("tb=1;bias=1", x, W, b), out)    # as is
    lv = R.call_dps_packed("tvm_ollie.cpu.matmul", ("tb=0;bias=1", x, W.T, b), out)  # transposed
    lv = R.call_dps_packed("tvm_ollie.cpu.matmul", ("tb=1;bias=1;wpacked=1", x, P, b), out)

with ``P`` the 1-D pack of ``tvm_ollie.cpu.matmul_pack_weight`` (a header naming the problem,
the format and the machine, then ``W`` in the primitive's format), and gives the call the
fastest, when it is faster by a margin (below). No form wins everywhere: on the same machine
a 4x128x128 product ran 2.5 us with ``B`` stored [K, N], 5.1 us stored [N, K] and 3.6 us
packed, a 4x128x512 one 11.1, 13.4 and 6.4 us. A pack is made for one call's attributes and
shapes, on this machine: the step runs after every other rewrite of the call (epilogues,
layouts). Elsewhere (another CPU or thread count) the kernel reorders the pack from its
header's format tag on each call.

Eligible: ``ta=0`` (the packed call folds ``A``'s batch into the rows), ``B`` a float32
constant of rank 2 (or the transpose of one, :func:`constant_weight`), static shapes, and a
problem the kernel gives oneDNN (more than one row and column: matrix-vector products stay on
OpenBLAS). Each distinct problem is timed once per module (:func:`time_forms`), and once per
work directory when there is one (:data:`FORMS_FILE`: a warm build makes the same module, which
the whole-model guard's recorded verdicts are keyed by).

**A form other than the first must win by** :data:`FORM_MARGIN` (:func:`chosen_form`): the
forms are judged as every timed decision is (:func:`~tvm_ollie.tune.compare.judge`), and forms
within the margin of the fastest are tied and go to the first of them in the order of
:data:`FORMS` (as is, then transposed: a plain matrix, then packed: a format of this machine's
oneDNN) that beats every form before it. Until 2026-12-05 the fastest median won outright, and
three fresh builds of quick SegFormer gave 18 of its 35 problems different forms (3.8 / 3.8 /
4.0 us as is / transposed / packed in one build, 3.9 / 3.9 / 4.1 in the next): the guard's
library plan, the one plan every build should write alike, was a different module in each
(docs/decisions.md, "Near ties confirmed").
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm_ffi

from .. import native
from ..codegen import library as lib
from ..compat import relax, tirx, tvm
from ..tune.compare import from_seconds
from ..tune.workdir import atomic_write_bytes
from .choosing import REPRODUCIBLE_MARGIN

__all__ = ["FORMS", "FORM_MARGIN", "PackReport", "chosen_form", "constant_weight",
           "packed_weight", "pack_matmul_weights", "time_forms"]

LOG = logging.getLogger(__name__)

#: The times of each problem's forms in a work directory, ``{key: [seconds per form]}``.
FORMS_FILE = "matmul_forms.json"

#: ``timer(forms, shapes) -> seconds per call of each form`` (:func:`time_forms`).
Timer = Callable[[Sequence[Tuple[lib.LibCall, np.ndarray]], dict], List[float]]


@dataclass
class PackReport:
    """What :func:`pack_matmul_weights` did: one line per call site (``MxKxN`` of the folded
    problem, its attributes, the seconds per call of each form of :data:`FORMS`), in ``chosen``
    (with the form given) or ``kept``."""

    chosen: List[str] = field(default_factory=list)
    kept: List[str] = field(default_factory=list)

    @property
    def packed(self) -> List[str]:
        """The lines of the calls given a packed ``B``."""
        return [line for line in self.chosen if line.endswith("-> packed")]

    def to_text(self) -> str:
        """One line."""
        counts = {form: sum(line.endswith(f"-> {form}") for line in self.chosen)
                  for form in FORMS}
        counts["as is"] += len(self.kept)
        return "matmul weights: " + ", ".join(f"{n} {form}" for form, n in counts.items())


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


#: A form of a call's constant ``B``: the call's attributes and the ``B`` it takes.
Form = Tuple[lib.LibCall, np.ndarray]


def time_forms(forms: Sequence[Form], shapes: dict, rounds: int = 7,
               calls: int = 10) -> List[float]:
    """Seconds per call of each form: ``rounds`` rounds of ``calls`` calls of every form, the
    order rotated each round (random operands of ``shapes``: ``a``, ``out`` and the optional
    ``bias``, ``res``), the median of the rounds."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shapes["a"], dtype=np.float32)
    extra = [rng.standard_normal(shapes[k], dtype=np.float32) for k in ("bias", "res")
             if k in shapes]
    out = np.zeros(shapes["out"], "float32")
    func = tvm_ffi.get_global_func(lib.MATMUL)
    args = [(call.text(), _t(a), _t(b), *map(_t, extra), _t(out)) for call, b in forms]
    for one in args:
        func(*one)  # primitives created, caches warm
    times: List[List[float]] = [[] for _ in forms]
    for r in range(rounds):
        for i in [(r + j) % len(forms) for j in range(len(forms))]:
            start = time.perf_counter()
            for _ in range(calls):
                func(*args[i])
            times[i].append((time.perf_counter() - start) / calls)
    return [statistics.median(t) for t in times]


def constant_weight(expr, bound: Dict[object, object]) -> Optional[np.ndarray]:
    """The value of ``B`` when it is a constant, or a variable bound to a constant or to the
    transpose of a constant matrix (``permute_dims(W, [1, 0])``: the library plan's linear
    layers; TVM folds it later, the pack needs it now), else None. ``bound``: the function's
    ``{var: value}``."""
    expr = bound.get(expr, expr)
    if isinstance(expr, tvm.ir.expr.Constant):
        return expr.value.numpy()
    if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) \
            and expr.op.name == "relax.permute_dims":
        inner = bound.get(expr.args[0], expr.args[0])
        axes = expr.attrs.axes
        if isinstance(inner, tvm.ir.expr.Constant) and len(inner.value.shape) == 2 and (
                axes is None or [int(a) for a in axes] == [1, 0]):
            return np.ascontiguousarray(inner.value.numpy().T)
    return None


def _eligible(call: lib.LibCall, ops: list, weight: Optional[np.ndarray], out_shape
              ) -> Optional[dict]:
    """The operand shapes of a native matmul whose constant ``B`` (``weight``) may be packed,
    else None."""
    if call.func != lib.MATMUL or call.get("wpacked", "0") == "1" or call.get("ta", "0") == "1" \
            or call.get("lib", "auto") == "openblas" or weight is None or len(ops) < 2:
        return None
    a_shape, out_shape = _static(ops[0].ty.shape), _static(out_shape)
    if a_shape is None or out_shape is None or weight.ndim != 2 or len(a_shape) < 2 \
            or weight.dtype != np.float32:
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


#: The forms of a constant ``B`` timed per call: as the call has it, stored in the other order
#: (``tb`` flipped, the constant transposed at build time), packed (``wpacked=1``).
FORMS = ("as is", "transposed", "packed")

#: How much faster (relative) a form must measure than every form before it in :data:`FORMS`
#: to be chosen over them: the unit decisions' build-to-build margin
#: (:data:`~.choosing.REPRODUCIBLE_MARGIN`, 15%). The forms' clear wins are 25-50% (4x128x512
#: ``tb=1``: 14.5 us as is, 7.7 packed); their near ties, 0-13%, flipped between builds.
FORM_MARGIN = REPRODUCIBLE_MARGIN


def chosen_form(seconds: Sequence[float]) -> Tuple[int, bool]:
    """``(index into FORMS, tied)``: the form kept for times ``seconds`` (one per form of
    :data:`FORMS`): the fastest when it beats every other by :data:`FORM_MARGIN`, else the
    first tied form in the order of :data:`FORMS` that beats every form before it (module
    docstring); ``tied``: a tie decided it."""
    res = from_seconds(dict(zip(FORMS, seconds)), FORMS, FORM_MARGIN)
    return FORMS.index(res.winner), not res.separated


class _Packer:
    """Decides and makes the packs of one module (one timing per distinct problem)."""

    def __init__(self, timer: Optional[Timer], work_dir: Optional[str] = None):
        self.timer = timer or time_forms
        self.report = PackReport()
        self.path = os.path.join(work_dir, FORMS_FILE) if work_dir else None
        self.verdicts: Dict[str, List[float]] = self._read()
        self.added = False

    def _read(self) -> Dict[str, List[float]]:
        if self.path is None or not os.path.isfile(self.path):
            return {}
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
            return {k: [float(s) for s in v] for k, v in data.items() if len(v) == len(FORMS)}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            LOG.warning("ollie: %s unreadable (%s); the matmul forms are timed again",
                        self.path, err)
            return {}

    def save(self) -> None:
        """Write the times to the work directory when some were measured now."""
        if self.path is not None and self.added:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(self.verdicts, indent=0,
                                                     sort_keys=True).encode())

    def binding(self, var, value, bound: Dict[object, object]) -> Optional["relax.Call"]:
        """The packed call replacing ``value`` (bound to ``var``), or None."""
        found = lib.lib_call_of(value)
        if found is None:
            return None
        call, ops = found
        weight = constant_weight(ops[1], bound) if len(ops) > 1 else None
        shapes = _eligible(call, ops, weight, var.ty.shape)
        if shapes is None:
            return None
        tb = call.get("tb", "0") == "1"
        forms = [(call, weight),  # B as it is, the other storage order, packed
                 (call.with_attrs(tb=int(not tb)), np.ascontiguousarray(weight.T)),
                 (call.with_attrs(wpacked=1), packed_weight(call, shapes["a"], weight,
                                                            shapes["out"]))]
        key = f"{call.text()}|a={shapes['a']}|b={list(weight.shape)}|out={shapes['out']}" \
              f"|threads={native.get_num_threads()}"
        if key not in self.verdicts:
            self.verdicts[key] = [float(s) for s in self.timer(forms, shapes)]
            self.added = True
        seconds = self.verdicts[key]
        best, tied = chosen_form(seconds)
        line = f"{_problem(shapes)} {call.text()}: " + ", ".join(
            f"{name} {s * 1e6:.1f} us" for name, s in zip(FORMS, seconds))
        line += f" (a tie within {FORM_MARGIN:.0%})" if tied else ""
        if best == 0 and isinstance(ops[1], tvm.ir.expr.Constant):
            self.report.kept.append(line)
            return None
        self.report.chosen.append(f"{line} -> {FORMS[best]}")
        chosen, b = forms[best]
        return lib.emit_call(chosen, [ops[0], relax.const(b)] + ops[2:], shapes["out"])


def _rewritten(func: "relax.Function", packer: _Packer) -> Optional["relax.Function"]:
    blocks, changed = [], False
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings
             if isinstance(b, relax.VarBinding)}
    for block in func.body.blocks:
        bindings = []
        for b in block.bindings:
            packed = packer.binding(b.var, b.value, bound) if isinstance(b, relax.VarBinding) \
                else None
            changed |= packed is not None
            bindings.append(b if packed is None else relax.VarBinding(b.var, packed))
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    if not changed:
        return None
    return relax.Function(func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty,
                          func.is_pure, func.attrs)


def pack_matmul_weights(mod: "tvm.IRModule", timer: Optional[Timer] = None,
                        work_dir: Optional[str] = None) -> Tuple["tvm.IRModule", PackReport]:
    """``mod`` with the constant ``B`` of each eligible native matmul call in the form that
    measures fastest (module docstring), and what was done. ``mod`` as it is when
    the loaded library cannot pack.

    Parameters
    ----------
    mod : IRModule
        A Relax module after the rewrite (native calls as ``call_dps_packed``), its layouts
        and epilogues decided.
    timer : callable, optional
        ``timer(forms, shapes) -> seconds per call of each form`` (tests); default
        :func:`time_forms`.
    work_dir : str, optional
        Where the times are kept (:data:`FORMS_FILE`) and read back in later builds.
    """
    packer = _Packer(timer, work_dir)
    if not native.available() or not native.provides(native.MATMUL_PACK_WEIGHT):
        packer.report.kept.append("the native library has no matmul_pack_weight")
        return mod, packer.report
    updates = {}
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            new = _rewritten(func, packer)
            if new is not None:
                updates[gv] = new
    packer.save()
    if not updates:
        return mod, packer.report
    out = mod.shallow_copy() if hasattr(mod, "shallow_copy") else tvm.IRModule(
        dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updates.items():
        out[gv] = func
    return relax.transform.Normalize()(out), packer.report
