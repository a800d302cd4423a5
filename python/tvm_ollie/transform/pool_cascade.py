"""Stride-1 "same" max pools of one input computed from each other (rule ``pool_cascade``).

Spatial pyramid pooling (YOLOX, YOLOv3-SPP...) applies max pools of kernels ``5, 9, 13`` with
stride 1 and padding ``k // 2`` to the same tensor. A max pool never reads its padding, so
along one axis the output at ``h`` is the maximum over the window ``[h - a, h + a]`` clipped to
the input, ``a = k // 2``. Two such pools compose into a third::

    pool_{2b+1}(pool_{2a+1}(x))[h] = max_{h' in [h-b, h+b] ∩ I} max_{[h'-a, h'+a] ∩ I} x
                                   = max_{[h-a-b, h+a+b] ∩ I} x = pool_{2(a+b)+1}(x)[h]

(the clipped windows of consecutive ``h'`` overlap, so their union is one clipped window).
Hence a pool of kernel ``k`` is ``pool_{k - k0 + 1}`` of an earlier pool of kernel ``k0 <= k``
of the same input, per axis, and SPP's 5, 9, 13 read ``25 + 25 + 25`` elements per output
instead of ``25 + 81 + 169`` (YOLOv5's SPPF is this identity written by hand). The rule takes
the largest earlier pool of the same input in the block (by kernel on both axes); an equal
kernel is that pool itself. Guards: ``max_pool2d``, stride 1, dilation 1, odd kernels, padding
``k // 2`` on every side, ``ceil_mode`` off (the output has the input's spatial shape), static
shapes; any layout.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..compat import mutate_functions, relax, tvm

__all__ = ["pool_cascade", "same_pool_kernel"]


def same_pool_kernel(call) -> Optional[Tuple[int, int]]:
    """``(kh, kw)`` when ``call`` is a stride-1 max pool with padding ``k // 2`` on every side
    and odd kernels (module docstring), else None."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) \
            or call.op.name != "relax.nn.max_pool2d":
        return None
    at = call.attrs
    kernel = tuple(int(k) for k in at.pool_size)
    pads = tuple(int(p) for p in at.padding)
    if len(kernel) != 2 or len(pads) != 4 or bool(at.ceil_mode) \
            or str(at.out_layout) not in ("", str(at.layout)):
        return None
    if any(int(s) != 1 for s in at.strides) or any(int(d) != 1 for d in at.dilation):
        return None
    if any(k % 2 == 0 for k in kernel) or pads != (kernel[0] // 2, kernel[1] // 2,
                                                   kernel[0] // 2, kernel[1] // 2):
        return None
    return kernel


@relax.expr_functor.mutator
class _PoolCascade(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.count = 0
        self.pools: Dict[object, List[Tuple[Tuple[int, int], object]]] = {}

    def _emit(self, binding, value):
        if self.builder_.current_block_is_dataflow() \
                and not isinstance(binding.var, relax.DataflowVar):
            return self.builder_.emit_output(value, name_hint=binding.var.name)
        return self.builder_.emit(value, name_hint=binding.var.name)

    def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
        call = binding.value
        kernel = same_pool_kernel(call)
        if kernel is None:
            super().visit_var_binding_(binding)
            return
        data = self.visit_expr(call.args[0])
        earlier = [(k, v) for k, v in self.pools.get(data, [])
                   if k[0] <= kernel[0] and k[1] <= kernel[1]]
        if not earlier:
            super().visit_var_binding_(binding)
            self.pools.setdefault(data, []).append((kernel, self._last(binding)))
            return
        k0, source = max(earlier, key=lambda kv: kv[0][0] * kv[0][1])
        step = (kernel[0] - k0[0] + 1, kernel[1] - k0[1] + 1)
        at = call.attrs
        value = source if step == (1, 1) else relax.op.nn.max_pool2d(
            source, step, 1, (step[0] // 2, step[1] // 2, step[0] // 2, step[1] // 2), 1,
            False, layout=str(at.layout), out_layout=str(at.out_layout) or str(at.layout))
        new = self._emit(binding, value)
        self.set_var_remap(binding.var, new)
        self.pools.setdefault(data, []).append((kernel, new))
        self.count += 1

    def _last(self, binding):
        """The variable the builder bound ``binding``'s pool to (its remap, or itself)."""
        return self.visit_expr(binding.var)

    def visit_binding_block_(self, block):  # pylint: disable=arguments-renamed
        self.pools = {}  # pools are chained within their block only
        return super().visit_binding_block_(block)

    def visit_dataflow_block_(self, block):  # pylint: disable=arguments-renamed
        self.pools = {}
        return super().visit_dataflow_block_(block)


def pool_cascade(mod: "tvm.IRModule") -> Tuple["tvm.IRModule", int]:
    """``mod`` with every stride-1 "same" max pool computed from the largest earlier pool of
    the same input (module docstring), and how many pools were rewritten."""
    mutator = _PoolCascade(mod)
    out = mutate_functions(mutator, mod)
    return (out, mutator.count) if mutator.count else (mod, 0)
