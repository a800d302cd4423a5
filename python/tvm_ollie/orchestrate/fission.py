"""Operator fission (Korch): rewrite composite Relax operators into primitive operators.

Kernel orchestration chooses kernels over a graph of *primitives* (elementwise, reduce and
broadcast, layout, linear). This pass produces that graph: every call of an op in
:data:`FISSION_RULES` whose guards pass is replaced, in place, by the standard Relax operators
its rule builds; every other call is left exactly as it was, and the :class:`FissionReport`
says why. Optionally (``attention=True``) Korch's attention rewrite folds ``softmax(S) @ V``
into one matmul against ``[V, 1]``.

The result is plain Relax: ``tvm.compile`` builds it like any module, and the primitives are
what the candidate-kernel enumeration walks.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Dict, Iterable, List, Optional, Tuple

from ..compat import relax, tvm
from .fission_rules import (
    ATTENTION_RULE,
    FISSION_RULES,
    FissionRule,
    RuleContext,
    primitive_kind,
    softmax_chain,
)

__all__ = ["FISSION_RULES", "ATTENTION_RULE", "FissionRule", "FissionReport", "Fission",
           "fission", "count_ops", "non_primitive_ops"]


@dataclasses.dataclass
class FissionReport:
    """What one fission run did.

    Attributes
    ----------
    split : dict of str to int
        Rule name -> number of calls it replaced by primitives.
    untouched : dict of str to dict of str to int
        Op name -> reason -> number of calls left as they were. Primitives are not listed;
        a composite op whose guard failed is (reason ``guard <name>``), as is an op that is
        neither a primitive nor has a rule (reason ``no fission rule``).
    """

    split: Dict[str, int] = dataclasses.field(default_factory=dict)
    untouched: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def total_split(self) -> int:
        """Calls replaced, over all rules."""
        return sum(self.split.values())

    def add_split(self, rule: FissionRule) -> None:
        """Count one call split by ``rule``."""
        self.split[rule.name] = self.split.get(rule.name, 0) + 1

    def add_untouched(self, op_name: str, reason: str) -> None:
        """Count one call of ``op_name`` left as it was, and why."""
        reasons = self.untouched.setdefault(op_name, {})
        reasons[reason] = reasons.get(reason, 0) + 1

    def to_text(self) -> str:
        """A few lines for logs and the CLI."""
        lines = [f"fission: {self.total_split} call(s) split"]
        lines += [f"  {name}: {n}" for name, n in sorted(self.split.items())]
        for op_name, reasons in sorted(self.untouched.items()):
            for reason, n in sorted(reasons.items()):
                lines.append(f"  untouched {op_name} x{n}: {reason}")
        return "\n".join(lines)


class _FunctionContext(RuleContext):
    """Producers and use counts of one function's bindings, for rules that look upstream."""

    def __init__(self, func: relax.Function, remap):
        self._producers: Dict[relax.Var, relax.Call] = {}
        self._uses: Dict[relax.Var, int] = collections.Counter()
        self._remap = remap
        for binding in _bindings(func):
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                self._producers[binding.var] = value
            self._count(value)
        self._count(func.body.body)

    def _count(self, expr: relax.Expr) -> None:
        for var in relax.analysis.free_vars(expr):
            self._uses[var] += 1

    def producer(self, var: relax.Expr) -> Optional[relax.Call]:
        return self._producers.get(var) if isinstance(var, relax.Var) else None

    def use_count(self, var: relax.Expr) -> int:
        return self._uses.get(var, 0)

    def remap(self, expr: relax.Expr) -> relax.Expr:
        return self._remap(expr)


def _bindings(func: relax.Function) -> Iterable[relax.Binding]:
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return ()
    return [b for block in body.blocks for b in block.bindings]


@relax.expr_functor.mutator
class _FissionMutator(relax.PyExprMutator):
    """Replaces each call that a rule accepts by the rule's primitive graph (emitted in place)."""

    def __init__(self, mod: tvm.IRModule, rules: Dict[str, FissionRule],
                 attention: bool, report: FissionReport):
        super().__init__(mod)
        self.rules = rules
        self.attention = attention
        self.report = report
        self.ctx: RuleContext = RuleContext()
        self._attention_calls: Dict[relax.Call, bool] = {}
        self._deferred: Dict[relax.Var, bool] = {}
        self._tuples: Dict[relax.Var, relax.Tuple] = {}
        self._current: Optional[relax.Var] = None

    def rewrite_function(self, func: relax.Function) -> relax.Function:
        """``func`` with its composite calls split (unchanged object when nothing applies)."""
        self.ctx = _FunctionContext(func, self.visit_expr)
        self._attention_calls, self._deferred, self._tuples = {}, {}, {}
        if self.attention:
            self._plan_attention(func)
        return self.visit_expr(func)

    def _plan_attention(self, func: relax.Function) -> None:
        """Find the matmuls whose softmax operand the attention rule absorbs (not emitted)."""
        for binding in _bindings(func):
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)
                    and call.op.name == ATTENTION_RULE.op_name):
                continue
            reason = ATTENTION_RULE.failed_guard(call, self.ctx)
            if reason is None:
                self._attention_calls[call] = True
                for var in softmax_chain(call.args[0], self.ctx).absorbed:
                    self._deferred[var] = True
            elif reason != ATTENTION_RULE.guards[0][0]:
                self.report.add_untouched(
                    "relax.nn.softmax + relax.matmul",
                    f"{ATTENTION_RULE.name}: guard {reason}")

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: D401
        if binding.var in self._deferred:
            return  # a softmax (or row-wise layout of it) that the attention rewrite replaces
        self._current = binding.var
        super().visit_var_binding_(binding)

    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        tup = op.tuple_value
        if isinstance(tup, relax.Var) and tup in self._tuples:
            return self._tuples[tup].fields[int(op.index)]
        return self.visit_expr_post_order(op)

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # pylint: disable=arguments-renamed
        new_call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return new_call
        if call in self._attention_calls:
            self.report.add_split(ATTENTION_RULE)
            return ATTENTION_RULE.build(self.builder_, new_call, self.ctx)
        rule = self.rules.get(call.op.name)
        if rule is None:
            if primitive_kind(call.op.name) is None:
                self.report.add_untouched(call.op.name, "no fission rule")
            return new_call
        reason = rule.failed_guard(call, self.ctx)
        if reason is not None:
            kind = primitive_kind(call.op.name)
            kept = f" (kept as one {kind} primitive)" if kind else ""
            self.report.add_untouched(call.op.name, f"{rule.name}: guard {reason}{kept}")
            return new_call
        self.report.add_split(rule)
        result = rule.build(self.builder_, new_call, self.ctx)
        if isinstance(result, relax.Tuple) and self._current is not None:
            self._tuples[self._current] = result
        return result


def fission(mod: tvm.IRModule, attention: bool = False,
            rules: Optional[Dict[str, FissionRule]] = None
            ) -> Tuple[tvm.IRModule, FissionReport]:
    """Split every composite operator call of ``mod``'s Relax functions into primitives.

    Parameters
    ----------
    mod : tvm.IRModule
        The module; it is not modified.
    attention : bool
        Also apply Korch's attention rewrite (``softmax(S) @ V`` as one matmul against
        ``[V, 1]``); off by default because it changes which matmul the model runs.
    rules : dict of str to FissionRule, optional
        Rules by op name (default :data:`FISSION_RULES`); tests pass subsets.

    Returns
    -------
    new_mod : tvm.IRModule
        ``mod`` itself when nothing was split, else the rewritten module (in a function where
        something was split, bindings left unused, e.g. a split batch_norm's result tuple, are
        removed from its dataflow blocks).
    report : FissionReport
        Calls split per rule and calls left untouched with the reason.
    """
    report = FissionReport()
    mutator = _FissionMutator(mod, FISSION_RULES if rules is None else rules, attention, report)
    changed: List[Tuple[tvm.ir.GlobalVar, relax.Function]] = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, relax.Function) or _is_kernel(func):
            continue
        before = report.total_split
        new_func = mutator.rewrite_function(func)
        if report.total_split > before:
            changed.append((gvar, relax.analysis.remove_all_unused(new_func)))
    if not changed:
        return mod, report
    for gvar, new_func in changed:
        mutator.builder_.update_func(gvar, new_func)
    return mutator.builder_.get(), report


def _is_kernel(func: relax.Function) -> bool:
    """Functions already fused or offloaded (``Primitive``/``Codegen``) are not graphs to split."""
    attrs = func.attrs
    return attrs is not None and ("Primitive" in attrs or "Codegen" in attrs)


@tvm.transform.module_pass(opt_level=0, name="Fission")
class Fission:
    """:func:`fission` as a module pass; the report of the last run is ``.last_report``."""

    def __init__(self, attention: bool = False):
        self.attention = attention
        self.last_report: Optional[FissionReport] = None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: ARG002
        """Run :func:`fission` on ``mod``."""
        del ctx
        new_mod, self.last_report = fission(mod, attention=self.attention)
        return new_mod


def count_ops(mod: tvm.IRModule) -> Dict[str, int]:
    """Op name -> number of calls, over every Relax function of ``mod``."""
    counts: Dict[str, int] = collections.Counter()
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            for binding in _bindings(func):
                value = binding.value
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    counts[value.op.name] += 1
    return dict(counts)


def non_primitive_ops(mod: tvm.IRModule) -> Dict[str, int]:
    """The calls of ``mod`` that are not of a primitive kind (what fission did not split)."""
    return {name: n for name, n in count_ops(mod).items() if primitive_kind(name) is None}
