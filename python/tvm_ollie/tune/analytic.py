"""Calibrated analytic cost of an operator and of its derived programs (``trials=0``).

Both sides of a decision are costed by one model so that they compare: the original operator
is one kernel of its kind (a convolution, a matmul...) that does the work of its lifted
expression; a derived program is the sum of its stages, an operator stage at the efficiency of
its kind and an eOperator at the bandwidth roof (see :mod:`.calibrate`).

``impl="native"`` costs the operators the native library runs (original matmul/conv2d/
conv2d_transpose calls, matched matmul/conv2d/g2bmm/gbmm stages) at the library's *measured*
efficiency (``native_matmul``, ``native_conv2d``, ``native_conv_transpose``, ``native_g2bmm``,
``native_gbmm`` in the calibration);
everything else is costed as TVM builds it.

Stages computed from constants only (a concatenation or a transposition of constant weights)
cost nothing: TVM's ``FoldConstant`` evaluates them once, at compile time
(:func:`folded_stages`), so a program is costed as it runs.
"""

from __future__ import annotations

from typing import AbstractSet, FrozenSet, Optional, Sequence, Tuple

import numpy as np

from ..codegen import library as lib
from ..derive.cost import EOP_COMPUTE_EFFICIENCY, expr_cost, least_work, stage_cost
from ..derive.program import Program
from ..derive.targets import TARGET_NAMES, TARGET_OPS, target_op
from ..ir.nodes import Scope
from .calibrate import Calibration

__all__ = ["NATIVE_KIND", "ORIGINAL_KIND", "derived_efficiency", "derived_kinds", "folded_stages",
           "least_seconds", "original_seconds", "program_seconds", "stage_seconds",
           "useful_flops"]

#: Kernel kind of an original Relax operator (keys of :data:`.calibrate.EFFICIENCY`).
ORIGINAL_KIND = {
    "relax.nn.conv1d": "conv2d",
    "relax.nn.conv2d": "conv2d",
    "relax.nn.conv3d": "conv2d",
    "relax.nn.conv1d_transpose": "conv_transpose",
    "relax.nn.conv2d_transpose": "conv_transpose",
    "relax.nn.conv3d_transpose": "conv_transpose",
    "relax.matmul": "matmul",
}


def _roof(flops: float, moved: float, calib: Calibration, kind: str) -> float:
    """An eOperator's arithmetic runs at :data:`~tvm_ollie.derive.cost.EOP_COMPUTE_EFFICIENCY`
    of the compute roof, as :func:`~tvm_ollie.derive.cost.stage_cost` charges it (TE code
    without an operator's schedule; at the full roof a program leaving convolution phases in
    an eOperator was estimated cheaper than any operator could run them, below the search's
    lower bound), its bytes at the calibrated ``eop`` fraction of the bandwidth."""
    if kind == "eop":
        return max(flops / (calib.peak_flops * EOP_COMPUTE_EFFICIENCY),
                   moved / (calib.bandwidth * calib.eff("eop")))
    return max(flops / (calib.peak_flops * calib.eff(kind)), moved / calib.bandwidth)


#: Kernel kind of an original Relax operator on the native library.
NATIVE_KIND = {"relax.nn.conv2d": "native_conv2d", "relax.matmul": "native_matmul",
               "relax.nn.conv2d_transpose": "native_conv_transpose"}


def stage_seconds(stage, calib: Calibration, impl: str = "tvm") -> float:
    """Estimated seconds of one program stage (``impl`` as in :func:`program_seconds`), its
    kernel's launch (``calib.launch_s``) included."""
    sc = stage_cost(stage, calib.peak_flops, calib.bandwidth)
    kind = stage.kind
    if impl == "native" and lib.stage_form(stage) is not None:
        kind = f"native_{target_op(kind).library}"
    elif kind == "batch_matmul" and stage.attrs.get("batch", 1) == 1:
        kind = "matmul"
    return _roof(sc.flops, sc.bytes, calib, kind) + calib.launch_s


def program_seconds(program: Program, calib: Calibration, impl: str = "tvm",
                    constants: AbstractSet[str] = frozenset()) -> float:
    """Estimated seconds of a derived program (sum over its stages); with ``impl="native"``
    the matched stages the library implements run on it. ``constants`` names the program's
    inputs that are constants: the stages computed from them alone are folded at compile time
    (:func:`folded_stages`) and cost nothing."""
    folded = folded_stages(program, constants, impl)
    return sum(stage_seconds(s, calib, impl) for s in program.stages if s.name not in folded)


def folded_stages(program: Program, constants: AbstractSet[str],
                  impl: str = "tvm") -> FrozenSet[str]:
    """Names of the stages that read only constants: inputs named in ``constants`` and other
    such stages. Emitted as ``call_tir`` (or a Relax operator) over constants, each is
    evaluated once by TVM's ``FoldConstant`` when the module is built; a stage that runs on a
    native library kernel (``call_dps_packed``, ``impl="native"``) is not folded."""
    known = set(constants)
    folded = set()
    for stage in program.stages:
        on_library = impl == "native" and lib.stage_form(stage) is not None
        if stage.reads and not on_library and all(r in known for r in stage.reads):
            known.add(stage.name)
            folded.add(stage.name)
    return frozenset(folded)


def useful_flops(expr: Scope, op_name: str) -> Optional[float]:
    """The FLOPs a library kernel does for an operator whose lifted expression counts more, else
    None. A transposed convolution lifts to a dense reduction over every output point and kernel
    tap, guarded by a ``select`` on the stride (4x the work at stride 2, plus the index tests);
    the library scatters each input point through its kernel slice instead:
    ``2 * |data| * |weight| / weight.shape[0]`` (data ``[N, C, H, W]``, IOHW weight
    ``[C, O/G, KH, KW]``: each input point times ``O/G * KH * KW`` weights). The calibration's
    ``native_conv_transpose`` is measured in the same units."""
    if op_name not in ("relax.nn.conv2d_transpose",):
        return None
    inputs = expr.inputs
    if len(inputs) != 2 or len(inputs[1].shape) != 4 or not inputs[1].shape[0]:
        return None
    data, weight = inputs
    return 2.0 * float(np.prod(data.shape)) * float(np.prod(weight.shape)) / weight.shape[0]


def original_seconds(expr: Scope, op_name: str, calib: Calibration, impl: str = "tvm") -> float:
    """Estimated seconds of the original operator: one kernel doing its lifted expression
    (TVM's, or the native library's with ``impl="native"``, which does the operator's
    :func:`useful_flops` where they differ)."""
    flops, moved = expr_cost(expr)
    kind = ORIGINAL_KIND.get(op_name, "tir")
    if impl == "native" and op_name in NATIVE_KIND:
        kind = NATIVE_KIND[op_name]
        flops = useful_flops(expr, op_name) or flops
    return _roof(flops, moved, calib, kind) + calib.launch_s


def derived_kinds(library: bool = True,
                  targets: Sequence[str] = TARGET_NAMES) -> Tuple[str, ...]:
    """The kernel kinds a derived program's operator stages can run on: the target operators
    the search matches (``targets``; a one-batch ``batch_matmul`` is costed as ``matmul``,
    :func:`stage_seconds`) and, with ``library``, their native kernels (``native_matmul``,
    ``native_conv2d``, ``native_g2bmm``, ``native_gbmm``). Not the original operator's own
    kinds (``conv_transpose``, ``native_conv_transpose``): no rule instantiates a stage as a
    transposed convolution, so only the original runs on them."""
    kinds = []
    for name in targets:
        op = TARGET_OPS.get(name)
        if op is None:
            continue  # the search ignores unknown target names (match_scope)
        kinds.append(name)
        if name == "batch_matmul":
            kinds.append("matmul")
        if library and op.library:
            kinds.append(f"native_{op.library}")
    return tuple(dict.fromkeys(kinds))


def derived_efficiency(calib: Calibration, library: bool = True,
                       targets: Sequence[str] = TARGET_NAMES) -> float:
    """The highest fraction of the compute roof at which a derived program does arithmetic:
    the best calibrated efficiency of :func:`derived_kinds` (``calib.eff``, as
    :func:`stage_seconds` reads it, with its ``tir`` default for an uncalibrated kind) or an
    eOperator's :data:`~tvm_ollie.derive.cost.EOP_COMPUTE_EFFICIENCY`, whichever is higher."""
    return max([calib.eff(k) for k in derived_kinds(library, targets)] +
               [EOP_COMPUTE_EFFICIENCY])


def least_seconds(expr: Scope, calib: Calibration, library: bool = True,
                  targets: Sequence[str] = TARGET_NAMES) -> float:
    """The roofline lower bound of any derived program of ``expr``: its
    :func:`~tvm_ollie.derive.cost.least_work` at the best efficiency a derived program can do
    arithmetic at (:func:`derived_efficiency`: the kinds of the target operators in
    ``targets``, their native kernels with ``library``, and the eOperators') and at the full
    bandwidth.

    Why it is a true lower bound of :func:`program_seconds` (optimistic, never
    pessimistic): every product of ``least_work``'s flops is computed in some stage of the
    program (the rules reorder, split and regroup products and never drop one that can be
    nonzero); :func:`stage_seconds` charges a stage's flops at its own kind's efficiency,
    which is one of :func:`derived_kinds` for an operator stage (instantiation only makes
    target operators, on TVM's kernel or the library's) and
    :data:`~tvm_ollie.derive.cost.EOP_COMPUTE_EFFICIENCY` for an eOperator, so at most the
    maximum of them; the time of a sum of stages is at least their flops at that best rate,
    and at least their bytes at the full bandwidth (an eOperator's bytes are charged at a
    fraction of it, an operator's at all of it; every program moves ``least_work``'s bytes).
    The original operator's own kernels (the library's transposed convolution, TVM's
    ``conv_transpose``) are no derived program's, so their efficiency does not lower the
    bound: a transposed convolution whose library kernel is calibrated faster than the
    library GEMM any derived form runs on can now be proved unbeatable
    (``tests/derive/test_search_bound.py`` checks the bound against every candidate of
    depth-3 searches, under calibrations that make the operators or the eOperators' arithmetic
    the cheaper)."""
    flops, moved = least_work(expr)
    best = derived_efficiency(calib, library, targets)
    return max(flops / (calib.peak_flops * best), moved / calib.bandwidth)
