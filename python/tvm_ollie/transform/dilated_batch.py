"""Dilated convolutions as dense ones over the interleaved sub-grids (space-to-batch).

Rule ``dilated-to-batch``: a stride-1 convolution with dilation ``(dh, dw)`` reads, for an
output row ``oh = dh*a + r``, only the input rows ``dh*(a + kh - pt/dh) + r``: the rows of
residue ``r`` modulo ``dh``. With ``H`` and the padding multiples of the dilation, splitting
``H = h*dh + r`` (``W`` likewise) turns it into a plain convolution over the ``dh*dw``
sub-grids as a batch::

    conv_d(X, K, pad=p)[n, o, dh*a + r, dw*b + s]
        = conv_1(S(X), K, pad=p/d)[(r*dw + s)*N + n, o, a, b]
    S(X)[(r*dw + s)*N + n, c, i, j] = X[n, c, dh*i + r, dw*j + s]        (space-to-batch)

and the output comes back by the inverse permutation (batch-to-space). Operators that do not
mix positions commute with ``S``: elementwise ones whose other operand is per channel or a
scalar, 1x1 unpadded convolutions, and further dilated convolutions with the same dilation;
a chain of them (CSRNet's six dilated convolutions with their bias, ReLU and the 1x1 output)
then runs on the sub-grids between one space-to-batch and one batch-to-space. Whether the
sub-grid form is faster than the library's dilated kernel is measured, not assumed
(docs/layouts.md, "Dilated convolutions").

The rule applies only where it is exact without any padding of its own (stride 1, ``NCHW`` /
``OIHW``, spatial sizes and paddings multiples of the dilation); elsewhere it leaves the module
as it was.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..compat import relax, tvm
from .epilogue import static_shape

__all__ = ["RULE", "dilated_to_batch", "space_to_batch", "batch_to_space"]

#: The rule's name in reports.
RULE = "dilated-to-batch"

#: Unary operators that act on each element alone: they commute with the sub-grid permutation.
_UNARY = frozenset({"relax.nn.relu", "relax.sigmoid", "relax.tanh", "relax.nn.silu",
                    "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.clip", "relax.nn.leakyrelu"})

#: Binary elementwise operators; they commute when the other operand is per channel or scalar.
_BINARY = frozenset({"relax.add", "relax.multiply", "relax.subtract", "relax.divide",
                     "relax.maximum", "relax.minimum"})

_Grid = Tuple[int, int]


def space_to_batch(x: relax.Expr, grid: _Grid) -> relax.Expr:
    """``S(X)[(r*dw + s)*N + n, c, i, j] = X[n, c, dh*i + r, dw*j + s]``."""
    n, c, h, w = static_shape(x)
    dh, dw = grid
    split = relax.op.reshape(x, (n, c, h // dh, dh, w // dw, dw))
    moved = relax.op.permute_dims(split, [3, 5, 0, 1, 2, 4])
    return relax.op.reshape(moved, (dh * dw * n, c, h // dh, w // dw))


def batch_to_space(y: relax.Expr, grid: _Grid, batch: int) -> relax.Expr:
    """The inverse of :func:`space_to_batch` for a tensor of ``batch`` images."""
    _, c, h, w = static_shape(y)
    dh, dw = grid
    split = relax.op.reshape(y, (dh, dw, batch, c, h, w))
    moved = relax.op.permute_dims(split, [2, 3, 4, 0, 5, 1])
    return relax.op.reshape(moved, (batch, c, h * dh, w * dw))


def _conv_fits(call: relax.Call) -> bool:
    """Guard: a stride-1 ``NCHW``/``OIHW`` convolution with static shapes."""
    at = call.attrs
    return (tuple(int(s) for s in at.strides) == (1, 1) and at.data_layout == "NCHW"
            and at.kernel_layout == "OIHW" and at.out_layout == "NCHW"
            and all(static_shape(a) is not None for a in call.args[:2]))


def _grid_aligned(call: relax.Call, grid: _Grid) -> bool:
    """Guard: spatial sizes and paddings multiples of the dilation ``grid``."""
    _, _, h, w = static_shape(call.args[0])
    pt, pl, pb, pr = (int(p) for p in call.attrs.padding)
    dh, dw = grid
    return all(v % dh == 0 for v in (h, pt, pb)) and all(v % dw == 0 for v in (w, pl, pr))


def _pointwise(call: relax.Call) -> bool:
    """Guard: a 1x1 unpadded convolution (mixes channels only)."""
    _, _, kh, kw = static_shape(call.args[1])
    return (kh, kw) == (1, 1) and all(int(p) == 0 for p in call.attrs.padding)


def _per_channel(expr: relax.Expr) -> bool:
    """Guard: an operand that broadcasts over batch and positions (per channel or scalar)."""
    shape = static_shape(expr)
    if shape is None:
        return False
    return len(shape) == 0 or (len(shape) == 4 and shape[0] == shape[2] == shape[3] == 1)


@relax.expr_functor.mutator
class _SubGrids(relax.PyExprMutator):
    """Rewrites dilated convolutions and what commutes with them onto the sub-grids; every
    rewritten value keeps its original variable, bound to its batch-to-space (removed by dead
    code elimination where nothing else reads it)."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        #: original variable -> (its value on the sub-grids, the grid, the batch)
        self.grids: Dict[relax.Var, Tuple[relax.Var, _Grid, int]] = {}
        self.rewritten = 0

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        value = binding.value
        found = self._on_grid(value) if isinstance(value, relax.Call) else None
        if found is None:
            super().visit_var_binding_(binding)
            return
        expr, grid, batch = found
        gvar = self.builder_.emit(expr)
        back = batch_to_space(gvar, grid, batch)
        if isinstance(binding.var, relax.DataflowVar):
            new = self.builder_.emit(back, binding.var.name)
        else:
            new = self.builder_.emit_output(back, binding.var.name)
        self.set_var_remap(binding.var, new)
        self.grids[binding.var] = (gvar, grid, batch)

    def _grid_of(self, expr) -> Optional[Tuple[relax.Var, _Grid, int]]:
        return self.grids.get(expr) if isinstance(expr, relax.Var) else None

    def _on_grid(self, call: relax.Call):
        """``(expr on the sub-grids, grid, batch)`` for ``call``, or None to keep it."""
        name = getattr(call.op, "name", "")
        if name == "relax.nn.conv2d":
            return self._conv(call)
        if name in _UNARY:
            held = self._grid_of(call.args[0])
            return None if held is None else \
                (relax.Call(call.op, [held[0]] + list(call.args[1:]), call.attrs), *held[1:])
        if name in _BINARY:
            return self._binary(call)
        return None

    def _binary(self, call: relax.Call):
        a, b = (self._grid_of(x) for x in call.args[:2])
        if a is not None and b is not None:
            if a[1:] != b[1:]:
                return None
            return relax.Call(call.op, [a[0], b[0]], call.attrs), *a[1:]
        held, other, first = (a, call.args[1], True) if a is not None else \
            (b, call.args[0], False)
        if held is None or not _per_channel(other):
            return None
        args = [held[0], self.visit_expr(other)] if first else [self.visit_expr(other), held[0]]
        return relax.Call(call.op, args, call.attrs), *held[1:]

    def _conv(self, call: relax.Call):
        if not _conv_fits(call):
            return None
        grid = tuple(int(d) for d in call.attrs.dilation)
        held = self._grid_of(call.args[0])
        if held is not None and grid == (1, 1) and _pointwise(call):
            grid, data = held[1], held[0]
        elif grid == (1, 1) or not _grid_aligned(call, grid):
            return None
        elif held is not None and held[1] == grid:
            data = held[0]
        else:
            data = self.builder_.emit(space_to_batch(self.visit_expr(call.args[0]), grid))
        batch = static_shape(call.args[0])[0]
        pt, pl, pb, pr = (int(p) for p in call.attrs.padding)
        dh, dw = grid
        self.rewritten += 1
        conv = relax.op.nn.conv2d(data, self.visit_expr(call.args[1]), strides=(1, 1),
                                  padding=(pt // dh, pl // dw, pb // dh, pr // dw),
                                  dilation=(1, 1), groups=int(call.attrs.groups),
                                  data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW",
                                  out_dtype=call.attrs.out_dtype)
        return conv, grid, batch


def dilated_to_batch(mod: tvm.IRModule) -> Tuple[tvm.IRModule, int]:
    """Apply :data:`RULE` to every Relax function of ``mod``.

    Returns
    -------
    mod : IRModule
        The rewritten module (``mod`` itself when no dilated convolution fits).
    count : int
        How many convolutions now run on sub-grids (0: nothing changed).
    """
    mutator = _SubGrids(mod)
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    if mutator.rewritten == 0:
        return mod, 0
    out = mutator.builder_.get()
    return relax.transform.DeadCodeElimination()(out), mutator.rewritten
