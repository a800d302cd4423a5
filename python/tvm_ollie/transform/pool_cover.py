"""Pools whose every window covers the whole input, computed as one reduction.

A max pool with padding never reads its padding (the padding value is the identity of
``max``), so each output is the maximum over its window *clipped to the input*. When every
clipped window is the whole spatial extent of the input, every output of a channel is the
same number, the channel's maximum, and the pool is a global reduction broadcast back::

    max_pool2d(x, k, s, p)[n, c, o_h, o_w] = max_{h, w} x[n, c, h, w]     (rule pool_covers_input)
    avg_pool2d(x, k, s, p, count_include_pad=False)[n, c, o_h, o_w] = mean_{h, w} x[n, c, h, w]

It holds along one spatial axis of input size ``I``, kernel ``k``, stride ``s``, dilation 1,
leading padding ``p`` and ``O`` outputs exactly when the first window reaches the last input
element and the last window starts at or before the first one::

    k - 1 - p >= I - 1      and      (O - 1) * s <= p

(windows move right monotonically, so the first one ends earliest and the last one starts
latest). Spatial pyramid pooling (YOLOX's SPP: 5x5, 9x9 and 13x13 stride-1 pools with "same"
padding) on a small feature map is the usual case: at YOLOX quick's 2x2 map each 13x13 pool
scanned 169 positions of a padded 14x14 copy per output, where the reduction reads the 4
elements once. ``count_include_pad=True`` divides by the window size, padding included, and is
left alone; so are a dilated pool (its window has holes) and an integer average.

The pass works on any layout the pool names (``NCHW``, ``NHWC``, after
:mod:`.blocked_layout` too) and shares one reduction between the pools of one input that
reduce the same way (the three pools of an SPP block become one ``max``).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..compat import mutate_functions, relax, tvm

__all__ = ["POOL_OPS", "covers_input", "pool_cover", "pool_reduction"]

#: The pools the rule rewrites, and the reduction each becomes.
POOL_OPS = {"relax.nn.max_pool2d": "max", "relax.nn.avg_pool2d": "mean"}


def _static(shape) -> Optional[Tuple[int, ...]]:
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


def covers_input(size: int, kernel: int, stride: int, dilation: int, pad_lo: int,
                 outputs: int) -> bool:
    """Whether every window along one axis, clipped to the input, is the whole input
    (module docstring: ``k - 1 - p >= I - 1`` and ``(O - 1) * s <= p``, dilation 1)."""
    return dilation == 1 and outputs >= 1 and kernel - 1 - pad_lo >= size - 1 \
        and (outputs - 1) * stride <= pad_lo


def pool_reduction(call) -> Optional[Tuple[str, Tuple[int, int]]]:
    """``(reduction, spatial axes)`` when ``call`` is a pool whose every window covers its
    whole input (rule ``pool_covers_input``), else None."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) \
            or call.op.name not in POOL_OPS:
        return None
    at = call.attrs
    if call.op.name == "relax.nn.avg_pool2d" and bool(at.count_include_pad):
        return None
    layout = str(at.layout)
    if str(at.out_layout) not in ("", layout) or sorted(layout) != sorted("NCHW"):
        return None
    data_t, out_t = call.args[0].ty, call.ty
    if not isinstance(data_t, relax.TensorType) or not isinstance(out_t, relax.TensorType) \
            or data_t.shape is None or out_t.shape is None:
        return None
    if call.op.name == "relax.nn.avg_pool2d" and not str(data_t.dtype).startswith(
            ("float", "bfloat")):
        return None  # an integer average rounds per window: keep TVM's
    shape, out = _static(data_t.shape), _static(out_t.shape)
    if shape is None or out is None or len(shape) != 4:
        return None
    axes = (layout.index("H"), layout.index("W"))
    for i, ax in enumerate(axes):
        if not covers_input(shape[ax], int(at.pool_size[i]), int(at.strides[i]),
                            int(at.dilation[i]), int(at.padding[i]), out[ax]):
            return None
    return POOL_OPS[call.op.name], axes


@relax.expr_functor.mutator
class _PoolCover(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.count = 0
        self.shared: Dict[Tuple[object, str, Tuple[int, int]], object] = {}

    def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
        call = binding.value
        found = pool_reduction(call)
        if found is None:
            super().visit_var_binding_(binding)
            return
        kind, axes = found
        data = self.visit_expr(call.args[0])
        key = (data, kind, axes)
        if key not in self.shared:
            reduce = relax.op.max if kind == "max" else relax.op.mean
            self.shared[key] = self.builder_.emit(reduce(data, axis=list(axes), keepdims=True),
                                                  name_hint=f"{binding.var.name}_{kind}")
        value = relax.op.broadcast_to(self.shared[key], call.ty.shape)
        if self.builder_.current_block_is_dataflow() \
                and not isinstance(binding.var, relax.DataflowVar):
            new = self.builder_.emit_output(value, name_hint=binding.var.name)
        else:
            new = self.builder_.emit(value, name_hint=binding.var.name)
        self.set_var_remap(binding.var, new)
        self.count += 1

    def visit_binding_block_(self, block):  # pylint: disable=arguments-renamed
        self.shared = {}  # a reduction is shared within its block only
        return super().visit_binding_block_(block)

    def visit_dataflow_block_(self, block):  # pylint: disable=arguments-renamed
        self.shared = {}
        return super().visit_dataflow_block_(block)


def pool_cover(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", int]:
    """``mod`` with every pool whose windows each cover the whole input written as one
    reduction broadcast back (module docstring), and how many pools were rewritten."""
    mutator = _PoolCover(mod)
    out = mutate_functions(mutator, mod)
    return (out, mutator.count) if mutator.count else (mod, 0)
