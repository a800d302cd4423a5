"""Native library kernels as Relax: which operators they serve, and their ``call_dps_packed``.

The native library (:mod:`tvm_ollie.native`, oneDNN/OpenBLAS on CPUs) registers tvm-ffi globals
in destination-passing style (the CUDA library, :mod:`tvm_ollie.native_cuda`, registers
``tvm_ollie.cuda.matmul`` and ``tvm_ollie.cuda.conv2d`` with the same arguments). Their first
argument is a ``key=value;...`` attribute string, then the operands, then (appended by the Relax
VM) the output:

* ``tvm_ollie.cpu.matmul(attrs, A, B, [bias], [residual], Out)`` with ``ta``/``tb`` transposes;
* ``tvm_ollie.cpu.conv2d(attrs, data, weight, [bias], [residual], Out)``;
* ``tvm_ollie.cpu.conv2d_transpose(attrs, data, weight, [bias], [residual], Out)`` (NCHW data,
  IOHW weight, Relax's ``nn.conv2d_transpose`` with ``opad`` its output padding);
* ``tvm_ollie.cpu.instance_norm(attrs, X, [scale], [bias], [residual], Out)``, instance
  normalization of each ``(n, c)`` plane of ``X`` with its per-channel affine
  (:mod:`tvm_ollie.transform.norm_kernels`);
* ``tvm_ollie.cpu.resize2d(attrs, X_1, .., X_k, Out)``, bilinear or nearest resizes of each
  ``X_i`` written into its channel slice of ``Out`` (:mod:`tvm_ollie.transform.resize_kernel`);
* ``tvm_ollie.cpu.g2bmm(attrs, A, B, Out)`` and ``tvm_ollie.cpu.gbmm(attrs, A, B, Out)``, the
  banded matmuls of the ``g2bmm``/``gbmm`` target operators (``width=W;dil=D``), which run
  matched program stages only.

The first four compute ``Out = act(op + bias + residual)``; the epilogue keys (``bias``,
``res``, ``act``) are added by :mod:`tvm_ollie.transform.epilogue` when it folds consumers into
the call (:data:`EPILOGUE_KERNELS`; the banded kernels have no epilogue).

A :class:`LibCall` is a kernel name plus its attributes; :func:`call_form` gives the one that
replaces an original Relax call, :func:`stage_form` the one that runs a matched program stage.
Both return ``None`` when the library does not implement that case (the rule of thumb of
TVM's rules: no form, no rewrite). They give the kernels of the device selected by
:func:`kernel_device` (the pass selects its target's): on ``"cuda"`` the CUDA kernels, when
they can run here (the library, cuBLAS/cuDNN and a device: :func:`tvm_ollie.native_cuda.
kernel_error`), for matmuls and for convolutions in NCHW/OIHW or NHWC/OHWI with symmetric
padding (cuDNN's cases); no transposed convolution or banded matmul on CUDA.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace
from typing import Dict, Iterator, Optional, Sequence, Tuple

from .. import native, native_cuda
from ..compat import relax, tvm
from ..derive.targets import target_op
from ..target import target_kind

__all__ = ["BAND_KERNELS", "CONV2D", "CONV2D_INT8", "CONV2D_TRANSPOSE", "CUDA_CONV2D",
           "CUDA_MATMUL", "EPILOGUE_KERNELS", "G2BMM", "GBMM", "INSTANCE_NORM", "KERNELS",
           "MATMUL", "MATMUL_INT8", "RESIZE2D", "SOFTMAX", "LibCall", "band_call", "call_form",
           "conv2d_int8_call", "conv2d_transpose_call", "current_device", "device_of",
           "emit_call", "kernel_device", "matmul_int8_call", "parse_attrs", "stage_form"]

MATMUL = "tvm_ollie.cpu.matmul"
CONV2D = "tvm_ollie.cpu.conv2d"
CONV2D_TRANSPOSE = "tvm_ollie.cpu.conv2d_transpose"
G2BMM = "tvm_ollie.cpu.g2bmm"
GBMM = "tvm_ollie.cpu.gbmm"
CUDA_MATMUL = "tvm_ollie.cuda.matmul"
CUDA_CONV2D = "tvm_ollie.cuda.conv2d"
#: The 8-bit integer kernels (u8/s8 data, s8 weights, int32 out here): the integer convolutions
#: and matmuls of quantized ONNX models (:mod:`tvm_ollie.transform.int8_kernels`).
CONV2D_INT8 = "tvm_ollie.cpu.conv2d_int8"
MATMUL_INT8 = "tvm_ollie.cpu.matmul_int8"
#: Instance normalization with its affine (:mod:`tvm_ollie.transform.norm_kernels`):
#: ``tvm_ollie.cpu.instance_norm(attrs, X, [scale], [bias], [residual], Out)``.
INSTANCE_NORM = "tvm_ollie.cpu.instance_norm"
#: Softmax over the last axis (:mod:`tvm_ollie.transform.softmax_kernel`):
#: ``tvm_ollie.cpu.softmax(X, Out)``, no attributes and no epilogue.
SOFTMAX = "tvm_ollie.cpu.softmax"
#: Bilinear/nearest 2-D resizes written into the channel slices of one output (a concatenation
#: of resizes; :mod:`tvm_ollie.transform.resize_kernel`):
#: ``tvm_ollie.cpu.resize2d(attrs, X_1, .., X_k, Out)``, no epilogue.
RESIZE2D = "tvm_ollie.cpu.resize2d"
#: The kernels that take the ``bias``/``res``/``act`` epilogue keys.
EPILOGUE_KERNELS = (MATMUL, CONV2D, CONV2D_TRANSPOSE, CUDA_MATMUL, CUDA_CONV2D, INSTANCE_NORM)
#: The banded matmul kernels, by target operator name.
BAND_KERNELS = {"g2bmm": G2BMM, "gbmm": GBMM}
#: Every kernel :func:`emit_call` emits (what :func:`lib_call_of` recognizes).
KERNELS = EPILOGUE_KERNELS + tuple(BAND_KERNELS.values())

#: Data/kernel layout pairs the conv2d kernel takes (the output is in the data layout).
CONV_LAYOUTS = (("NCHW", "OIHW"), ("NHWC", "HWIO"), ("NHWC", "OHWI"))
#: The pairs cuDNN's filter formats take (HWIO has none).
CUDA_CONV_LAYOUTS = (("NCHW", "OIHW"), ("NHWC", "OHWI"))
#: The CUDA kernel of each CPU kernel that has one.
_CUDA_NAME = {MATMUL: CUDA_MATMUL, CONV2D: CUDA_CONV2D}

_DEVICE: "contextvars.ContextVar[str]" = contextvars.ContextVar("tvm_ollie_kernel_device",
                                                                default="cpu")


@contextlib.contextmanager
def kernel_device(device: str) -> Iterator[None]:
    """Within the block, :func:`call_form`/:func:`stage_form` give the kernels of ``device``
    (``"cpu"`` or ``"cuda"``): the pass opens it for its target (:func:`device_of`)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"kernel device must be 'cpu' or 'cuda', got {device!r}")
    token = _DEVICE.set(device)
    try:
        yield
    finally:
        _DEVICE.reset(token)


def current_device() -> str:
    """The device of the library kernels offered now (``"cpu"`` unless :func:`kernel_device`)."""
    return _DEVICE.get()


def device_of(target) -> str:
    """``"cuda"`` for GPU targets, ``"cpu"`` otherwise."""
    return "cuda" if target_kind(target) == "cuda" else "cpu"


def _cuda_runs(func: str) -> bool:
    """Whether the CUDA kernel ``func`` can run here (library, vendor library, device)."""

    return not native_cuda.kernel_error(func)


def _on_device(call: "LibCall") -> Optional["LibCall"]:
    """``call`` (a CPU kernel) on the current device: itself on the CPU; on CUDA its CUDA
    kernel when there is one that runs here, else None."""
    if current_device() == "cpu":
        return call
    name = _CUDA_NAME.get(call.func)
    if name is None or not _cuda_runs(name):
        return None
    return replace(call, func=name)


@dataclass(frozen=True)
class LibCall:
    """A native kernel and its attributes (``attrs`` in the order they are written)."""

    func: str
    attrs: Tuple[Tuple[str, str], ...]

    @property
    def kind(self) -> str:
        """``"matmul"``, ``"conv2d"``, ``"conv2d_transpose"``, ``"instance_norm"``, ``"g2bmm"``
        or ``"gbmm"``."""
        return self.func.rsplit(".", 1)[-1]

    def text(self) -> str:
        """The attribute string the kernel parses."""
        return ";".join(f"{k}={v}" for k, v in self.attrs)

    def get(self, key: str, default: str = "") -> str:
        """An attribute's value (``default`` when absent)."""
        return dict(self.attrs).get(key, default)

    def with_attrs(self, **updates: str) -> "LibCall":
        """The same kernel with ``updates`` set (existing keys keep their position)."""
        items = dict(self.attrs)
        items.update({k: str(v) for k, v in updates.items()})
        return LibCall(self.func, tuple(items.items()))


def parse_attrs(text: str) -> Dict[str, str]:
    """``"a=1;b=x"`` -> ``{"a": "1", "b": "x"}``."""
    out: Dict[str, str] = {}
    for item in filter(None, text.split(";")):
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _ints(values) -> str:
    return ",".join(str(int(v)) for v in values)


def matmul_call(ta: bool = False, tb: bool = False) -> LibCall:
    """The matmul kernel with the given transposes."""
    return LibCall(MATMUL, (("ta", str(int(bool(ta)))), ("tb", str(int(bool(tb))))))


def conv2d_call(stride, padding, dilation, groups: int, layout: str, klayout: str) -> LibCall:
    """The conv2d kernel (``padding`` as top, left, bottom, right)."""
    return LibCall(CONV2D, (("layout", layout), ("klayout", klayout), ("stride", _ints(stride)),
                            ("pad", _ints(padding)), ("dil", _ints(dilation)),
                            ("groups", str(int(groups)))))


def conv2d_transpose_call(stride, padding, output_padding, dilation, groups: int) -> LibCall:
    """The conv2d_transpose kernel, NCHW data and IOHW weight (``padding`` as top, left, bottom,
    right; ``output_padding`` the extra rows/columns at the bottom/right)."""
    return LibCall(CONV2D_TRANSPOSE, (("layout", "NCHW"), ("klayout", "IOHW"),
                                      ("stride", _ints(stride)), ("pad", _ints(padding)),
                                      ("opad", _ints(output_padding)), ("dil", _ints(dilation)),
                                      ("groups", str(int(groups)))))


def conv2d_int8_call(stride, padding, dilation, groups: int, xzp: bool,
                     requant: Optional[str] = None) -> LibCall:
    """The int8 conv2d kernel, NCHW data and OIHW weight (``padding`` as top, left, bottom,
    right; ``xzp``: the source zero point is an operand; ``requant``: see
    :func:`_requant_attrs`)."""
    return LibCall(CONV2D_INT8, (("stride", _ints(stride)), ("pad", _ints(padding)),
                                 ("dil", _ints(dilation)), ("groups", str(int(groups))),
                                 ("xzp", str(int(bool(xzp))))) + _requant_attrs(requant))


def matmul_int8_call(xzp: bool, requant: Optional[str] = None) -> LibCall:
    """The int8 matmul kernel, ``B`` as ``[K, N]`` (``xzp``: the source zero point is an
    operand; ``requant``: see :func:`_requant_attrs`)."""
    return LibCall(MATMUL_INT8, (("xzp", str(int(bool(xzp)))),) + _requant_attrs(requant))


def _requant_attrs(requant: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    """The attributes of ONNX's requantization inside the int8 kernel: ``requant`` is the
    scale's kind (``"tensor"`` or ``"channel"``); the operands after the zero point are then
    the float32 scale, the float32 (integer-valued) bias and the int32 output zero point, and
    ``Out = saturate(round_half_even(float(acc + bias) * scale) + yzp)``. None: an int32
    accumulator, no operands."""
    if requant is None:
        return ()
    return (("scale", requant), ("bias", "1"), ("yzp", "1"), ("rq", "1"))


def band_call(kind: str, width: int, dilation: int) -> LibCall:
    """The banded matmul kernel of target operator ``kind`` (``"g2bmm"`` or ``"gbmm"``):
    ``g2bmm: out[b, i, j] = Σ_k A[b, i, k] * B[b, i + D*(j - W), k]``,
    ``gbmm: out[b, i, n] = Σ_j A[b, i, j] * B[b, i + D*(j - W), n]``, ``j`` in ``[0, 2W]``."""
    return LibCall(BAND_KERNELS[kind], (("width", str(int(width))), ("dil", str(int(dilation)))))


def _f32(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "float32" and ty.shape is not None


def _ndim(expr) -> int:
    return len(expr.ty.shape)


def _out_dtype_ok(attrs) -> bool:
    dtype = str(getattr(attrs, "out_dtype", "") or "")
    return dtype in ("", "void", "float32")


def call_form(call: "relax.Call") -> Optional[LibCall]:
    """The native kernel that computes the Relax ``call`` exactly, or None."""
    if not isinstance(call.op, tvm.ir.Op) or not all(_f32(a) for a in call.args[:2]):
        return None
    if not _f32(call):
        return None
    name = call.op.name
    if name == "relax.matmul":
        a, b = call.args[:2]
        if _ndim(a) < 2 or _ndim(b) < 2 or not _out_dtype_ok(call.attrs):
            return None
        return _on_device(matmul_call())
    if name == "relax.nn.conv2d":
        at = call.attrs
        layout, klayout = str(at.data_layout), str(at.kernel_layout)
        if (str(at.out_layout) or layout) != layout or not _out_dtype_ok(at):
            return None
        return _conv2d_form([int(s) for s in at.strides], [int(p) for p in at.padding],
                            [int(d) for d in at.dilation], int(at.groups), layout, klayout)
    if name == "relax.nn.conv2d_transpose" and current_device() == "cpu":
        return _conv2d_transpose_form(call.attrs)
    return None


def _conv2d_form(stride, padding, dilation, groups: int, layout: str,
                 klayout: str) -> Optional[LibCall]:
    """The conv2d kernel of the current device, when it takes these layouts and padding."""
    if (layout, klayout) not in CONV_LAYOUTS:
        return None
    if current_device() == "cuda":
        symmetric = padding[0] == padding[2] and padding[1] == padding[3]
        if (layout, klayout) not in CUDA_CONV_LAYOUTS or not symmetric:
            return None
    return _on_device(conv2d_call(stride, padding, dilation, groups, layout, klayout))


def _conv2d_transpose_form(at) -> Optional[LibCall]:
    """The kernel of a Relax ``nn.conv2d_transpose`` with attributes ``at``: NCHW/IOHW, output in
    the data layout, output padding below the stride (Relax checks it too; the kernel needs it),
    and a library that has the kernel (an older build lacks it)."""

    layout = str(at.data_layout)
    if (layout, str(at.kernel_layout)) != ("NCHW", "IOHW") or not _out_dtype_ok(at):
        return None
    if (str(at.out_layout) or layout) != layout:
        return None
    strides = [int(s) for s in at.strides]
    opad = [int(p) for p in at.output_padding]
    if any(not 0 <= p < s for p, s in zip(opad, strides)):
        return None
    if not native.provides(CONV2D_TRANSPOSE):
        return None
    return conv2d_transpose_call(strides, [int(p) for p in at.padding], opad,
                                 [int(d) for d in at.dilation], int(at.groups))


def stage_form(stage) -> Optional[LibCall]:
    """The native kernel of a matched program stage (:class:`~tvm_ollie.derive.program.Stage`)."""
    if not stage.is_operator:
        return None  # an eOperator: no library kernel
    at = stage.attrs
    family = target_op(stage.kind).library
    if family == "matmul":
        return _on_device(matmul_call(bool(at.get("transpose_a")), bool(at.get("transpose_b"))))
    if family == "conv2d":
        layout, klayout = at.get("data_layout"), at.get("kernel_layout")
        if at.get("out_layout", layout) != layout:
            return None
        return _conv2d_form(at["stride"], at["padding"], at["dilation"], at.get("groups", 1),
                            layout, klayout)
    if family in BAND_KERNELS and current_device() == "cpu":
        return _band_form(family, at)
    return None


def _band_form(kind: str, at) -> Optional[LibCall]:
    """The banded kernel of a g2bmm/gbmm stage, when the loaded library has it (a library built
    before these kernels degrades to the stage's TE kernel)."""

    if not native.provides(BAND_KERNELS[kind]):
        return None
    return band_call(kind, at["width"], at["dilation"])


def emit_call(lib: LibCall, operands: Sequence["relax.Expr"], out_shape: Sequence[int],
              dtype: str = "float32") -> "relax.Call":
    """``R.call_dps_packed(lib.func, (attrs, *operands), out)``: not yet bound."""
    args = [tvm.ir.StringImm(lib.text())] + list(operands)
    out_ty = relax.TensorType(tuple(int(s) for s in out_shape), dtype)
    return relax.call_dps_packed(lib.func, args, out_ty)


def lib_call_of(expr) -> Optional[Tuple[LibCall, list]]:
    """``(LibCall, operands)`` when ``expr`` is a call emitted by :func:`emit_call`, else None."""
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    if expr.op.name != "relax.call_dps_packed":
        return None
    func, args = expr.args[0], expr.args[1]
    name = str(getattr(func, "global_symbol", "") or "")
    if name not in KERNELS or not isinstance(args, relax.Tuple) or not args.fields:
        return None
    head = args.fields[0]
    if not isinstance(head, tvm.ir.StringImm):
        return None
    attrs = tuple(parse_attrs(str(head.value)).items())
    return LibCall(name, attrs), list(args.fields[1:])
