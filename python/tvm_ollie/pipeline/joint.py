"""Offering the alternatives of the joint selection: the derivation side of
:mod:`tvm_ollie.orchestrate.joint`.

The sequential build decides each heavy call first (:class:`~tvm_ollie.transform.decide.Decider`)
and orchestrates what is left; the joint build emits every verified alternative of a heavy call
into the block right after it (:func:`offer_alternatives`, plus the library alternatives with
their epilogue folded, :func:`offer_folded`), and the orchestration chooses among them and the
kernel boundaries with one binary program (:mod:`tvm_ollie.orchestrate.joint`: the table, the
groups, their costs). This needs both passes, so it sits above them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Dict, Optional, Tuple

import tvm_ffi

from ..codegen import library as lib
from ..compat import mutate_functions, relax, tvm
from ..orchestrate.joint import ALT_RE, ALT_TAG, AltInfo, JointTable
from ..transform.choosing import native_everywhere
from ..transform.decide import DERIVABLE_OPS, MARGIN, Decider, call_signature, unit_signature
from ..transform.emit import emit_program
from ..transform.epilogue import block_index, fold_chain, rewrite_dataflow_blocks, use_counts
from ..transform.optimize import optimize_module
from ..transform.regions import static_tensor
from ..transform.report import OptimizeReport
from ..transform.units import operand_values, original_form

__all__ = ["library_plan", "make_decider", "offer_alternatives", "offer_folded",
           "static_call"]


def offer_alternatives(mod: "tvm.IRModule", decider, max_alternatives: int = 2,
                       budget_s: float = 2.0, only: Optional[set] = None
                       ) -> Tuple["tvm.IRModule", JointTable, list]:
    """Emit the verified alternatives of every static heavy call after it (module docstring).

    For each call signature the ``decider`` decides (its choice is the *sequential* one and
    is always offered when it rewrites) and up to ``max_alternatives`` alternatives in all
    (cheapest analytic estimate first, each verified by the Decider's check) are offered.
    ``only``: the signatures of the calls to decide (None: all; the joint build decides the
    signatures of the module as given, as the sequential build does, whose rewrite then
    applies each signature's choice to every call of it). Signatures, not variable names:
    the regions pass re-emits the module and renames its bindings (on YOLOX quick, 20 of the
    89 heavy calls left kept their names, and the other 69 were never decided).
    Returns the module, the table, and ``(function, var, signature, choice)`` per call.
    """
    offers: Dict[str, list] = {}
    table = JointTable(margin=MARGIN)
    decided = []

    @relax.expr_functor.mutator
    class _Offer(relax.PyExprMutator):
        def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
            super().visit_var_binding_(binding)
            call = binding.value
            if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) \
                    or call.op.name not in DERIVABLE_OPS or not static_call(call) \
                    or not self.builder_.current_block_is_dataflow():
                return
            sig = call_signature(call)
            if only is not None and sig not in only:
                return
            if sig not in offers:
                ledger = getattr(decider, "budget", None)  # tuned: the signature's task
                with ledger.task(sig) if ledger is not None else contextlib.nullcontext():
                    offers[sig] = _offers_of(decider, call, max_alternatives, budget_s)
            choice, alts = offers[sig]
            name = binding.var.name
            decided.append((name, sig, choice))
            if len(alts) < 2 or ALT_RE.match(name) or name in table.alts:
                return
            names, values = operand_values(call)
            values = [self.visit_expr(v) for v in values]
            infos = [alts[0][1]]
            k, emitted = 0, []
            for alt, info in alts[1:]:
                try:
                    if alt.program is None:
                        args = [self.visit_expr(a) for a in call.args]
                        expr = original_form(call, args, alt.impl)
                    else:
                        mapping = {pn: v for pn, v in zip(choice.names or names, values)}
                        expr = emit_program(self.builder_, alt.program, mapping,
                                            tuple(int(s) for s in call.ty.shape),
                                            impl=alt.impl, name="ollie_alt")
                    if any(tvm_ffi.structural_equal(expr, e) for e in emitted):
                        continue  # e.g. a one-stage program on the library = original [native]
                    emitted.append(expr)
                    k += 1
                    # a block output: FoldConstant drops unused dataflow bindings
                    self.builder_.emit_output(expr, name_hint=f"{name}{ALT_TAG}{k}")
                    infos.append(info)
                except Exception as err:  # pylint: disable=broad-except
                    table.notes.append(f"{name}: {info.label} not emitted: "
                                       f"{type(err).__name__}: {str(err)[:100]}")
            if k:
                table.alts[name] = infos

    offer = _Offer(mod)
    return mutate_functions(offer, mod), table, decided


def offer_folded(mod: "tvm.IRModule", table: JointTable) -> "tvm.IRModule":
    """Each library alternative of ``table`` again with its epilogue folded (module docstring):
    ``v__alt<j> = K(attrs + bias/res/act, ...)`` after the last consumer that
    :func:`~tvm_ollie.transform.epilogue.fold_chain` folds, added to ``table`` as
    alternative ``j`` (``base``: the alternative it extends; ``stands_for``: that consumer)."""
    if not table:
        return mod
    counted = {}  # the function whose blocks are walked, and its use counts (one per function)

    def fold(bindings: list, func: "relax.Function") -> list:
        if counted.get("func") is not func:
            counted.update(func=func, uses=use_counts(func))
        folded = _folded_bindings(bindings, table, counted["uses"])
        return bindings if folded is None else folded

    return rewrite_dataflow_blocks(mod, fold)


def _folded_bindings(bindings: list, table: JointTable, uses) -> Optional[list]:
    """The block with the folded alternatives of its library alternatives (None: none)."""
    after: Dict[int, list] = {}
    latest: Dict[str, object] = {}
    bb = relax.BlockBuilder()
    index = None  # the block's readers, made once (each fold_chain would walk the block)
    for binding in bindings:
        hit = ALT_RE.match(binding.var.name)
        if hit is None:
            latest[binding.var.name] = binding.var
            continue
        name, k = hit.group(1), int(hit.group(2))
        infos, found, var = table.alts.get(name), lib.lib_call_of(binding.value), latest.get(name)
        if infos is None or found is None or var is None or k >= len(infos) \
                or infos[k].base is not None:
            continue
        index = index or block_index(bindings)
        chain = fold_chain(found[0], found[1], var, bindings, uses, index)
        if chain is None:
            continue
        stop = bindings[chain.consumers[-1]].var
        shape = [int(d) for d in binding.var.ty.shape]
        call = bb.normalize(lib.emit_call(chain.kernel, chain.operands, shape))
        folded = relax.Var(f"{name}{ALT_TAG}{len(infos)}", call.ty)
        after.setdefault(chain.consumers[-1], []).extend(
            chain.pre + [relax.VarBinding(folded, call)])
        base = infos[k]
        infos.append(dataclasses.replace(base, label=f"{base.label} + {'+'.join(chain.steps)}",
                                         native=True, base=k, stands_for=stop.name))
    if not after:
        return None
    out = []
    for j, binding in enumerate(bindings):
        out.append(binding)
        out.extend(after.get(j, []))
    return out


def make_decider(target, **opts):
    """A :class:`~tvm_ollie.transform.decide.Decider` that derives each signature once
    (``decide`` and :func:`offer_alternatives` both ask for the alternatives)."""
    class _Memo(Decider):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            self._alts: Dict[str, tuple] = {}

        def alternatives(self, call, budget_s):
            sig = unit_signature(call)
            if sig not in self._alts:
                self._alts[sig] = super().alternatives(call, budget_s)
            return self._alts[sig]

    return _Memo(target, **opts)


def library_plan(given: "tvm.IRModule", cfg, checker=None
                 ) -> Optional[Tuple["tvm.IRModule", OptimizeReport]]:
    """The *library* plan of the whole-model guards: ``given`` with every heavy call on its
    native library kernel where it has one (:func:`~tvm_ollie.transform.choosing.
    native_everywhere`), no derivation, and the pass's other steps as ``cfg`` has them
    (inference folds, epilogues folded, chains of convolutions kept in oneDNN's format, the
    regions' native forms);
    ``(module, report)``, or None when it rewrites nothing.

    The sequential build's whole-model guard (``pipeline.build._library_plan``) and the joint
    build's guard (:mod:`.joint_plans`) build this same plan: one construction owns it. Why
    the joint build uses it rather than per-call library choices on its regions-rewritten
    module: the Decider's alternatives have no library kernel for the calls a region rewrote,
    and each such call breaks a chain; on YOLOX quick the sequential build's library plan
    keeps one chain of 83 convolutions (88 of 101 on the library), the per-call library
    choices kept 8 chains of 56 (docs/orchestration.md).
    """
    # min_share=0: every call on the library, the small ones too. The small-unit guard keeps a
    # small call on TVM (it saves compile time where a decision is searched and timed; here
    # none is), and each such call splits the chain the layout step keeps channels-last:
    # GCN quick's plan kept 31 of its 46 convolutions on TVM, in 7 chains with 13 transforms.
    # native_regions: a region's native form (its transposes, conv and epilogue as one
    # channels-last call, transform/layout_absorb.py) is a library kernel too; SegFormer quick's
    # library plan ran 1.23x (one thread) and 1.38x (two) faster with its four Mix-FFN regions
    # in that form (docs/layouts.md, "Constant matmul weights in their fastest form")
    module, report = optimize_module(given, config=cfg.replace(derive=False, trials=0,
                                                               min_share=0.0),
                                     chooser=native_everywhere, checker=checker,
                                     native_regions=True)
    if not (report.rewritten or any(r.rewritten for r in report.regions)):
        return None
    return module, report


def static_call(call) -> bool:
    """Whether a call and its operands have static shapes (the calls the joint build decides)."""
    return all(static_tensor(e) for e in [call] + list(call.args))


def _offers_of(decider, call, max_alternatives: int, budget_s: float):
    """``(choice, [(alternative, AltInfo)...])``: the original first, then the sequential
    choice, then the cheapest verified others."""
    choice = decider.decide(call, budget_s)
    alts, _, _ = decider.alternatives(call, budget_s)
    base = alts[0]
    measured = decider.measures

    def info(alt, sequential):
        seconds = decider.cost(call, alt) if measured else None
        return AltInfo(alt.label, alt.estimate, seconds, sequential, alt.impl != "tvm")

    out = [(base, info(base, not choice.rewritten))]
    others = sorted(alts[1:], key=lambda a: (a.estimate, a.label))
    if choice.rewritten:
        first = [a for a in others if a.label == choice.label]
        others = first + [a for a in others if a.label != choice.label]
    tries = 0
    for alt in others:
        if len(out) > max_alternatives or tries >= max_alternatives + 1:
            break
        sequential = choice.rewritten and alt.label == choice.label
        if not sequential:
            tries += 1
            ok, _ = decider.check(call, alt)
            if not ok:
                continue
        item = info(alt, sequential)
        if measured and item.measured_s is None:
            continue
        out.append((alt, item))
    return choice, out
