"""Verification at sampled output points, for expressions too large to evaluate whole.

A dilated G2BMM of batch 8, length 10000, width 1000 and dim 64 is ~10 GMAC: the reference
interpreter cannot evaluate it in a test. Equivalence is then checked at a few hundred random
output points. Each point is evaluated on its own (vectorized over the points): the traversal
iterators are bound to the points' coordinates, summation iterators span their ranges along extra
axes, and a nested scope (or an earlier stage of a program) is evaluated only at the index points
actually read from it (deduplicated), recursively. Semantics are those of
:mod:`tvm_ollie.ir.interp` (tensor margins read ``pad_value``, scope margins 0, out-of-range reads
raise :class:`~tvm_ollie.ir.interp.OutOfBoundsError`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import scipy.special

from ..ir.interp import OutOfBoundsError, random_inputs
from ..ir.nodes import (CAST_DTYPES, Access, BinOp, Call, Const, Node, Scope, Tensor, Var,
                        is_float_dtype, iter_nodes, numpy_dtype)

__all__ = [
    "SampledResult", "check_sampled", "check_program_sampled", "evaluate_points",
    "sample_positions", "work",
]

#: Largest number of elements one body evaluation may broadcast to; points are chunked below it.
MAX_ELEMENTS = 1 << 22

_BIN = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
    "//": np.floor_divide, "%": np.mod, "<": np.less, "<=": np.less_equal,
    ">": np.greater, ">=": np.greater_equal, "==": np.equal, "!=": np.not_equal,
    "and": np.logical_and, "or": np.logical_or,
}
_CALL = {
    "relu": lambda x: np.maximum(x, 0.0), "tanh": np.tanh, "sigmoid": scipy.special.expit,
    "exp": np.exp, "log": np.log, "erf": scipy.special.erf, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "abs": np.abs, "neg": np.negative,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
    "select": lambda c, a, b: np.where(c, a, b),
}
_CALL.update({dtype: (lambda d: lambda x: _cast(x, d))(dtype) for dtype in CAST_DTYPES})


def _cast(x, dtype: str) -> np.ndarray:
    """``dtype(x)`` in float64 evaluation: round to a narrower float type, truncate to an int."""
    x = np.asarray(x)
    if not is_float_dtype(dtype):
        return np.trunc(x).astype(np.int64) if x.dtype.kind == "f" else x
    if dtype == "float64":
        return x.astype(np.float64)
    return x.astype(np.float64).astype(numpy_dtype(dtype)).astype(np.float64)


def work(expr: Node) -> float:
    """Multiply-adds to evaluate ``expr`` whole: Σ over scopes of the product of their extents."""
    total = 0.0
    for node in iter_nodes(expr):
        if isinstance(node, Scope):
            total += math.prod(iv.extent for iv in node.loops + node.reduce)
    return total


def sample_positions(shape: Sequence[int], count: int, seed: int = 0) -> np.ndarray:
    """``(count, ndim)`` random output positions (all of them when there are fewer)."""
    size = math.prod(shape)
    rng = np.random.default_rng(seed)
    if size <= count:
        flat = np.arange(size)
    else:
        flat = np.sort(rng.choice(size, size=count, replace=False))
        # Corners are where boundary mistakes live: always include the first and last point.
        flat[0], flat[-1] = 0, size - 1
    return np.stack(np.unravel_index(flat, tuple(shape)), axis=1).astype(np.int64)


class _Evaluator:
    """Evaluates scopes at given output positions; ``stages`` maps names to lazily read scopes."""

    def __init__(self, inputs: Mapping[str, np.ndarray], stages: Mapping[str, Scope]):
        self.inputs = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
        self.stages = dict(stages)

    def scope_at(self, scope: Scope, pos: np.ndarray) -> np.ndarray:
        """Values of ``scope`` at positions ``pos`` (``(P, ndim)`` ints, materialized coords)."""
        npts = pos.shape[0]
        out = np.zeros(npts, dtype=np.float64)
        if npts == 0:
            return out
        shape = np.array(scope.shape, dtype=np.int64)
        if np.any(pos < 0) or np.any(pos >= shape):
            raise OutOfBoundsError(f"position outside the {tuple(shape)} scope")
        offs = np.array([iv.begin - lo for iv, (lo, _) in zip(scope.loops, scope.pad)],
                        dtype=np.int64)
        vals = pos + offs
        inside = np.ones(npts, dtype=bool)
        for d, iv in enumerate(scope.loops):
            inside &= (vals[:, d] >= iv.begin) & (vals[:, d] < iv.end)
        idx = np.nonzero(inside)[0]
        if idx.size == 0:
            return out
        red = math.prod(iv.extent for iv in scope.reduce) if scope.reduce else 1
        chunk = max(1, MAX_ELEMENTS // max(red, 1))
        for start in range(0, idx.size, chunk):
            sel = idx[start:start + chunk]
            out[sel] = self._body(scope, vals[sel])
        return out

    def _body(self, scope: Scope, vals: np.ndarray) -> np.ndarray:
        nred = len(scope.reduce)
        env: Dict[Var, np.ndarray] = {}
        for d, iv in enumerate(scope.loops):
            env[iv.var] = vals[:, d].reshape((-1,) + (1,) * nred)
        for k, iv in enumerate(scope.reduce):
            shape = [1] * (nred + 1)
            shape[k + 1] = iv.extent
            env[iv.var] = np.arange(iv.begin, iv.end, dtype=np.int64).reshape(shape)
        full = (vals.shape[0],) + tuple(iv.extent for iv in scope.reduce)
        value = np.broadcast_to(np.asarray(self._eval(scope.body, env, {}), dtype=np.float64),
                                full)
        if not nred:
            return np.array(value)
        axes = tuple(range(1, nred + 1))
        if scope.reducer == "max":
            return value.max(axis=axes)
        return value.sum(axis=axes)

    def _eval(self, node: Node, env, memo) -> np.ndarray:
        hit = memo.get(id(node))
        if hit is not None:
            return hit
        if isinstance(node, Var):
            out = env[node]
        elif isinstance(node, Const):
            out = node.value
        elif isinstance(node, BinOp):
            a, b = self._eval(node.a, env, memo), self._eval(node.b, env, memo)
            if node.op in ("//", "%", "/") and not _is_float(a) and not _is_float(b):
                out = _BIN[node.op](a, b) if node.op != "/" else np.true_divide(a, b)
            else:
                out = _BIN[node.op](a, b)
        elif isinstance(node, Call):
            out = _CALL[node.func](*(self._eval(a, env, memo) for a in node.args))
        elif isinstance(node, Access):
            out = self._access(node, env, memo)
        else:
            raise TypeError(f"cannot evaluate {type(node).__name__}")
        memo[id(node)] = out
        return out

    def _access(self, node: Access, env, memo) -> np.ndarray:
        idx = np.broadcast_arrays(*(np.asarray(self._eval(i, env, memo), dtype=np.int64)
                                    for i in node.indices))
        shape = idx[0].shape if idx else ()
        src = node.source
        if isinstance(src, Scope):
            flat = np.stack([i.reshape(-1) for i in idx], axis=1)
            offs = np.array([iv.begin - lo for iv, (lo, _) in zip(src.loops, src.pad)])
            uniq, inv = np.unique(flat - offs, axis=0, return_inverse=True)
            return self.scope_at(src, uniq)[inv.reshape(-1)].reshape(shape)
        return self._tensor(src, idx, shape)

    def _tensor(self, src: Tensor, idx, shape) -> np.ndarray:
        inside = np.ones(shape, dtype=bool)
        for i, n, (lo, hi) in zip(idx, src.shape, src.pad):
            if np.any(i < -lo) or np.any(i >= n + hi):
                raise OutOfBoundsError(f"read of {src.name} outside its padded range")
            inside &= (i >= 0) & (i < n)
        clipped = tuple(np.clip(i, 0, n - 1) for i, n in zip(idx, src.shape))
        if src.name in self.stages:
            stage = self.stages[src.name]
            flat = np.ravel_multi_index(tuple(c.reshape(-1) for c in clipped), src.shape)
            uniq, inv = np.unique(flat, return_inverse=True)
            pos = np.stack(np.unravel_index(uniq, stage.shape), axis=1)
            vals = self.scope_at(stage, pos)[inv.reshape(-1)].reshape(shape)
        else:
            if src.name not in self.inputs:
                raise ValueError(f"missing input tensor {src.name!r}")
            arr = self.inputs[src.name]
            if arr.shape != src.shape:
                arr = arr.reshape(src.shape)  # a row-major view declared by the reader
            vals = arr[clipped] if clipped else arr[()]
        return np.where(inside, vals, src.pad_value)


def _is_float(x) -> bool:
    return isinstance(x, float) or (isinstance(x, np.ndarray) and x.dtype.kind == "f")


def evaluate_points(
    expr: Scope,
    inputs: Mapping[str, np.ndarray],
    positions: np.ndarray,
    stages: Optional[Mapping[str, Scope]] = None,
) -> np.ndarray:
    """Values of ``expr`` (float64) at output ``positions`` (``(P, ndim)``, materialized coords).

    ``stages`` maps tensor names to the scopes that compute them (earlier stages of a program);
    reads of such a tensor evaluate the stage at the points read.
    """
    return _Evaluator(inputs, stages or {}).scope_at(expr, np.asarray(positions, dtype=np.int64))


@dataclass(frozen=True)
class SampledResult:
    """Outcome of a sampled check: ``ok``, largest absolute error, points compared, reason."""

    ok: bool
    max_abs_err: float
    points: int
    reason: str = ""


def _compare(ref: np.ndarray, got: np.ndarray, rtol: float, atol: float) -> SampledResult:
    err = np.abs(ref - got)
    max_err = float(err.max()) if err.size else 0.0
    bad = ~(err <= atol + rtol * np.abs(ref))
    if np.any(bad):
        k = int(np.argmax(bad))
        return SampledResult(False, max_err, ref.size,
                             f"{int(bad.sum())}/{ref.size} points differ (first: #{k} "
                             f"{ref[k]!r} vs {got[k]!r})")
    return SampledResult(True, max_err, ref.size)


def check_sampled(
    a: Scope,
    b: Scope,
    inputs: Optional[Mapping[str, np.ndarray]] = None,
    points: int = 256,
    seed: int = 0,
    rtol: float = 1e-6,
    atol: float = 1e-8,
) -> SampledResult:
    """Compare two expressions of the same output shape at ``points`` random output positions."""
    if a.shape != b.shape:
        return SampledResult(False, math.inf, 0, f"shapes differ: {a.shape} vs {b.shape}")
    if inputs is None:
        inputs = random_inputs(a, seed=seed)
    pos = sample_positions(a.shape, points, seed)
    try:
        ref = evaluate_points(a, inputs, pos)
        got = evaluate_points(b, inputs, pos)
    except (OutOfBoundsError, ValueError) as err:
        return SampledResult(False, math.inf, 0, f"{type(err).__name__}: {err}")
    return _compare(ref, got, rtol, atol)


def program_stages(program) -> Tuple[Dict[str, Scope], Scope]:
    """``({name: scope}, output scope)`` of a :class:`tvm_ollie.derive.program.Program`."""
    stages = {s.name: s.expr for s in program.stages}
    out = getattr(program, "output", None)
    if isinstance(out, Tensor):
        out = out.name
    if isinstance(out, str) and out in stages:
        return stages, stages[out]
    return stages, program.stages[-1].expr


def check_program_sampled(
    original: Scope,
    program,
    inputs: Mapping[str, np.ndarray],
    points: int = 256,
    seed: int = 0,
    rtol: float = 1e-6,
    atol: float = 1e-8,
) -> SampledResult:
    """Compare a derived program with the original expression at sampled output positions."""
    stages, out = program_stages(program)
    if out.shape != original.shape:
        return SampledResult(False, math.inf, 0,
                             f"shapes differ: {original.shape} vs {out.shape}")
    pos = sample_positions(original.shape, points, seed)
    try:
        ref = evaluate_points(original, inputs, pos)
        got = evaluate_points(out, inputs, pos, stages)
    except (OutOfBoundsError, ValueError) as err:
        return SampledResult(False, math.inf, 0, f"{type(err).__name__}: {err}")
    return _compare(ref, got, rtol, atol)
