"""Emit a derived :class:`~tvm_ollie.derive.program.Program` as Relax bindings.

Every stage becomes one binding with its shape intact:

* an eOperator (and any operator stage that has no Relax operator form) becomes one
  ``R.call_tir`` of the stage's expression lowered through TE
  (:func:`tvm_ollie.codegen.lower.to_te`, one PrimFunc per stage);
* with ``impl="tvm"``, a ``matmul``/``batch_matmul`` stage without transposed operands becomes
  ``R.matmul``, and a ``conv2d`` stage in NCHW/OIHW layout becomes ``R.nn.conv2d``: the *Relax
  operator* path, so that TVM's own legalization plus dlight (GPU) or MetaSchedule compiles the
  heavy kernel exactly as it would compile a user-written matmul or convolution;
* with ``impl="native"``, every matched stage the native library implements becomes one
  ``R.call_dps_packed`` of its kernel (:mod:`tvm_ollie.codegen.library`), the others as above;
* with ``impl="tir"``, every stage is a ``call_tir`` (no operator forms at all).

A stage that reads an earlier output (or an input) under another shape with the same number of
elements reads a row-major view of it: that is an ``R.reshape``, which TVM lowers to a free
view (``RewriteDataflowReshape``). The program's output is reshaped to the call's result shape.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Tuple

from ..codegen import library as lib
from ..codegen.lower import to_te
from ..compat import relax
from ..derive.program import Program, Stage
from ..derive.targets import target_op
from ..ir.nodes import Access, BinOp, Tensor, input_tensors

__all__ = ["IMPLS", "EmitError", "emit_program", "stage_mode"]

#: How matched operator stages are emitted (see the module docstring).
IMPLS = ("tvm", "native", "tir")


class EmitError(ValueError):
    """A program (or one of its stages) has no Relax form here."""


def _shape_of(expr) -> Tuple[int, ...]:
    return tuple(int(s) for s in expr.ty.shape)


def _view(bb: "relax.BlockBuilder", value, shape: Tuple[int, ...]):
    """``value`` under ``shape`` (a free row-major reshape when the shapes differ)."""
    have = _shape_of(value)
    if have == tuple(shape):
        return value
    n_have, n_want = 1, 1
    for s in have:
        n_have *= s
    for s in shape:
        n_want *= s
    if n_have != n_want:
        raise EmitError(f"cannot view a tensor of shape {list(have)} as {list(shape)}")
    return bb.emit(relax.op.reshape(value, tuple(shape)))


def stage_mode(stage: Stage, impl: str = "tvm") -> str:
    """How ``stage`` is emitted: ``"native"`` (a library kernel), ``"matmul"``, ``"conv2d"``
    (Relax ops) or ``"tir"``."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, not {impl!r}")
    if impl == "tir" or not stage.is_operator:
        return "tir"
    if impl == "native" and lib.stage_form(stage) is not None and _all_float32(stage):
        return "native"
    guard = _RELAX_FORM_GUARDS.get(target_op(stage.kind).relax_op)
    return target_op(stage.kind).relax_op if guard is not None and guard(stage.attrs) else "tir"


#: When a target operator's Relax family expresses a stage with these attributes (the Relax
#: ``matmul`` takes no transposed operand; ``conv2d`` is emitted in NCHW/OIHW only).
_RELAX_FORM_GUARDS = {
    "matmul": lambda at: not at.get("transpose_a") and not at.get("transpose_b"),
    "conv2d": lambda at: (at.get("data_layout"), at.get("kernel_layout"),
                          at.get("out_layout")) == ("NCHW", "OIHW", "NCHW"),
}


def _all_float32(stage: Stage) -> bool:
    """The native kernels compute float32 from float32 operands."""
    return stage.expr.dtype == "float32" and all(t.dtype == "float32"
                                                 for t in input_tensors(stage.expr))


def _reads(stage: Stage) -> List[Tensor]:
    reads = list(input_tensors(stage.expr))
    names = [t.name for t in reads]
    if len(set(names)) != len(names):
        raise EmitError(f"stage {stage.name} reads one tensor under two shapes")
    return reads


def _emit_library(bb, stage: Stage, mode: str, values: Mapping[str, object]):
    """The Relax operator (or native kernel) of a matched stage; operands in the stage's
    operand order."""
    reads = _reads(stage)
    if len(reads) != 2:
        raise EmitError(f"stage {stage.name} ({stage.kind}) does not read two operands")
    a, b = (_view(bb, values[t.name], t.shape) for t in reads)
    if mode == "native":
        return lib.emit_call(lib.stage_form(stage), [a, b], stage.shape)
    # A stage summing float16 reads in float32 (casts in its body) is the op's out_dtype; when
    # its operands differ in type (one an earlier float32 stage), the narrower one is widened.
    acc = stage.expr.dtype
    out_dtype = None
    if reads[0].dtype != reads[1].dtype:
        a, b = (v if t.dtype == acc else bb.emit(relax.op.astype(v, acc))
                for v, t in zip((a, b), reads))
    elif reads[0].dtype != acc:
        out_dtype = acc
    if mode == "matmul":
        call = relax.op.matmul(a, b, out_dtype=out_dtype)
    else:
        at = stage.attrs
        pl_h, pl_w, ph_h, ph_w = at["padding"]
        call = relax.op.nn.conv2d(a, b, strides=tuple(at["stride"]),
                                  padding=(pl_h, pl_w, ph_h, ph_w),
                                  dilation=tuple(at["dilation"]), groups=int(at.get("groups", 1)),
                                  out_dtype=out_dtype)
    out = bb.normalize(call)
    if _shape_of(out) != tuple(stage.shape):
        raise EmitError(f"stage {stage.name}: the Relax {mode} gives {list(_shape_of(out))}, "
                        f"the stage computes {list(stage.shape)}")
    return out


def _emit_tir(bb, stage: Stage, values: Mapping[str, object], name: str):
    reads = _reads(stage)
    args = [_view(bb, values[t.name], t.shape) for t in reads]
    names = [t.name for t in reads]

    def compute(*tensors):
        _, out = to_te(stage.expr, placeholders=dict(zip(names, tensors)), name=name)
        return out

    return bb.call_te(compute, *args, primfunc_name_hint=name)


def emit_program(bb: "relax.BlockBuilder", program: Program, inputs: Mapping[str, object],
                 out_shape: Tuple[int, ...], impl: str = "tvm", name: str = "ollie"):
    """Emit ``program`` into the dataflow block ``bb`` is building; return the result.

    Parameters
    ----------
    bb : relax.BlockBuilder
        A builder inside a dataflow block (intermediate stages are emitted as bindings).
    program : Program
        A single-output program (from :func:`tvm_ollie.derive.derive`).
    inputs : Mapping[str, relax.Expr]
        The Relax value of each input tensor of the program, by the names the lift gave them.
    out_shape : tuple of int
        The shape of the call being replaced (the output stage may be a view of it); for a
        program of several expressions (``program.multi``), one shape per output.
    impl : str
        How matched operators are emitted: ``"tvm"`` (Relax operators where possible),
        ``"native"`` (library kernels where possible) or ``"tir"`` (see :func:`stage_mode`).
    name : str
        Prefix of the PrimFunc names.

    Returns
    -------
    relax.Expr
        The (not yet bound) expression of the result, shaped ``out_shape``; for a program of
        several expressions, a ``relax.Tuple`` of the bound outputs, in ``program.outputs``
        order.
    """
    if program.multi:
        return _emit_multi(bb, program, inputs, out_shape, impl, name)
    values: Dict[str, object] = dict(inputs)
    result = None
    for k, stage in enumerate(program.stages):
        expr = _emit_stage(bb, stage, k, values, impl, name)
        if stage.name == program.output:
            result = expr
            break
        values[stage.name] = bb.emit(expr)
    if result is None:
        raise EmitError(f"the output stage {program.output} was not emitted")
    if _shape_of(bb.normalize(result)) != tuple(out_shape):
        result = relax.op.reshape(bb.emit(result), tuple(out_shape))
    return result


def _emit_multi(bb, program: Program, inputs: Mapping[str, object], out_shapes, impl: str,
                name: str):
    """Every stage as one binding; the outputs (each viewed in its shape) as one tuple."""
    shapes = [tuple(int(d) for d in s) for s in out_shapes]
    if len(shapes) != len(program.outputs):
        raise EmitError(f"{len(program.outputs)} outputs but {len(shapes)} result shapes")
    values: Dict[str, object] = dict(inputs)
    for k, stage in enumerate(program.stages):
        values[stage.name] = bb.emit(_emit_stage(bb, stage, k, values, impl, name))
    outs = [_view(bb, values[o], shape) for o, shape in zip(program.outputs, shapes)]
    return relax.Tuple(outs)


def _emit_stage(bb, stage, k: int, values: Mapping[str, object], impl: str, name: str):
    """Stage ``k`` of a program as a Relax expression over the already bound ``values``."""
    missing = [t for t in stage.reads if t not in values]
    if missing:
        raise EmitError(f"stage {stage.name} reads unknown tensors {missing}")
    mode = stage_mode(stage, impl)
    if mode == "tir" and impl != "tir":
        operands = _bias_add_operands(stage)
        if operands is not None:
            return relax.op.add(*(_view(bb, values[t.name], t.shape) for t in operands))
    if mode == "tir":
        return _emit_tir(bb, stage, values, f"{name}_{stage.kind}_{k}")
    return _emit_library(bb, stage, mode, values)


def _bias_add_operands(stage: Stage):
    """``(Y, B)`` when ``stage`` is a bias add of the inter-expression merge
    (``L<x> { Y[x] + B[x_last] }``, same dtype): emitted as ``R.add``, whose broadcasting is
    exactly that, so that TVM's ``FuseOps`` and the epilogue fusion of library kernels
    (:mod:`.epilogue`) see a bias add. None for any other eOperator."""
    expr, body = stage.expr, stage.expr.body
    if stage.label != "bias-add" or expr.reduce or not isinstance(body, BinOp) or \
            body.op != "+" or not isinstance(body.a, Access) or not isinstance(body.b, Access):
        return None
    y, b = body.a, body.b
    loops = tuple(iv.var for iv in expr.loops)
    if not (isinstance(y.source, Tensor) and isinstance(b.source, Tensor)) or \
            tuple(y.indices) != loops or tuple(b.indices) != loops[-1:] or \
            any(lo or hi for t in (y.source, b.source) for lo, hi in t.pad) or \
            any(iv.begin for iv in expr.loops) or \
            {y.source.dtype, b.source.dtype} != {expr.dtype}:
        return None
    return y.source, b.source
