"""Numpy reference interpreter: the oracle that every rewrite, lowering and test is checked against.

The interpreter is vectorized. Inside one scope every subexpression is an array with one axis per
iterator of the scope (loops first, then reductions) whose extent is 1 on the iterators the
subexpression does not use, so numpy broadcasting does the iteration and each tensor read costs
only the size of its own index space. Affine reads become zero-copy strided views of the (padded)
source; other reads (``//``, ``%``, clamps) are gathers.

A sum reduction is split into terms (``+``, ``-``) and each term into factors (``*``); the factors
are contracted with ``np.einsum`` over the iterator axes, so a convolution becomes one GEMM
instead of a materialized ``n*h*w*f*c*r*s`` product. Anything else is materialized and reduced.
When an operand would exceed :data:`MAX_TEMP_BYTES`, the reduction iterators are cut into chunks.
Regrouping a sum only changes float rounding, except with infinite inputs, where ``Σ (a + b)``
and ``Σ a + Σ b`` can differ (``inf - inf`` is nan in one grouping only).

Semantics follow :mod:`tvm_ollie.ir.nodes`: tensor margins read ``pad_value``, scope margins read
0, reads beyond the padded range raise :class:`OutOfBoundsError`, ``//`` and ``%`` are floor
division and modulo, and ``select(c, a, b)`` only requires the reads of the branch it takes to be
in bounds (the other branch may read anywhere, as a guarded read in TVM may).

Types: everything is computed in one float type, the widest of the inputs and of the float casts
(float16 reads summed under ``float32(...)`` casts compute in float32). A cast to a narrower float
type rounds to it (bfloat16 through ``ml_dtypes``), a cast to an integer truncates, and a
float16/bfloat16 stage is stored rounded, as TVM stores it.
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import scipy.special

from .nodes import (
    CAST_DTYPES,
    Access,
    BinOp,
    Call,
    Const,
    IterVar,
    Node,
    Scope,
    Tensor,
    Var,
    dtype_bits,
    free_vars,
    is_float_dtype,
    iter_nodes,
    numpy_dtype,
)
from .printer import to_text

__all__ = ["OutOfBoundsError", "evaluate", "random_inputs", "random_arrays", "MAX_TEMP_BYTES"]

#: Upper bound on the size of one operand materialized during a reduction; reductions whose
#: operands would be larger are evaluated in chunks of their reduction iterators.
MAX_TEMP_BYTES = 256 << 20

_COMPARE = {
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal,
}
_INT_ARITH = {"+": np.add, "-": np.subtract, "*": np.multiply}
_FLOAT_ARITH = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
    "//": np.floor_divide, "%": np.mod,
}
_UNARY = {
    "tanh": np.tanh, "sigmoid": scipy.special.expit, "exp": np.exp, "log": np.log,
    "erf": scipy.special.erf, "sqrt": np.sqrt, "abs": np.abs, "neg": np.negative,
}


class OutOfBoundsError(IndexError):
    """A read outside the padded range of a tensor or of a nested scope."""


def evaluate(
    expr: Node, inputs: Mapping[str, np.ndarray], dtype: Optional[np.dtype] = None,
    rounding: bool = True,
) -> np.ndarray:
    """Evaluate an expression on numpy inputs.

    Parameters
    ----------
    expr : Node
        A :class:`Scope` (the usual case), a :class:`Tensor`, or a closed scalar expression.
    inputs : Mapping[str, np.ndarray]
        One array per input tensor, keyed by tensor name; shapes must match the declarations.
        Extra entries are ignored.
    dtype : numpy dtype, optional
        Floating type to compute in. By default the float type of the inputs (float32 inputs give
        a float32 result); pass ``np.float64`` for precise comparisons.
    rounding : bool
        By default float casts round to their type and 16-bit stages are stored rounded, as TVM
        computes them. ``False`` evaluates in exact arithmetic of the compute type instead (float
        casts are the identity): the semantics of the finite-field check.

    Returns
    -------
    np.ndarray
        For a scope, a new array of shape ``expr.shape``: loop value ``v`` sits at position
        ``v - begin + lo`` and the padded margins are zero. A closed scalar expression gives a
        0-d array.

    Raises
    ------
    OutOfBoundsError
        When a read falls beyond the padded range of its source.
    ZeroDivisionError
        When an integer ``//`` or ``%`` divides by zero at a position whose value is used.
    ValueError
        When an input is missing or its shape differs from the declaration.
    TypeError
        When a subscript is not an integer expression.
    """
    arrays, cdtype = _prepare_inputs(expr, inputs, dtype)
    run = _Run(arrays, cdtype, rounding)
    with np.errstate(all="ignore"):
        if isinstance(expr, Scope):
            return _owned(run.scope(expr), cdtype)
        if isinstance(expr, Tensor):
            return np.array(arrays[expr.name], dtype=cdtype)
        if isinstance(expr, IterVar):
            raise TypeError("an IterVar is not an expression")
        free = free_vars(expr)
        if free:
            raise ValueError(
                f"cannot evaluate an expression with free iterators {sorted(v.name for v in free)}"
            )
        return np.array(run.float(run.eval(expr, _Domain((), ()), None)), dtype=cdtype)


def random_inputs(
    expr: Node, seed: int = 0, integer: bool = False, dtype: str = "float32"
) -> Dict[str, np.ndarray]:
    """Random arrays for every input tensor of ``expr``, in order of first appearance.

    Floats are uniform in ``[-1, 1)``; with ``integer=True`` they are integers in ``[-3, 3]``
    stored as floats, so sums of products are exact and two equivalent expressions must agree
    bit for bit (up to float64 rounding of very large values).
    """
    return random_arrays(_declared_tensors(expr).values(), seed, integer, dtype)


def random_arrays(
    tensors: Iterable[Tensor], seed: int = 0, integer: bool = False, dtype: str = "float32"
) -> Dict[str, np.ndarray]:
    """The arrays of :func:`random_inputs` for an explicit list of tensors (one per name)."""
    rng = np.random.default_rng(seed)
    out: Dict[str, np.ndarray] = {}
    for t in tensors:
        if t.name in out:
            continue
        if integer:
            out[t.name] = rng.integers(-3, 4, size=t.shape).astype(dtype)
        else:
            out[t.name] = rng.uniform(-1.0, 1.0, size=t.shape).astype(dtype)
    return out


# --------------------------------------------------------------------------------------------
# Inputs


def _declared_tensors(expr: Node) -> Dict[str, Tensor]:
    """Tensor declarations by name; the same name must always have the same shape."""
    found: Dict[str, Tensor] = {}
    for node in iter_nodes(expr):
        if isinstance(node, Tensor):
            prev = found.setdefault(node.name, node)
            if prev.shape != node.shape:
                raise ValueError(
                    f"tensor {node.name!r} is declared with two shapes: {prev.shape} and "
                    f"{node.shape}"
                )
    return found


def _prepare_inputs(
    expr: Node, inputs: Mapping[str, np.ndarray], dtype
) -> Tuple[Dict[str, np.ndarray], np.dtype]:
    tensors = _declared_tensors(expr)
    raw: Dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        if name not in inputs:
            raise ValueError(f"missing input tensor {name!r} (declared {t.dtype}{list(t.shape)})")
        arr = np.asarray(inputs[name])
        if arr.dtype.kind == "V":  # bfloat16 (ml_dtypes): numpy computes it as float32
            arr = arr.astype(np.float32)
        if arr.shape != t.shape:
            raise ValueError(
                f"input tensor {name!r} has shape {arr.shape}, but the expression declares "
                f"{t.shape}"
            )
        raw[name] = arr
    if dtype is not None:
        cdtype = np.dtype(dtype)
        if cdtype.kind != "f":
            raise TypeError(f"the interpreter computes in a floating type, not {cdtype}")
    else:
        floats = [a.dtype for a in raw.values() if a.dtype.kind == "f"]
        if not floats:
            floats = [np.dtype(t.dtype) for t in tensors.values() if t.dtype.startswith("float")]
        floats += _cast_compute_types(expr)
        cdtype = np.result_type(*floats) if floats else np.dtype(np.float32)
    return {name: a.astype(cdtype, copy=False) for name, a in raw.items()}, cdtype


def _cast_compute_types(expr: Node) -> List[np.dtype]:
    """Types that float casts in ``expr`` compute in (a cast to float32 of float16 reads makes
    the evaluation float32; bfloat16, which numpy lacks, computes as float32 and is rounded)."""
    out = set()
    for node in iter_nodes(expr):
        if isinstance(node, Call) and node.func in CAST_DTYPES and is_float_dtype(node.func):
            out.add(np.dtype(np.float32) if node.func == "bfloat16" else np.dtype(node.func))
    return sorted(out, key=lambda d: d.itemsize)


def _owned(arr: np.ndarray, cdtype: np.dtype) -> np.ndarray:
    """``arr`` if it is a fresh C-contiguous array, else a copy: never a view of an input."""
    if arr.base is None and arr.flags.c_contiguous and arr.flags.writeable and arr.dtype == cdtype:
        return arr
    return np.array(arr, dtype=cdtype, order="C")


# --------------------------------------------------------------------------------------------
# Evaluation


class _Domain:
    """The iteration space of one scope (or one chunk of it) and the values computed over it."""

    __slots__ = ("axis_of", "ranges", "memo", "masks")

    def __init__(self, ivs: Sequence[IterVar], ranges: Sequence[Tuple[int, int]]):
        self.axis_of = {iv.var: k for k, iv in enumerate(ivs)}
        self.ranges = tuple(ranges)
        self.memo: dict = {}
        self.masks: list = []  # keeps the masks that memo keys refer to alive

    @property
    def ndim(self) -> int:
        return len(self.ranges)

    def axis_shape(self, k: int, extent: int) -> Tuple[int, ...]:
        shape = [1] * self.ndim
        shape[k] = extent
        return tuple(shape)


class _Run:
    """One call of :func:`evaluate`: inputs, compute type, and each nested scope's value."""

    def __init__(self, arrays: Dict[str, np.ndarray], cdtype: np.dtype, rounding: bool = True):
        self.arrays = arrays
        self.rounding = rounding
        self.cdtype = cdtype
        self.scopes: Dict[Scope, np.ndarray] = {}
        self.padded: Dict[Tensor, np.ndarray] = {}
        self.max_elems = max(1, MAX_TEMP_BYTES // max(8, cdtype.itemsize))

    # ---- helpers ---------------------------------------------------------------------------

    def float(self, x: np.ndarray) -> np.ndarray:
        return x if x.dtype == self.cdtype else x.astype(self.cdtype)

    def round_to(self, x: np.ndarray, dtype: str) -> np.ndarray:
        """``x`` (in the compute type) rounded to the 16-bit float ``dtype``, as a stage of that
        type stores it; wider types are left to the compute type."""
        if (not self.rounding or dtype not in ("float16", "bfloat16")
                or self.cdtype == numpy_dtype(dtype)):
            return x
        return np.asarray(x).astype(numpy_dtype(dtype)).astype(self.cdtype)

    def cast(self, x: np.ndarray, dtype: str) -> np.ndarray:
        """``dtype(x)``: floats round to the type (computed on in the compute type), integers
        truncate towards zero."""
        if not is_float_dtype(dtype):
            if self._integral(x):
                return self._int(x)
            return np.trunc(x).astype(np.int64)
        x = self.float(x)
        if self.rounding and (dtype_bits(dtype) < 8 * self.cdtype.itemsize
                              or dtype == "bfloat16"):
            return x.astype(numpy_dtype(dtype)).astype(self.cdtype)
        return x

    @staticmethod
    def _integral(x: np.ndarray) -> bool:
        return x.dtype.kind in "iub"

    @staticmethod
    def _int(x: np.ndarray) -> np.ndarray:
        return x.astype(np.int64) if x.dtype.kind == "b" else x

    # ---- scopes ----------------------------------------------------------------------------

    def scope(self, s: Scope) -> np.ndarray:
        """The materialized value of ``s`` (margins included), computed once per run."""
        done = self.scopes.get(s)
        if done is not None:
            return done
        loop_shape = tuple(iv.extent for iv in s.loops)
        if not s.reduce:
            dom = _Domain(s.loops, [(iv.begin, iv.end) for iv in s.loops])
            val = self.float(self.eval(s.body, dom, None))
        elif s.reducer == "sum":
            val = self._sum(s)
        else:
            val = self._max(s)
        val = np.broadcast_to(self.round_to(val, s.dtype), loop_shape)
        if any(lo or hi for lo, hi in s.pad):
            out = np.zeros(s.shape, dtype=self.cdtype)
            out[tuple(slice(lo, lo + n) for (lo, _), n in zip(s.pad, loop_shape))] = val
        else:
            out = _owned(val, self.cdtype)
        self.scopes[s] = out
        return out

    def _chunks(self, s: Scope, axis_sets: List[frozenset]):
        """Domains covering ``s`` whose largest operand stays under the memory bound.

        ``axis_sets`` are the iterator axes each operand depends on; reduction extents are
        halved, largest first in the largest operand, until every operand fits.
        """
        nl = len(s.loops)
        full = [iv.extent for iv in s.loops + s.reduce]
        chunk = list(full)

        def size(axes) -> int:
            return math.prod(chunk[k] for k in axes)

        while axis_sets:
            worst = max(axis_sets, key=size)
            if size(worst) <= self.max_elems:
                break
            cuts = [k for k in worst if k >= nl and chunk[k] > 1]
            if not cuts:
                break  # only the loop axes remain: the operand is as small as the output allows
            k = max(cuts, key=lambda a: chunk[a])
            chunk[k] = (chunk[k] + 1) // 2
        loop_ranges = [(iv.begin, iv.end) for iv in s.loops]
        per_axis = [
            [(b, min(b + chunk[nl + j], iv.end)) for b in range(iv.begin, iv.end, chunk[nl + j])]
            for j, iv in enumerate(s.reduce)
        ]
        for red_ranges in itertools.product(*per_axis):
            yield _Domain(s.loops + s.reduce, loop_ranges + list(red_ranges))

    def _axes_of(self, s: Scope, node: Node) -> frozenset:
        axis_of = {iv.var: k for k, iv in enumerate(s.loops + s.reduce)}
        return frozenset(axis_of[v] for v in free_vars(node))

    def _sum(self, s: Scope) -> np.ndarray:
        terms = _terms(s.body)
        axis_sets = [self._axes_of(s, f) for _, factors in terms for f in factors]
        total = None
        for dom in self._chunks(s, axis_sets):
            for sign, factors in terms:
                val = self._contract(dom, len(s.loops), sign, factors)
                total = val if total is None else total + val
        return total

    def _contract(self, dom: _Domain, nl: int, sign: float, factors) -> np.ndarray:
        """Σ over the reduction axes of ``dom`` of the product of ``factors``, at loop rank."""
        coef = np.asarray(sign, dtype=self.cdtype)
        operands: List[Tuple[np.ndarray, List[int]]] = []
        for f in factors:
            v = self.float(self.eval(f, dom, None))
            axes = [k for k, n in enumerate(v.shape) if n > 1]
            if not axes:
                coef = coef * v.reshape(())
            else:
                operands.append((v.reshape([v.shape[k] for k in axes]), axes))
        used = set(k for _, axes in operands for k in axes)
        extents = [e - b for b, e in dom.ranges]
        # A reduction iterator absent from every factor just repeats the term.
        repeat = math.prod(extents[k] for k in range(nl, dom.ndim) if k not in used)
        out_axes = sorted(k for k in used if k < nl)
        if not operands:
            val = np.asarray(coef, dtype=self.cdtype)
        elif len(operands) == 1:
            v, axes = operands[0]
            red = tuple(i for i, k in enumerate(axes) if k >= nl)
            val = v.sum(axis=red) if red else v
        else:
            args = []
            for v, axes in operands:
                args += [v, axes]
            val = np.einsum(*args, out_axes, optimize=True)
        if operands and coef.item() != 1.0:
            val = val * coef
        if repeat != 1:
            val = val * np.asarray(repeat, dtype=self.cdtype)
        shape = [1] * nl
        for k in out_axes:
            shape[k] = extents[k]
        return np.asarray(val, dtype=self.cdtype).reshape(shape)

    def _max(self, s: Scope) -> np.ndarray:
        nl = len(s.loops)
        best = None
        for dom in self._chunks(s, [self._axes_of(s, s.body)]):
            v = self.float(self.eval(s.body, dom, None))
            v = v.max(axis=tuple(range(nl, dom.ndim))) if dom.ndim > nl else v
            best = v if best is None else np.maximum(best, v)
        return best

    # ---- expressions -----------------------------------------------------------------------

    def eval(self, node: Node, dom: _Domain, live: Optional[np.ndarray]) -> np.ndarray:
        """``node`` over ``dom`` as a broadcastable array of rank ``dom.ndim``.

        ``live`` (boolean, broadcastable) marks the positions whose value is used; reads at other
        positions may be out of bounds. ``None`` means every position is live.
        """
        key = (node, id(live))
        hit = dom.memo.get(key)
        if hit is not None:
            return hit
        if isinstance(node, Var):
            k = dom.axis_of.get(node)
            if k is None:
                raise ValueError(f"iterator {node.name} is not bound by the enclosing scope")
            b, e = dom.ranges[k]
            val = np.arange(b, e, dtype=np.int64).reshape(dom.axis_shape(k, e - b))
        elif isinstance(node, Const):
            is_int = node.dtype.startswith("int")
            val = np.full((1,) * dom.ndim, node.value, dtype=np.int64 if is_int else self.cdtype)
        elif isinstance(node, BinOp):
            val = self._binop(node, dom, live)
        elif isinstance(node, Call):
            val = self._call(node, dom, live)
        elif isinstance(node, Access):
            val = self._access(node, dom, live)
        else:
            raise TypeError(f"cannot evaluate a {type(node).__name__} inside a scope body")
        dom.memo[key] = val
        return val

    def _binop(self, node: BinOp, dom: _Domain, live) -> np.ndarray:
        a = self.eval(node.a, dom, live)
        b = self.eval(node.b, dom, live)
        op = node.op
        if op in ("and", "or"):
            return (np.logical_and if op == "and" else np.logical_or)(a, b)
        if op in _COMPARE:
            if not (self._integral(a) and self._integral(b)):
                a, b = self.float(a), self.float(b)
            return _COMPARE[op](a, b)
        if op != "/" and self._integral(a) and self._integral(b):
            a, b = self._int(a), self._int(b)
            if op in _INT_ARITH:
                return _INT_ARITH[op](a, b)
            zero = b == 0
            if zero.any():
                if live is None or np.any(zero & live):
                    raise ZeroDivisionError(f"integer division by zero in {_describe(node)}")
                b = np.where(zero, 1, b)
            return (np.floor_divide if op == "//" else np.mod)(a, b)
        return _FLOAT_ARITH[op](self.float(a), self.float(b))

    def _call(self, node: Call, dom: _Domain, live) -> np.ndarray:
        f = node.func
        if f == "select":
            cond = self.eval(node.args[0], dom, live)
            cond = cond if cond.dtype.kind == "b" else cond != 0
            yes = cond if live is None else cond & live
            no = ~cond if live is None else ~cond & live
            dom.masks += [yes, no]
            a = self.eval(node.args[1], dom, yes)
            b = self.eval(node.args[2], dom, no)
            if not (self._integral(a) and self._integral(b)):
                a, b = self.float(a), self.float(b)
            else:
                a, b = self._int(a), self._int(b)
            return np.where(cond, a, b)
        args = [self.eval(x, dom, live) for x in node.args]
        if f in CAST_DTYPES:
            return self.cast(args[0], f)
        if f in ("max", "min", "abs", "neg") and all(self._integral(x) for x in args):
            args = [self._int(x) for x in args]
        else:
            args = [self.float(x) for x in args]
        if f == "relu":
            return np.maximum(args[0], np.asarray(0, dtype=self.cdtype))
        if f == "rsqrt":
            return np.reciprocal(np.sqrt(args[0]))
        if f == "max":
            return np.maximum(args[0], args[1])
        if f == "min":
            return np.minimum(args[0], args[1])
        if f == "pow":
            return np.power(args[0], args[1])
        return _UNARY[f](args[0])

    def _access(self, node: Access, dom: _Domain, live) -> np.ndarray:
        src = node.source
        idx = []
        for i in node.indices:
            v = self.eval(i, dom, live)
            if not self._integral(v):
                raise TypeError(f"index {to_text(i, where=False)} of {_describe(node)} is not "
                                "an integer expression")
            idx.append(self._int(v))
        if isinstance(src, Tensor):
            base = self.arrays[src.name]
            valid = [(-lo, n + hi) for n, (lo, hi) in zip(src.shape, src.pad)]
        else:
            base = self.scope(src)
            valid = [(iv.begin - lo, iv.end + hi) for iv, (lo, hi) in zip(src.loops, src.pad)]
        clip = False
        inner = True  # every index inside the unpadded extent of a tensor
        for d, (a, (lo_v, hi_v)) in enumerate(zip(idx, valid)):
            mn, mx = (int(a.min()), int(a.max())) if a.size else (lo_v, lo_v)
            if mn < lo_v or mx >= hi_v:
                bad = (a < lo_v) | (a >= hi_v)
                if live is not None:
                    bad = bad & live
                if bad.any():
                    read = np.broadcast_to(a, bad.shape)[bad]
                    raise OutOfBoundsError(
                        f"out-of-bounds read {_describe(node)}: index {d} "
                        f"({to_text(node.indices[d], where=False)}) spans [{mn}, {mx}] and "
                        f"reaches {int(read.min())}..{int(read.max())} outside the valid range "
                        f"[{lo_v}, {hi_v})"
                    )
                clip = True
            if isinstance(src, Tensor) and (mn < 0 or mx >= src.shape[d]):
                inner = False
        if clip:
            idx = [np.clip(a, lo_v, hi_v - 1) for a, (lo_v, hi_v) in zip(idx, valid)]
        if isinstance(src, Tensor):
            if inner and not clip:
                offsets = [0] * len(idx)
            else:
                base = self._padded(src)
                offsets = [lo for lo, _ in src.pad]
        else:
            offsets = [lo - iv.begin for iv, (lo, _) in zip(src.loops, src.pad)]
        idx = [a + o if o else a for a, o in zip(idx, offsets)]
        if not idx:
            return base.reshape((1,) * dom.ndim)
        if not clip:
            view = _affine_view(base, idx, dom.ndim)
            if view is not None:
                return view
        return base[tuple(idx)].reshape(np.broadcast_shapes(*(a.shape for a in idx)))

    def _padded(self, t: Tensor) -> np.ndarray:
        done = self.padded.get(t)
        if done is None:
            done = np.pad(self.arrays[t.name], t.pad, mode="constant",
                          constant_values=np.asarray(t.pad_value, dtype=self.cdtype))
            self.padded[t] = done
        return done


def _affine_view(base: np.ndarray, idx: List[np.ndarray], ndim: int) -> Optional[np.ndarray]:
    """A zero-copy strided view reading ``base[idx]`` when every index is affine in the axes.

    ``idx`` are in-bounds int64 arrays of rank ``ndim``; returns ``None`` when some index is not
    an affine function of the axis positions (e.g. it uses ``//`` or ``%``).
    """
    shape = [1] * ndim
    strides = [0] * ndim
    start = []
    for d, a in enumerate(idx):
        origin = a[(0,) * ndim] if a.ndim else a
        start.append(int(origin))
        recon = np.asarray(origin)
        for k, n in enumerate(a.shape):
            if n == 1:
                continue
            step = [0] * ndim
            step[k] = 1
            c = int(a[tuple(step)] - origin)
            recon = recon + c * np.arange(n, dtype=np.int64).reshape([n if j == k else 1
                                                                       for j in range(ndim)])
            strides[k] += c * base.strides[d]
            shape[k] = n
        if not np.array_equal(np.broadcast_to(recon, a.shape), a):
            return None
    corner = base[tuple(slice(p, None) for p in start)]
    return np.lib.stride_tricks.as_strided(corner, shape=shape, strides=strides, writeable=False)


def _terms(body: Node) -> List[Tuple[float, Tuple[Node, ...]]]:
    """``body`` as a signed sum of products: ``[(sign, (factor, ...)), ...]``."""
    out = []
    stack = [(body, 1.0)]
    while stack:
        node, sign = stack.pop()
        if isinstance(node, BinOp) and node.op in ("+", "-"):
            stack.append((node.b, sign if node.op == "+" else -sign))
            stack.append((node.a, sign))
        elif isinstance(node, Call) and node.func == "neg":
            stack.append((node.args[0], -sign))
        else:
            out.append((sign, tuple(_factors(node))))
    return out


def _factors(node: Node) -> List[Node]:
    out = []
    stack = [node]
    while stack:
        cur = stack.pop()
        if isinstance(cur, BinOp) and cur.op == "*":
            stack += [cur.b, cur.a]
        else:
            out.append(cur)
    return out


def _describe(node: Node, limit: int = 240) -> str:
    """Short text naming ``node`` in error messages (nested scopes can print very long)."""
    if isinstance(node, Access) and isinstance(node.source, Scope):
        idx = ", ".join(to_text(i, where=False) for i in node.indices)
        text = f"(nested scope of shape {list(node.source.shape)})[{idx}]"
    else:
        text = to_text(node, where=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
