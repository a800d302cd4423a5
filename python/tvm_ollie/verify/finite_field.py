"""Exact verification of a derived program over a finite field, for polynomial expressions.

Float trials with a tolerance can pass a wrong rewrite and fail a right one. For expressions
built from ``+``, ``-``, ``*``, integer constants, sums and reads (with zero padding and guards
that depend only on iterators), the original and a program are polynomials in the input values
with integer coefficients. Reduction modulo a prime ``p`` is a ring homomorphism, so evaluating
both on random points of ``Z_p`` (reducing every stage's output mod ``p``) and comparing is exact,
and by the Schwartz-Zippel lemma two *different* polynomials of total degree at most ``d`` agree
on ``k`` independent uniform points with probability at most ``(d / p) ** k``.

The reference interpreter computes in float64, exact for integers below ``2**53``: the prime is
the largest of :data:`PRIMES` whose worst-case intermediate magnitude stays below that bound
(:func:`magnitude_bound`); an expression too large for any of them is not checked here (the
float check still is). Anything outside the fragment (activations, division, ``max``, reads of
values inside guards) is reported as not applicable. Both sides are evaluated in exact
arithmetic: a widening float cast (``float32`` of a ``float16`` value) changes no value and is
the identity; a narrowing or integer cast rounds and is not applicable; 16-bit stages are checked
in the exact arithmetic that float32 stages are (their rounding is the float check's concern).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np

from ..ir.interp import OutOfBoundsError, evaluate
from ..ir.nodes import (Access, BinOp, Call, Const, Node, Scope, Tensor, Var, dtype_bits, is_cast,
                        is_float_dtype, iter_nodes, value_dtype)

__all__ = ["FieldResult", "NotPolynomial", "PRIMES", "check_program_mod_p", "magnitude_bound",
           "polynomial_degree"]

#: candidate primes, largest first (2^31-1, then primes below 2^25, 2^20, 2^16, 2^13)
PRIMES = (2147483647, 33554393, 1048573, 65521, 8191)
#: float64 represents every integer of magnitude below this exactly
EXACT = 2.0 ** 53


class NotPolynomial(ValueError):
    """The expression leaves the polynomial fragment."""


@dataclass(frozen=True)
class FieldResult:
    """Outcome of :func:`check_program_mod_p`.

    ``applicable`` is False when the expressions are not polynomial or too large for an exact
    evaluation (``reason`` says why; nothing was checked). Otherwise ``ok`` tells whether all
    ``trials`` points agreed modulo ``p``; ``bound`` is the probability that a wrong program
    would pass, ``(degree / p) ** trials``.
    """

    applicable: bool
    ok: bool
    p: int = 0
    degree: int = 0
    trials: int = 0
    bound: float = 1.0
    reason: str = ""


def polynomial_degree(node: Node) -> int:
    """Total degree of a value expression in the input values; raises :class:`NotPolynomial`."""
    return _degree(node)


def _degree(node: Node) -> int:
    if isinstance(node, Scope):
        if node.reducer != "sum":
            raise NotPolynomial(f"{node.reducer} reduction")
        return _degree(node.body)
    if isinstance(node, Access):
        if isinstance(node.source, Tensor):
            _check_pad(node.source)
            return 1
        return _degree(node.source)
    if isinstance(node, Const):
        if float(node.value) != int(node.value):
            raise NotPolynomial(f"non-integer constant {node.value}")
        return 0
    if isinstance(node, Var):
        raise NotPolynomial(f"iterator {node.name} used as a value")
    if isinstance(node, BinOp):
        if node.op in ("+", "-"):
            return max(_degree(node.a), _degree(node.b))
        if node.op == "*":
            return _degree(node.a) + _degree(node.b)
        raise NotPolynomial(f"operator {node.op}")
    if is_cast(node):
        _check_widening(node)
        return _degree(node.args[0])
    if isinstance(node, Call) and node.func == "select":
        cond, a, b = node.args
        if any(isinstance(n, Access) for n in iter_nodes(cond)):
            raise NotPolynomial("a guard that reads values")
        return max(_degree(a), _degree(b))
    if isinstance(node, Call):
        raise NotPolynomial(f"function {node.func}")
    raise NotPolynomial(f"{type(node).__name__} node")


def _check_widening(cast: Call) -> None:
    """A float cast to a type that holds every value of its operand's float type changes no
    value, so it is the identity on the polynomial; any other cast (narrowing, to or from an
    integer) rounds, which no polynomial over a field models."""
    src = value_dtype(cast.args[0])
    if not (is_float_dtype(src) and is_float_dtype(cast.func)
            and (src == cast.func or (dtype_bits(cast.func) > dtype_bits(src)
                                      and {src, cast.func} != {"float16", "bfloat16"}))):
        raise NotPolynomial(f"cast from {src} to {cast.func} is not value-preserving")


def _check_pad(t: Tensor) -> None:
    if any(lo or hi for lo, hi in t.pad) and float(t.pad_value) != int(t.pad_value):
        raise NotPolynomial(f"{t.name} pads with {t.pad_value}")


def magnitude_bound(node: Node, p: int) -> float:
    """The largest magnitude any intermediate of ``node`` can reach with inputs in ``[0, p)``."""
    if isinstance(node, Scope):
        return float(np.prod([iv.extent for iv in node.reduce])) * magnitude_bound(node.body, p)
    if isinstance(node, Access):
        if isinstance(node.source, Tensor):
            return float(max(p - 1, abs(node.source.pad_value)))
        return magnitude_bound(node.source, p)
    if isinstance(node, Const):
        return abs(float(node.value))
    if isinstance(node, BinOp):
        a, b = magnitude_bound(node.a, p), magnitude_bound(node.b, p)
        return a * b if node.op == "*" else a + b
    if is_cast(node):  # widening (checked by _degree)
        return magnitude_bound(node.args[0], p)
    if isinstance(node, Call):  # select (checked by _degree)
        return max(magnitude_bound(x, p) for x in node.args[1:])
    return 0.0


def check_program_mod_p(program, trials: int = 3, seed: int = 0) -> FieldResult:
    """Compare ``program`` with its original expression over ``Z_p`` on ``trials`` points."""
    original = program.original
    try:
        degree = max([_degree(original)] + [_degree(s.expr) for s in program.stages])
    except NotPolynomial as err:
        return FieldResult(False, False, reason=f"not polynomial: {err}")
    exprs = [original] + [s.expr for s in program.stages]
    p = next((q for q in PRIMES if max(magnitude_bound(e, q) for e in exprs) < EXACT), None)
    if p is None:
        return FieldResult(False, False, degree=degree,
                           reason="too large for an exact float64 evaluation")
    rng = np.random.default_rng(seed)
    tensors: Dict[str, Tensor] = {}
    for node in iter_nodes(original):
        if isinstance(node, Tensor):
            tensors.setdefault(node.name, node)
    for k in range(trials):
        inputs = {n: rng.integers(0, p, size=t.shape).astype(np.float64)
                  for n, t in tensors.items()}
        try:
            want = np.mod(evaluate(original, inputs, np.float64, rounding=False), p)
            got = _evaluate_mod(program, inputs, p)
        except (OutOfBoundsError, ValueError) as err:
            return FieldResult(True, False, p, degree, k, 1.0, f"evaluation failed: {err}")
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = int(np.sum(got != want)) if got.shape == want.shape else -1
            return FieldResult(True, False, p, degree, k + 1, 0.0,
                               f"differs mod {p} at {bad} of {want.size} positions")
    bound = (degree / p) ** trials if degree else 0.0
    return FieldResult(True, True, p, degree, trials, bound)


def _evaluate_mod(program, inputs, p: int) -> np.ndarray:
    """``program`` stage by stage, every stage's output reduced mod ``p`` (what
    :meth:`Program.evaluate` does, in ``Z_p``)."""
    env: Dict[str, np.ndarray] = dict(inputs)
    for stage in program.stages:
        feed = {}
        for node in iter_nodes(stage.expr):
            if isinstance(node, Tensor) and node.name not in feed:
                feed[node.name] = np.asarray(env[node.name]).reshape(node.shape)
        env[stage.name] = np.mod(evaluate(stage.expr, feed, np.float64, rounding=False), p)
    return np.mod(env[program.output].reshape(program.original.shape), p)
