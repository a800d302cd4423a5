"""Planned memory allocated once per virtual machine: the Relax VM's per-call allocations gone.

After TVM's ``StaticPlanBlockMemory`` the intermediate tensors of a function live in a few
planned storages, yet the executable still allocates every storage and a tensor view of every
intermediate at each call (``vm.builtin.alloc_storage``, ``vm.builtin.alloc_tensor``) and drops
them after their last use (``vm.builtin.null_value``): 122 + 12 + 133 builtin calls per run of
quick YOLOX (docs/per-call.md). ONNX Runtime plans its memory once per session. Two passes
placed around TVM's ``KillAfterLastUse`` (:func:`finalize_passes`) do the same for a function
whose shapes are all static::

    s = R.memory.alloc_storage(...)         cache = R.call_builtin_with_ctx(
    t = R.memory.alloc_tensor(s, off, ...)  ->    "tvm_ollie.vm.cached_alloc", (main_cached_alloc,))
    R.vm.kill_object(t)    (dropped)          t = cache[i]

:class:`LiftPlannedAllocations` (right after ``StaticPlanBlockMemory``) moves the planned
storages, their static tensor views and the static reshapes of those views into a private
function ``<name>_cached_alloc`` that returns them as a tuple; the native builtin
``tvm_ollie.vm.cached_alloc`` (``vm_cache.cc``) calls it on a VM's first call and returns the
same tuple to every later call of that VM. This is
what TVM's CUDA-graph rewrite does with ``vm.builtin.cuda_graph.get_cached_alloc``, which the
CPU wheel does not have. :class:`DropCachedKills` (right after ``KillAfterLastUse``) removes the
kills of the cached views: dropping one releases nothing, the cache holds it.

Contract: a VM's cached buffers serve one call at a time (TVM's VM keeps its registers in the
VM object and is not re-entrant either). Tensors returned to the caller are never cached:
``StaticPlanBlockMemory`` leaves every tensor that reaches the function's result (directly, in
a tuple or through a reshape or view) unplanned, so it is still allocated by every call, and
only planned storages are lifted. Left alone: functions with a symbolic shape in their
signature (dynamic shapes), functions called by another Relax function (a nested or repeated
call would share the buffers of a live one), allocations inside ``If`` branches, and every
function when the native builtin is not loaded.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Dict, Iterator, List, Optional

import tvm_ffi
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic

from ..compat import relax, tirx, tvm
from ..config import current_config
from ..target import is_llvm

__all__ = ["BUILTIN", "DropCachedKills", "LiftPlannedAllocations", "available",
           "cached_alloc_scope", "cached_entries", "clear_cache", "enabled", "finalize_passes"]

#: The native builtin that runs a lifted allocation function once per VM.
BUILTIN = "tvm_ollie.vm.cached_alloc"

#: Environment switch for ablation: ``TVM_OLLIE_CACHED_ALLOC=0`` turns the passes off.
ENV_SWITCH = "TVM_OLLIE_CACHED_ALLOC"

#: Suffix of the lifted allocation function's name.
SUFFIX = "_cached_alloc"

_ALLOC_STORAGE = tvm.ir.Op.get("relax.memory.alloc_storage")
_ALLOC_TENSOR = tvm.ir.Op.get("relax.memory.alloc_tensor")
_RESHAPE = tvm.ir.Op.get("relax.reshape")
_KILLS = tuple(tvm.ir.Op.get(n) for n in ("relax.memory.kill_tensor",
                                          "relax.memory.kill_storage", "relax.vm.kill_object"))

_SWITCH: contextvars.ContextVar = contextvars.ContextVar("tvm_ollie_cached_alloc",
                                                         default=None)


def available() -> bool:
    """Whether the native builtin is registered (the native library is loaded and has it)."""
    return tvm_ffi.get_global_func(BUILTIN, allow_missing=True) is not None


@contextlib.contextmanager
def cached_alloc_scope(on: bool) -> Iterator[None]:
    """Within the block, :func:`enabled` is ``on`` (the build sets it from its config)."""
    token = _SWITCH.set(bool(on))
    try:
        yield
    finally:
        _SWITCH.reset(token)


def enabled() -> bool:
    """Whether the CPU pipelines cache planned allocations: the :func:`cached_alloc_scope`'s
    switch, else :attr:`OllieConfig.cached_alloc` of the current config; never with
    ``TVM_OLLIE_CACHED_ALLOC=0`` in the environment (an ablation switch, as
    ``TVM_OLLIE_CPU_SCHEDULE``) or without the native builtin (an executable calling it could
    not run)."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return False
    on = _SWITCH.get()
    if on is None:
        on = current_config().cached_alloc
    return bool(on) and available()


def cached_entries() -> int:
    """Lifted functions of live VMs whose allocations are cached (dead VMs' dropped first)."""
    return int(tvm_ffi.get_global_func("tvm_ollie.vm.cached_alloc_entries")())


def clear_cache() -> int:
    """Drop every cached allocation (live VMs allocate again at their next call); returns how
    many there were."""
    return int(tvm_ffi.get_global_func("tvm_ollie.vm.cached_alloc_clear")())


def finalize_passes(target, backend=None, on: Optional[bool] = None
                    ) -> List["tvm.transform.Pass"]:
    """``backend.finalize_passes(target)`` (default: TVM's ``cpu_generic``) with
    :class:`LiftPlannedAllocations` after ``StaticPlanBlockMemory`` and
    :class:`DropCachedKills` after ``KillAfterLastUse`` on CPU (llvm) targets; TVM's list
    unchanged for other targets or when ``on`` (None: :func:`enabled`) is false."""
    if backend is None:
        backend = cpu_generic
    passes = list(backend.finalize_passes(target))
    if not is_llvm(target) or not (enabled() if on is None else bool(on) and available()):
        return passes
    after = {"StaticPlanBlockMemory": LiftPlannedAllocations(),
             "KillAfterLastUse": DropCachedKills()}
    out = []
    for p in passes:
        out.append(p)
        if p.info.name in after:
            out.append(after[p.info.name])
    return out


# --- the rules -------------------------------------------------------------------------------

def _static_ints(expr) -> Optional[List[int]]:
    """The values of a ShapeExpr whose dimensions are all constants, else None."""
    if not isinstance(expr, relax.ShapeExpr):
        return None
    if not all(isinstance(v, tirx.IntImm) for v in expr.values):
        return None
    return [int(v) for v in expr.values]


def _static_offset(expr) -> bool:
    return isinstance(expr, (int, tirx.IntImm))


def static_storage(binding) -> bool:
    """Rule: ``s = R.memory.alloc_storage(R.shape([n]), dev, scope, dtype)`` with constant n
    (a planned storage of static size)."""
    call = getattr(binding, "value", None)
    return isinstance(call, relax.Call) and call.op.same_as(_ALLOC_STORAGE) and \
        _static_ints(call.args[0]) is not None


def static_view(binding, lifted: Dict) -> bool:
    """Rule: ``t = R.memory.alloc_tensor(s, offset, R.shape(dims), dtype, ...)`` with ``s`` a
    lifted storage, constant offset and dims (a tensor view that is the same at every call)."""
    call = getattr(binding, "value", None)
    return isinstance(call, relax.Call) and call.op.same_as(_ALLOC_TENSOR) and \
        isinstance(call.args[0], relax.Var) and call.args[0] in lifted and \
        _static_offset(call.args[1]) and _static_ints(call.args[2]) is not None


def static_reshape(binding, lifted: Dict, alias: Dict) -> bool:
    """Rule: ``v = R.reshape(t, R.shape(dims))`` (or ``vm.builtin.reshape``) with ``t`` (or a
    var bound to it) lifted and constant dims (a view of cached memory, the same at every
    call)."""
    call = getattr(binding, "value", None)
    if not isinstance(call, relax.Call) or len(call.args) != 2:
        return False
    reshape = call.op.same_as(_RESHAPE) or (isinstance(call.op, relax.ExternFunc) and
                                            call.op.global_symbol == "vm.builtin.reshape")
    return reshape and alias.get(call.args[0], call.args[0]) in lifted and \
        _static_ints(call.args[1]) is not None


def _static_signature(func: "relax.Function") -> bool:
    """Every parameter and the result have static shapes (no symbolic dimension)."""
    return not relax.analysis.free_symbolic_vars(func) and \
        not relax.analysis.defined_symbolic_vars(func)


def _called_functions(mod: "tvm.IRModule") -> set:
    """Names of the Relax functions called (or referenced) by another Relax function."""
    names = set()
    for _, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue

        def visit(expr):
            if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.GlobalVar):
                callee = mod[expr.op]
                if isinstance(callee, relax.Function):
                    names.add(expr.op.name_hint)
            for arg in getattr(expr, "args", []) or []:
                if isinstance(arg, tvm.ir.GlobalVar) and isinstance(mod[arg], relax.Function):
                    names.add(arg.name_hint)

        relax.analysis.post_order_visit(func, visit)
    return names


# --- the passes ------------------------------------------------------------------------------

def _view_key(binding, alias: Dict, same: Dict):
    """What makes a lifted view: two with one key are the same tensor (same storage, offset,
    shape and dtype; or the same reshape of the same view); None for a storage."""
    call = binding.value
    if call.op.same_as(_ALLOC_STORAGE):
        return None
    source = alias.get(call.args[0], call.args[0])
    rest = tuple(str(a) for a in call.args[1:])
    return (str(call.op), same.get(source, source), rest)


def _lift_function(bb: "relax.BlockBuilder", gv, func: "relax.Function"):
    """``func`` with its planned static allocations lifted, or None when nothing applies."""
    if not isinstance(func.body, relax.SeqExpr):
        return None
    lifted: Dict = {}  # var -> binding, in binding order
    alias: Dict = {}  # var bound to a lifted var (``lv = alloc``) -> that var
    same: Dict = {}  # a view equal to an earlier one (``_view_key``) -> the earlier one
    seen: Dict = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if static_storage(binding) or static_view(binding, lifted) or \
                    static_reshape(binding, lifted, alias):
                lifted[binding.var] = binding
                key = _view_key(binding, alias, same)
                if key is not None and key in seen:
                    same[binding.var] = seen[key]
                elif key is not None:
                    seen[key] = binding.var
            elif isinstance(value, relax.Var) and alias.get(value, value) in lifted:
                alias[binding.var] = alias.get(value, value)
    if not lifted:
        return None
    views = [v for v, b in lifted.items()
             if not b.value.op.same_as(_ALLOC_STORAGE) and v not in same]
    used = _used_outside(func, lifted)
    # storages that a binding left in the function still reads (a view with a dynamic shape)
    returned = views + [v for v, b in lifted.items()
                        if v in used and b.value.op.same_as(_ALLOC_STORAGE)]
    alloc_gv, ret_ty = _allocation_function(bb, gv.name_hint + SUFFIX, lifted, alias, same,
                                            returned)

    # The function: the first lifted binding becomes the cached call, each lifted var an item
    # (a view equal to an earlier one: that one, a binding that generates no code).
    cache = relax.Var("cached_alloc", ret_ty)
    index = {v: i for i, v in enumerate(returned)}
    blocks = []
    first = True
    for block in func.body.blocks:
        bindings = []
        for binding in block.bindings:
            if binding.var not in lifted:
                bindings.append(binding)
                continue
            if first:
                call = relax.op.call_builtin_with_ctx(BUILTIN, relax.Tuple([alloc_gv]),
                                                      ty_args=[ret_ty])
                bindings.append(relax.VarBinding(cache, call))
                first = False
            if binding.var in same:
                bindings.append(relax.VarBinding(binding.var, same[binding.var]))
            elif binding.var in index:
                bindings.append(relax.VarBinding(
                    binding.var, relax.TupleGetItem(cache, index[binding.var])))
        blocks.append(relax.BindingBlock(bindings))
    body = relax.SeqExpr(blocks, func.body.body)
    return bb.normalize(relax.Function(func.params, body, func.ret_ty, func.is_pure,
                                       func.attrs, func.span))


def _root(var, alias: Dict, same: Dict):
    """The lifted binding a var stands for (through trivial bindings and equal views)."""
    var = alias.get(var, var)
    return same.get(var, var)


def _allocation_function(bb: "relax.BlockBuilder", name: str, lifted: Dict, alias: Dict,
                         same: Dict, returned: List):
    """``(GlobalVar, return type)`` of the private function that makes the lifted bindings
    (on fresh variables; one view for views that are the same) and returns ``returned``."""
    remap: Dict = {}
    alloc = relax.BlockBuilder()
    with alloc.function(name, [], {"relax.force_pure": True}, private=True):
        for var, binding in lifted.items():
            if var in same:
                continue
            call = binding.value
            args = [remap[_root(a, alias, same)] if isinstance(a, relax.Var) else a
                    for a in call.args]
            remap[var] = alloc.emit(relax.Call(call.op, args, call.attrs, call.ty_args),
                                    name_hint=var.name)
        alloc.emit_func_output(relax.Tuple([remap[v] for v in returned]))
    func = alloc.get()[name]
    return bb.add_func(func, name), func.ret_ty


def _used_outside(func: "relax.Function", lifted: Dict) -> set:
    """Lifted vars read by a binding that is not lifted (a storage with a dynamic view)."""
    used = set()
    for block in func.body.blocks:
        for binding in block.bindings:
            if binding.var in lifted:
                continue

            def visit(expr):
                if isinstance(expr, relax.Var) and expr in lifted:
                    used.add(expr)

            relax.analysis.post_order_visit(binding.value, visit)
    relax.analysis.post_order_visit(func.body.body,
                                    lambda e: used.add(e) if isinstance(e, relax.Var)
                                    and e in lifted else None)
    return used


@tvm.transform.module_pass(opt_level=0, name="LiftPlannedAllocations")
class LiftPlannedAllocations:
    """Lift the planned static allocations of each entry function into ``<name>_cached_alloc``
    and fetch them through :data:`BUILTIN` (once per VM); runs after ``StaticPlanBlockMemory``.
    """

    def transform_module(self, mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        called = _called_functions(mod)
        bb = relax.BlockBuilder(mod)
        changed = False
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or gv.name_hint in called or \
                    func.attrs is None or "global_symbol" not in func.attrs or \
                    not _static_signature(func):
                continue
            new = _lift_function(bb, gv, func)
            if new is not None:
                bb.update_func(gv, new)
                changed = True
        return bb.finalize() if changed else mod


def _cached_vars(func: "relax.Function") -> set:
    """Vars bound to an item of a :data:`BUILTIN` call's result in ``func``."""
    caches, items = set(), set()
    for block in func.body.blocks:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if _is_cached_call(value):
                caches.add(binding.var)
            elif isinstance(value, relax.TupleGetItem) and value.tuple_value in caches:
                items.add(binding.var)
    return items


def _is_cached_call(value) -> bool:
    if not isinstance(value, relax.Call):
        return False
    op = value.op
    if isinstance(op, tvm.ir.Op) and op.name == "relax.call_builtin_with_ctx":
        op = value.args[0]
    return isinstance(op, relax.ExternFunc) and op.global_symbol == BUILTIN


@tvm.transform.module_pass(opt_level=0, name="DropCachedKills")
class DropCachedKills:
    """Remove the kills of cached views (the cache holds them: a kill frees nothing); runs after
    ``KillAfterLastUse``."""

    def transform_module(self, mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        bb = relax.BlockBuilder(mod)
        changed = False
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
                continue
            cached = _cached_vars(func)
            if not cached:
                continue
            blocks = [relax.BindingBlock([b for b in block.bindings if not _kills(b, cached)])
                      for block in func.body.blocks]
            bb.update_func(gv, bb.normalize(relax.Function(
                func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                func.attrs, func.span)))
            changed = True
        return bb.finalize() if changed else mod


def _kills(binding, cached: set) -> bool:
    """Rule: ``_ = R.memory.kill_tensor(t)`` (or ``kill_storage``, ``R.vm.kill_object``) of a
    cached var ``t``."""
    value = getattr(binding, "value", None)
    return isinstance(value, relax.Call) and any(value.op.same_as(k) for k in _KILLS) and \
        len(value.args) == 1 and value.args[0] in cached
