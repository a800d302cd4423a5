"""Emit chosen kernels as Relax: one ``Primitive`` function per multi-primitive kernel.

A kernel of several primitives becomes a private Relax function with ``Primitive=True`` whose
dataflow block holds the primitives' ``call_tir`` bindings (the shape ``FuseOps`` gives its
groups), called from the block in dependency order; ``relax.transform.FuseTIR`` then merges
each into one PrimFunc. Constants become parameters, as ``FuseOps`` does. A single-primitive
kernel stays the original binding. The original variables are bound again to the kernels'
results, so every later use (and the function's return) stays valid.

With recomputation a value may be output by several chosen kernels: :func:`plan_kernels`
designates one producer per needed value (preferring a kernel already used, then the larger
one), drops kernels nothing needs, and orders the rest topologically (a dependency cycle
between kernels raises :class:`KernelCycle`; the selection adds a cut and solves again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..compat import relax, tvm
from .candidates import Candidate, is_library_kernel
from .primitives import Constant
from .graph import PrimitiveGraph

__all__ = ["KernelCycle", "PlannedKernel", "emit_bindings", "kernel_function", "kernel_module",
           "library_module", "plan_kernels"]


class KernelCycle(ValueError):
    """Chosen kernels depend on each other in a cycle; ``members`` are their positions."""

    def __init__(self, members: Sequence[int]):
        super().__init__(f"kernels {list(members)} depend on each other in a cycle")
        self.members = list(members)


@dataclass
class PlannedKernel:
    """A chosen kernel with the values it must output (in node order)."""

    position: int  # index in the chosen list
    cand: Candidate
    exports: List[object]
    #: ``(value, alternative result)``: the value is bound to the alternative's result after
    #: the kernel (joint selection, :mod:`.joint`)
    aliases: List[Tuple[object, object]] = field(default_factory=list)


def _unique_constants(cand: Candidate) -> List[object]:
    out: List[object] = []
    for const in cand.constants:
        if not any(const.same_as(c) for c in out):
            out.append(const)
    return out


def plan_kernels(graph: PrimitiveGraph, chosen: Sequence[Candidate], required: Sequence[object],
                 produced_here, canon: Optional[Dict[object, object]] = None
                 ) -> List[PlannedKernel]:
    """Designate a producer for every needed value and order the needed kernels.

    Parameters
    ----------
    chosen : sequence of Candidate
        The selected kernels.
    required : sequence of relax.Var
        Values that must be produced (partition outputs).
    produced_here : callable
        ``produced_here(var)``: whether the value is produced inside this partition (others
        are available).
    canon : dict, optional
        Alternative result -> the value it stands for (:func:`.joint.canon_map`): a kernel
        outputting the alternative's result produces the value.
    """
    canon = canon or {}
    exporters: Dict[object, List[int]] = {}
    for k, cand in enumerate(chosen):
        for var in cand.outputs:
            exporters.setdefault(canon.get(var, var), []).append(k)
    designated: Dict[object, int] = {}
    exports: Dict[int, List[object]] = {}
    aliases: Dict[int, List[Tuple[object, object]]] = {}
    stack = list(required)
    while stack:
        var = stack.pop()
        if var in designated or not produced_here(var):
            continue
        options = exporters.get(var)
        if not options:
            raise ValueError(f"no chosen kernel outputs {var.name}")
        k = max(options, key=lambda j: (j in exports, chosen[j].size, -j))
        designated[var] = k
        if k not in exports:
            exports[k] = []
            stack.extend(chosen[k].inputs)
        actual = var if var in chosen[k].outputs else next(
            o for o in chosen[k].outputs if canon.get(o) is not None and canon[o].same_as(var))
        if actual is not var:
            aliases.setdefault(k, []).append((var, actual))
        if actual not in exports[k]:
            exports[k].append(actual)
    deps = {k: {designated[v] for v in chosen[k].inputs if v in designated} - {k}
            for k in exports}
    order: List[int] = []
    ready = sorted((k for k in exports if not deps[k]), key=lambda j: chosen[j].nodes[0])
    done = set()
    while ready:
        k = ready.pop(0)
        order.append(k)
        done.add(k)
        newly = [j for j in exports if j not in done and j not in ready and deps[j] <= done]
        ready = sorted(ready + newly, key=lambda j: chosen[j].nodes[0])
    if len(order) != len(exports):
        raise KernelCycle(sorted(set(exports) - done))
    out = []
    for k in order:
        rank = {v: r for r, v in enumerate(v for i in chosen[k].nodes
                                                for v in graph.nodes[i].outputs)}
        out.append(PlannedKernel(k, chosen[k], sorted(exports[k], key=lambda v: rank[v]),
                                 aliases.get(k, [])))
    return out


def _subst(expr, env: Dict[object, object], consts: Dict[object, object]):
    if isinstance(expr, relax.Var):
        return env[expr]
    if isinstance(expr, Constant):
        return consts[expr]
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_subst(f, env, consts) for f in expr.fields])
    return expr


def kernel_function(graph: PrimitiveGraph, cand: Candidate,
                    exports: Optional[Sequence[object]] = None) -> "relax.Function":
    """The ``Primitive`` Relax function of a kernel: parameters = external inputs then
    constants; result = ``exports`` (a tuple when several)."""
    exports = list(cand.outputs if exports is None else exports)
    env: Dict[object, object] = {}
    params = []
    for var in cand.inputs:
        env[var] = relax.Var(var.name, var.ty)
        params.append(env[var])
    consts: Dict[object, object] = {}
    for k, const in enumerate(_unique_constants(cand)):
        consts[const] = relax.Var(f"param_{k}", const.ty)
        params.append(consts[const])
    bb = relax.BlockBuilder()
    with bb.function("kernel", params, attrs={"Primitive": True}, private=True):
        with bb.dataflow():
            for i in cand.nodes:
                node = graph.nodes[i]
                call = node.binding.value
                args = [_subst(a, env, consts) for a in call.args]
                new = relax.Call(call.op, args, call.attrs, call.ty_args)
                env[node.var] = bb.emit(new, name_hint=node.var.name)
                for proj in node.projections:
                    env[proj.var] = bb.emit(relax.TupleGetItem(env[node.var], proj.value.index),
                                            name_hint=proj.var.name)
            outs = [env[v] for v in exports]
            result = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(result)
    return bb.get()["kernel"]


def kernel_name(graph: PrimitiveGraph, cand: Candidate, limit: int = 6) -> str:
    """``orch_conv2d_add_relu``-style name from the primitives' names."""
    names = [graph.nodes[i].name for i in cand.nodes]
    tail = "_".join(names[:limit]) + ("_etc" if len(names) > limit else "")
    return "orch_" + "".join(c if c.isalnum() or c == "_" else "_" for c in tail)


def kernel_module(graph: PrimitiveGraph, cand: Candidate,
                  exports: Optional[Sequence[object]] = None) -> "tvm.IRModule":
    """A module whose ``main`` calls only this kernel (its PrimFuncs included): what the
    per-kernel check and the measured cost build. A library kernel
    (:func:`~.candidates.is_library_kernel`) is its call in ``main`` itself."""
    if is_library_kernel(graph, cand):
        return library_module(graph, cand)
    funcs = {}
    for i in cand.nodes:
        call = graph.nodes[i].binding.value
        gvar = call.args[0] if call.args else None
        if isinstance(gvar, tvm.ir.GlobalVar) and graph.mod is not None and gvar in graph.mod:
            funcs[gvar] = graph.mod[gvar]
    bb = relax.BlockBuilder(tvm.IRModule(funcs))
    kgv = bb.add_func(kernel_function(graph, cand, exports), kernel_name(graph, cand))
    params = [relax.Var(v.name, v.ty) for v in cand.inputs]
    params += [relax.Var(f"c{k}", c.ty) for k, c in enumerate(_unique_constants(cand))]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(kgv, params))
        bb.emit_func_output(out)
    return bb.get()


def library_module(graph: PrimitiveGraph, cand: Candidate) -> "tvm.IRModule":
    """``main(inputs..., constants...)`` binding the library call of ``cand`` alone (its
    tensor constants become parameters, as in :func:`kernel_module`; the attribute string
    stays in the call)."""
    node = graph.nodes[cand.nodes[0]]
    env = {var: relax.Var(var.name, var.ty) for var in cand.inputs}
    tensors = [c for c in _unique_constants(cand) if isinstance(c.ty, relax.TensorType)]
    consts = {c: relax.Var(f"c{k}", c.ty) for k, c in enumerate(tensors)}
    consts.update({c: c for c in _unique_constants(cand) if c not in consts})
    call = node.binding.value
    bb = relax.BlockBuilder()
    with bb.function("main", list(env.values()) + [consts[c] for c in tensors]):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(call.op, [_subst(a, env, consts) for a in call.args],
                                            call.attrs, call.ty_args))
        bb.emit_func_output(out)
    return bb.get()


def emit_bindings(graph: PrimitiveGraph, plan: Sequence[PlannedKernel],
                  builder: "relax.BlockBuilder") -> List[object]:
    """Bindings of the planned kernels, in order; multi-node kernels are added to
    ``builder``'s module as ``Primitive`` functions."""
    out: List[object] = []
    for item in plan:
        out.extend(_kernel_bindings(graph, item, builder))
        out.extend(relax.VarBinding(value, alt) for value, alt in item.aliases)
    return out


def _kernel_bindings(graph: PrimitiveGraph, item: PlannedKernel,
                     builder: "relax.BlockBuilder") -> List[object]:
    cand = item.cand
    if cand.size == 1:
        node = graph.nodes[cand.nodes[0]]
        wanted = set(item.exports)
        out = [node.binding] if node.projections or node.var in wanted else []
        return out + [p for p in node.projections if p.var in wanted]
    gvar = builder.add_func(kernel_function(graph, cand, item.exports),
                            kernel_name(graph, cand))
    args = list(cand.inputs) + _unique_constants(cand)
    call = builder.normalize(relax.Call(gvar, args))
    if len(item.exports) == 1:
        return [relax.VarBinding(item.exports[0], call)]
    res = relax.DataflowVar(f"{item.exports[0].name}_k", call.ty)
    return [relax.VarBinding(res, call)] + [
        relax.VarBinding(var, builder.normalize(relax.TupleGetItem(res, j)))
        for j, var in enumerate(item.exports)]
