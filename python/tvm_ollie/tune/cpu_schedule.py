"""Default CPU schedules for the kernels TVM builds unscheduled on ``llvm`` targets.

TVM 0.27's ``cpu_generic`` Relax pipeline legalizes and fuses but never schedules: every PrimFunc
that MetaSchedule did not tune is lowered as a single-threaded loop nest, one intermediate buffer
per fused operator. Once the heavy convolutions and matmuls go to a native library, those kernels
(elementwise chains, transposes, pads, gathers, the eOperators of derivation, reductions such as
softmax and layer norm, and the leftover matmuls) are what is slow on a CPU.

This module gives them a schedule in dlight's style: each rule is a
:class:`tvm.s_tir.dlight.ScheduleRule` that returns ``None`` when it does not apply, and the rules
are tried in order by one module pass (:func:`cpu_schedule_pass`). Unlike dlight's
``ApplyDefaultSchedule``, the pass treats any exception raised by a rule, or by lowering the
scheduled function, as "leave this function unscheduled": a schedule rule can only make a build
faster, never make it fail.

The rules (see :func:`default_rules`):

1. :class:`InjectiveRule`: functions whose blocks are all spatial. Inline every producer that
   its consumers read once per element (and reverse-inline consumers), then per remaining block
   vectorize the innermost loop when it is the contiguous output axis and every load is
   unit-stride or a broadcast in it, and run the outer loops as one fused ``parallel`` loop.
2. TVM's ``dlight.cpu.Reduction``, wrapped in :class:`MinWork`: only for functions big enough to
   parallelize, and only for row reductions (softmax, layer norm, a mean over the last axis),
   where it measured faster; on matmul/conv epilogues and strided reductions it measured slower
   than TVM's loop nest. (``dlight.cpu.GEMV`` is left out: see :func:`default_rules`.)
3. :class:`ReductionRule`: any other function made of spatial and reduction blocks whose spatial
   iterators lead (sum/mean/max over any axis, pooling windows, matmuls, convolutions):
   parallelize each block's leading spatial loops; injective blocks as in rule 1; no inlining.
4. :class:`FallbackRule`: anything else ``NormalizePrimFunc`` accepts: parallelize the outermost
   loop of each block when it binds a spatial iterator.

Every rule leaves a block single-threaded below :data:`DEFAULT_MIN_PARALLEL_WORK` iterations, and
rules 3-4 leave a function unscheduled when one of its reductions is shorter than
:data:`MIN_PARALLEL_REDUCTION` per output (3x3 pooling, short means): measured slower in parallel.
Parallel loops are not split by the thread count here: TVM lowers a ``parallel`` loop to a
``TVMBackendParallelLaunch`` whose body gives each runtime thread one contiguous chunk of the loop
range, so the fused loop already runs as ``TVM_NUM_THREADS`` chunks, and the same binary adapts to
the thread count it is run with. The target's ``num-cores`` only decides whether to parallelize at
all (one core: never).
"""

from __future__ import annotations

import logging
import os
from typing import Iterable, List, Optional, Sequence

from tvm import s_tir
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.target.codegen import llvm_get_vector_width
import tvm_ffi

from ..codegen.cached_alloc import finalize_passes
from ..compat import BufferLoadNode, dlight, sym, tirx, tvm
from ..target import is_llvm
from .gather_pattern import with_gathers_injective

__all__ = [
    "DEFAULT_MIN_PARALLEL_WORK",
    "MIN_PARALLEL_REDUCTION",
    "FallbackRule",
    "InjectiveRule",
    "MinWork",
    "ReductionRule",
    "SCHEDULED_BY_ATTR",
    "cpu_pipeline",
    "cpu_schedule_enabled",
    "cpu_schedule_pass",
    "default_rules",
    "num_cores",
    "rule_name",
    "schedule_func",
    "schedule_of",
    "vector_lanes",
]

LOG = logging.getLogger(__name__)

#: Below this many loop iterations (output elements for an injective block, spatial x reduction
#: iterations for a reduction block) a block stays single-threaded: in the threshold sweep of
#: docs/cpu-schedules.md (``sched_bench --threshold``) parallel add+sigmoid was 0.79x at 1K elements and
#: 0.90x at 4K, and only from 16K on did it reach break-even (with the second core busy) or gain.
DEFAULT_MIN_PARALLEL_WORK = 16384

#: A function with a reduction block that reduces fewer elements than this per output stays
#: unscheduled: parallel over the outputs measured slower than TVM's serial loop for max_pool2d
#: 3x3 (9 per output, 0.65x) and a mean over a middle axis of 56 (0.73x), in runs where
#: elementwise kernels and softmax gained 1.75-2x; parallelizing only the pad block of that
#: max_pool2d still gave 0.61x (the serial pooling after it ran slower). docs/cpu-schedules.md.
MIN_PARALLEL_REDUCTION = 64

#: PrimFunc attribute naming the rule that scheduled the function (for reports and tests).
SCHEDULED_BY_ATTR = "ollie.cpu_schedule_rule"

#: The attribute TVM 0.27 (dlight, MetaSchedule's ApplyDatabase) sets on scheduled PrimFuncs.
IS_SCHEDULED_ATTR = "tirx.is_scheduled"

#: Environment switch for ablation: ``TVM_OLLIE_CPU_SCHEDULE=0`` gives TVM's plain pipeline.
ENV_SWITCH = "TVM_OLLIE_CPU_SCHEDULE"

# At least this many bits per vector even when the target reports a narrower unit (LLVM splits a
# wide vector into legal ones; 8 fp32 lanes on SSE still means two vector ops per iteration).
_MIN_VECTOR_BITS = 256
_MAX_LANES = 64


def _schedule_cls():
    return s_tir.Schedule


def _normalize(sch) -> Optional[list]:
    """dlight's ``normalize_prim_func``: block infos with one loop per block iterator, or None."""

    return normalize_prim_func(sch)


def _static(expr) -> Optional[int]:
    """The value of a constant extent, None for a symbolic one."""
    if isinstance(expr, int):
        return expr
    value = getattr(expr, "value", None)
    return int(value) if isinstance(value, int) else None


def _product(values: Iterable[Optional[int]]) -> Optional[int]:
    """Product of extents; None when any is symbolic (a dynamic shape: assume large)."""
    out = 1
    for v in values:
        if v is None:
            return None
        out *= v
    return out


def num_cores(target: "tvm.target.Target") -> int:
    """Cores to schedule for: the target's ``num-cores``, else ``TVM_NUM_THREADS``, else CPUs."""
    cores = target.attrs.get("num-cores", None) if target is not None else None
    if cores is not None and int(cores) > 0:
        return int(cores)
    return int(os.environ.get("TVM_NUM_THREADS", 0)) or os.cpu_count() or 1


def vector_lanes(target: "tvm.target.Target", dtype: str) -> int:
    """Vector lanes for ``dtype``: the target's SIMD width (at least 256 bits) over its size."""

    try:
        bits = int(llvm_get_vector_width(target))
    except Exception:  # pylint: disable=broad-except
        bits = 0
    bits = max(bits, _MIN_VECTOR_BITS)
    elem = max(tvm.DataType(dtype).bits, 8)
    return max(2, min(bits // elem, _MAX_LANES))


def _write_dtype(sch, block_rv) -> str:
    block = sch.get(block_rv)
    return str(block.writes[0].source.dtype) if block.writes else "float32"


def _innermost_is_contiguous(sch, info) -> bool:
    """Whether the block's innermost iterator is the last index of every buffer it writes.

    Only then are consecutive iterations of the innermost loop consecutive addresses in the
    output, which is what makes vectorizing that loop a plain vector store.
    """
    if not info.iters:
        return False
    var = info.iters[-1].var
    block = sch.get(info.block_rv)
    if not block.writes:
        return False
    for region in block.writes:
        if not region.region:
            return False
        last = region.region[-1]
        if _static(last.extent) != 1 or not last.min.same_as(var):
            return False
    return True


def _uses(expr, var) -> bool:
    """Whether ``var`` occurs in ``expr``."""

    found = []
    tvm_ffi.structural_walk(expr, [(tirx.Var, lambda v: found.append(v.same_as(var)))],
                            order="pre")
    return any(found)


def _reads_are_unit_stride(sch, info) -> bool:
    """Whether every load in the block is unit-stride in the innermost iterator, or ignores it.

    Vectorizing helps when each vector load is one contiguous load (``x[.., v]``) or a broadcast
    (``y[c]``). Loads whose other indices depend on the innermost iterator (a transpose read) or
    whose last index is not ``v + c`` (``p // w`` of an im2col gather, ``x[idx[v]]``) become
    per-lane gathers plus vector integer division, which measured about 2x slower than TVM's
    scalar loop for a 3.6M-element im2col gather (docs/cpu-schedules.md).
    """

    var = info.iters[-1].var
    analyzer = sym.Analyzer()
    loads = []

    tvm_ffi.structural_walk(sch.get(info.block_rv).body, [(BufferLoadNode, loads.append)],
                            order="pre")
    for load in loads:
        indices = list(load.indices)
        if not indices:
            continue
        if any(_uses(index, var) for index in indices[:-1]):
            return False
        last = indices[-1]
        if _uses(last, var) and _uses(analyzer.simplify(last - var), var):
            return False
    return True


def _vectorize_inner(sch, info, lanes: int) -> tuple:
    """Vectorize the innermost loop of ``info`` when it is contiguous and its extent allows.

    Returns the loop left in its place (the outer part of a split; None when the whole loop
    became the vector loop; the loop itself when nothing was done) and whether it vectorized.
    """
    loop = info.iters[-1].loop_rv
    extent = _static(sch.get(loop).extent)
    if extent is None or extent < 4 or not _innermost_is_contiguous(sch, info) \
            or not _reads_are_unit_stride(sch, info):
        return loop, False
    if extent <= lanes and extent & (extent - 1) == 0:
        sch.vectorize(loop)
        return None, True
    width = lanes
    while width >= 4 and extent % width:
        width //= 2  # 56 floats: 16 lanes do not divide, 8 do (no tail, no predicate)
    if width < 4:
        return loop, False
    outer, inner = sch.split(loop, factors=[None, width])
    sch.vectorize(inner)
    return outer, True


def _parallel_loops(sch, info, rest, vectorized: bool, cores: int) -> list:
    """The loops of an injective block to fuse into its parallel loop.

    All loops but the vector loop when the innermost loop was vectorized. Otherwise the innermost
    loop stays out of the fusion whenever the outer loops alone give every thread several chunks:
    a serial innermost loop keeps plain ``i + 1`` indexing that LLVM strength-reduces and may
    vectorize itself, where a fully fused loop recomputes every index with div/mod per element.
    """
    outer = [it.loop_rv for it in info.iters[:-1]]
    if vectorized or not outer:
        return outer + [rest]
    outer_extent = _product(_static(sch.get(lp).extent) for lp in outer)
    if outer_extent is None or outer_extent >= 4 * cores:
        return outer
    return outer + [rest]


def _parallelize(sch, loops: Sequence, work: Optional[int], cores: int, min_work: int) -> bool:
    """Fuse ``loops`` (outermost first, all spatial) into one ``parallel`` loop if worth it."""
    loops = [lp for lp in loops if lp is not None]
    if cores <= 1 or not loops or (work is not None and work < min_work):
        return False
    extent = _product(_static(sch.get(lp).extent) for lp in loops)
    if extent is not None and extent < 2:
        return False
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    sch.parallel(fused)
    return True


def _loads_of(stmt, buffer) -> int:
    """Number of loads of ``buffer`` in ``stmt``."""

    count = []
    tvm_ffi.structural_walk(stmt, [(BufferLoadNode,
                                    lambda ld: count.append(ld.source.same_as(buffer)))],
                            order="pre")
    return sum(count)


def _inline_first(blocks: list, inline, allowed) -> bool:
    """Apply ``inline`` to the first block of ``blocks`` that ``allowed`` admits and that it
    accepts (the block is then removed from ``blocks``); whether one was inlined."""
    for i, block in enumerate(blocks):
        if not allowed(block):
            continue
        try:
            inline(block)
        except Exception:  # pylint: disable=broad-except
            continue
        blocks.pop(i)
        return True
    return False


def _inline_single_reads(sch, infos: list) -> int:
    """Inline producers read once per consumer element, then reverse-inline consumers.

    dlight's ``try_inline`` inlines every block it can; a producer read at several points per
    consumer element (the four taps of a bilinear ``resize2d``, a pooling window) is then
    recomputed once per tap, index arithmetic of reshapes and transposes included: that made a
    fused reshape/transpose/resize/concat kernel of SegFormer 3x slower than TVM's loop nest
    (docs/cpu-schedules.md). Such producers stay materialized. A consumer that is reverse-inlined into its
    producer is evaluated once per producer element, so it is always tried. Returns the number
    of blocks inlined.
    """
    blocks = [info.block_rv for info in infos]

    def read_once(block) -> bool:
        writes = sch.get(block).writes
        consumers = sch.get_consumers(block)
        return len(writes) == 1 and bool(consumers) and all(
            _loads_of(sch.get(c).body, writes[0].source) <= 1 for c in consumers)

    inlined = 0
    while (_inline_first(blocks, sch.compute_inline, read_once)
           or _inline_first(blocks, sch.reverse_compute_inline, lambda _: True)):
        inlined += 1
    return inlined


def _block_work(info) -> Optional[int]:
    """Loop iterations of a block (None when a shape is symbolic)."""
    return _product(_static(it.dom) for it in info.iters)


def _small_reduction(info) -> bool:
    """Whether a reduction block reduces fewer than :data:`MIN_PARALLEL_REDUCTION` elements."""
    extent = _product(_static(it.dom) for it in info.iters if it.kind == "R")
    return extent is not None and not info.is_injective() and extent < MIN_PARALLEL_REDUCTION


def _leading_spatial(info) -> int:
    kinds = info.dom_kind()
    return len(kinds) - len(kinds.lstrip("S"))


class _CPURule(dlight.ScheduleRule):
    """A CPU rule: applies to ``llvm`` targets only, with a threshold for parallel loops."""

    def __init__(self, min_parallel_work: int = DEFAULT_MIN_PARALLEL_WORK):
        self.min_parallel_work = int(min_parallel_work)

    def is_target_available(self, target: "tvm.target.Target") -> bool:
        return is_llvm(target)


class InjectiveRule(_CPURule):
    """Elementwise, broadcast, layout and gather functions: every block is spatial.

    Inlining first turns a fused chain (add -> sigmoid -> transpose) into one loop nest with no
    intermediate buffers, which is most of the gain for memory-bound kernels. Each remaining block
    then gets its contiguous innermost loop vectorized and every other loop fused into a single
    ``parallel`` loop, so the threads split the output into contiguous halves.
    """

    def apply(self, func, target, tunable):  # pylint: disable=unused-argument
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = _schedule_cls()(func)
        infos = _normalize(sch)
        if not infos or not all(info.is_injective() for info in infos):
            return None
        changed = _inline_single_reads(sch, infos) > 0
        infos = _normalize(sch)
        if not infos:
            return None
        cores = num_cores(target)
        for info in infos:
            if not info.iters:
                continue
            work = _block_work(info)
            lanes = vector_lanes(target, _write_dtype(sch, info.block_rv))
            rest, vectorized = _vectorize_inner(sch, info, lanes)
            outer = _parallel_loops(sch, info, rest, vectorized, cores)
            parallel = _parallelize(sch, outer, work, cores, self.min_parallel_work)
            changed = changed or vectorized or parallel
        return sch if changed else None


class ReductionRule(_CPURule):
    """Reductions whose spatial iterators lead (``S..SR..R``), with injective producers/consumers.

    Covers sum/mean/max, pooling windows and the matmuls/convolutions that no library or tuning
    record took. The spatial loops of a reduction are independent, so each block gets its leading
    spatial loops fused into one ``parallel`` loop (a reduction axis is never split, so the
    accumulation order and therefore the result is exactly TVM's); injective blocks get the
    :class:`InjectiveRule` treatment. Nothing is inlined: inlining a pad into a convolution puts
    its bounds test in the innermost multiply-add loop, which made SegFormer's convolutions up to
    2.5x slower than TVM's loop nest with a materialized pad (docs/cpu-schedules.md).
    """

    def apply(self, func, target, tunable):  # pylint: disable=unused-argument
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = _schedule_cls()(func)
        infos = _normalize(sch)
        if not infos or all(info.is_injective() for info in infos):
            return None
        if any(_small_reduction(info) for info in infos):
            return None
        for info in infos:
            kinds = info.dom_kind()
            if "O" in kinds or kinds.lstrip("S").strip("R"):
                return None  # opaque iterators or spatial after reduction: FallbackRule's job
        cores = num_cores(target)
        changed = False
        for info in infos:
            if not info.iters:
                continue
            work = _block_work(info)
            if info.is_injective():
                lanes = vector_lanes(target, _write_dtype(sch, info.block_rv))
                rest, vectorized = _vectorize_inner(sch, info, lanes)
                outer = _parallel_loops(sch, info, rest, vectorized, cores)
            else:
                vectorized = False
                outer = [it.loop_rv for it in info.iters[: _leading_spatial(info)]]
            parallel = _parallelize(sch, outer, work, cores, self.min_parallel_work)
            changed = changed or vectorized or parallel
        return sch if changed else None


class FallbackRule(_CPURule):
    """Last resort: parallelize each block's outermost loop when it is spatial and big enough.

    Nothing is inlined, fused, reordered or vectorized, so the computation is TVM's loop nest
    with only its outer loop shared between threads; a loop bound to a reduction (or opaque)
    iterator is never parallelized, which keeps the semantics.
    """

    def apply(self, func, target, tunable):  # pylint: disable=unused-argument
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = _schedule_cls()(func)
        infos = _normalize(sch)
        if not infos or any(_small_reduction(info) for info in infos):
            return None
        cores = num_cores(target)
        changed = False
        for info in infos:
            if not info.iters or info.dom_kind()[0] != "S":
                continue
            work = _block_work(info)
            if _parallelize(sch, [info.iters[0].loop_rv], work, cores, self.min_parallel_work):
                changed = True
        return sch if changed else None


def _is_row_reduction(sch, info) -> bool:
    """Whether a reduction block reduces rows: reduction iterators only in contiguous last axes.

    True for softmax, layer norm or a mean over the last axis: every load that uses a reduction
    iterator has the innermost one as its last index and no reduction iterator elsewhere. False
    for a mean over a middle axis (strided reads), a matmul (``B[k, j]``) or a convolution, for
    which ``dlight.cpu.Reduction`` measured slower than TVM's loop nest (docs/cpu-schedules.md).
    """
    if not info.iters or info.iters[-1].kind != "R":
        return False

    reduce_vars = [it.var for it in info.iters if it.kind == "R"]
    inner = info.iters[-1].var
    loads = []
    tvm_ffi.structural_walk(sch.get(info.block_rv).body, [(BufferLoadNode, loads.append)],
                            order="pre")
    used = False
    for load in loads:
        indices = list(load.indices)
        if not any(_uses(i, v) for i in indices for v in reduce_vars):
            continue
        used = True
        if not indices[-1].same_as(inner) or any(
                _uses(i, v) for i in indices[:-1] for v in reduce_vars):
            return False
    return used


class MinWork(_CPURule):
    """Wrap another rule (one of TVM's dlight CPU rules) so that it applies only where it helps.

    dlight's CPU rules parallelize unconditionally; below ``min_parallel_work`` loop iterations in
    every block the parallel launch costs more than it saves, so such functions are passed on to
    the next rule (which keeps them single-threaded). With ``innermost_reduction`` the wrapped rule
    is used only when every reduction is a row reduction (:func:`_is_row_reduction`):
    ``dlight.cpu.Reduction`` splits and unrolls the innermost reduction loop and computes every
    block at the shared spatial loop, which made a mean over a middle axis about 2x slower
    single-threaded, and SegFormer's matmul+bias and conv+bias kernels 0.4-0.8x (docs/cpu-schedules.md).
    """

    def __init__(self, rule: "dlight.ScheduleRule",
                 min_parallel_work: int = DEFAULT_MIN_PARALLEL_WORK,
                 innermost_reduction: bool = False):
        super().__init__(min_parallel_work)
        self.rule = rule
        self.innermost_reduction = bool(innermost_reduction)

    def apply(self, func, target, tunable):
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = _schedule_cls()(func)
        infos = _normalize(sch)
        if not infos:
            return None
        works = [_block_work(info) for info in infos if info.iters]
        if all(w is not None and w < self.min_parallel_work for w in works):
            return None
        if self.innermost_reduction and not all(
                _is_row_reduction(sch, info) for info in infos if not info.is_injective()):
            return None
        return self.rule.apply(func, target, tunable)


def default_rules(min_parallel_work: int = DEFAULT_MIN_PARALLEL_WORK,
                  ) -> List["dlight.ScheduleRule"]:
    """The CPU rules in the order they are tried (first one that returns a schedule wins).

    TVM's ``dlight.cpu.GEMV`` is not among them: its schedule (a vectorized spatial loop around
    the reduction, reduction loops annotated for explicit unrolling by 256) took 88 s to compile
    for one 512x256 matrix-vector product (``test_cpu_schedule.py``'s ``gemv`` case); the
    :class:`ReductionRule` parallelizes GEMVs instead. ``MinWork(dlight.cpu.GEMV())`` can still
    be passed as a rule.
    """
    return [
        InjectiveRule(min_parallel_work),
        MinWork(dlight.cpu.Reduction(), min_parallel_work, innermost_reduction=True),
        ReductionRule(min_parallel_work),
        FallbackRule(min_parallel_work),
    ]


def rule_name(rule: "dlight.ScheduleRule") -> str:
    """A readable name for a rule (``MinWork`` reports the rule it wraps)."""
    inner = getattr(rule, "rule", None)
    return ("dlight.cpu." + type(inner).__name__) if inner is not None else type(rule).__name__


def _lowering_passes() -> list:
    """The head of TVM's TIR lowering (``s_tir.pipeline``) through ``VectorizeLoop``.

    These are the passes that turn schedule primitives (init blocks, fused/split loops, vector
    loops) into plain loops; the rest of the pipeline (packed API, storage legalization) needs
    the whole module and does not depend on the schedule.
    """
    s_tir, tx = tvm.s_tir.transform, tvm.tirx.transform
    return [
        s_tir.CanonicalizeLoop(),
        s_tir.LowerInitBlock(),
        s_tir.PlanAndUpdateBufferAllocationLocation(),
        s_tir.ConvertBlocksToOpaque(),
        s_tir.CompactBufferAllocation(),
        s_tir.LowerMatchBuffer(),
        s_tir.StmtSimplify(),
        s_tir.LowerOpaqueBlock(),
        tx.FlattenBuffer(),
        tx.NarrowDataType(32),
        s_tir.LoopPartition(),
        tx.VectorizeLoop(True),
    ]


def _lowers(func: "tirx.PrimFunc", target: "tvm.target.Target") -> None:
    """Lower a scheduled function alone through TIR; raises if the schedule is invalid.

    Catches what a schedule can get wrong only at lowering time (vectorizing a loop whose body
    cannot be vectorized, a bad fuse), so that the function falls back to unscheduled instead of
    failing the whole build later.
    """
    mod = tvm.IRModule({"main": func})
    with target:
        tvm.transform.Sequential(_lowering_passes())(mod)


def schedule_of(func: "tirx.PrimFunc", target: "tvm.target.Target",
                rules: Sequence["dlight.ScheduleRule"], validate: bool = True):
    """``(schedule, rule name)`` of the first rule that schedules ``func``; None if no rule
    applies or anything raises. The schedule's trace replays the rule (tuning records keep it).
    """
    for rule in rules:
        try:
            if not rule.is_target_available(target):
                continue
            space = rule.apply(func, target, False)
            if space is None:
                continue
            sch = space[0] if isinstance(space, (list, tuple)) else space
            if validate:
                _lowers(sch.mod["main"], target)
        except Exception as err:  # pylint: disable=broad-except
            LOG.info("cpu schedule: %s failed (%s: %s); left unscheduled", rule_name(rule),
                     type(err).__name__, str(err).splitlines()[0] if str(err) else "")
            return None
        return sch, rule_name(rule)
    return None


def schedule_func(func: "tirx.PrimFunc", target: "tvm.target.Target",
                  rules: Sequence["dlight.ScheduleRule"], validate: bool = True,
                  ) -> Optional["tirx.PrimFunc"]:
    """The first rule's schedule of ``func``; None if no rule applies or anything raises."""
    found = schedule_of(func, target, rules, validate)
    if found is None:
        return None
    sch, name = found
    return sch.mod["main"].with_attr(IS_SCHEDULED_ATTR, True).with_attr(SCHEDULED_BY_ATTR, name)


def _is_scheduled(func) -> bool:
    return bool(func.attrs is not None and func.attrs.get(IS_SCHEDULED_ATTR, False))


def cpu_schedule_pass(rules: Optional[Sequence["dlight.ScheduleRule"]] = None,
                      validate: bool = True) -> "tvm.transform.Pass":
    """A module pass giving every unscheduled PrimFunc for an ``llvm`` target a CPU schedule.

    Parameters
    ----------
    rules : sequence of dlight ScheduleRule, optional
        Tried in order per function; defaults to :func:`default_rules`. Any rule object with
        dlight's ``apply(func, target, tunable)`` interface works, so callers can add or replace
        rules without touching this module.
    validate : bool
        Lower each scheduled function alone with TVM's TIR pipeline and keep the schedule only if
        that succeeds (costs a few ms per function).

    Returns
    -------
    tvm.transform.Pass
        Runs under the current target (``with target:``) or a function's ``target`` attribute.
        Functions already scheduled (``tirx.is_scheduled``: MetaSchedule records, dlight) are left
        alone; so is every function for which a rule raises.
    """
    rules = list(default_rules() if rules is None else rules)

    @tvm.transform.module_pass(opt_level=0, name="OllieCPUSchedule")
    def _pass(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        updates = {}
        for gvar, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or _is_scheduled(func):
                continue
            target = func.attrs.get("target", None) if func.attrs is not None else None
            target = target or tvm.target.Target.current(allow_none=True)
            if not is_llvm(target):
                continue
            new = schedule_func(func, target, rules, validate)
            if new is not None:
                updates[gvar] = new
        for gvar, func in updates.items():
            mod[gvar] = func
        return mod

    return _pass


def cpu_schedule_enabled(enabled: Optional[bool] = None) -> bool:
    """``enabled`` if given, else the ``TVM_OLLIE_CPU_SCHEDULE`` switch (on unless ``0``)."""
    if enabled is not None:
        return bool(enabled)
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def cpu_pipeline(target: "tvm.target.Target",
                 rules: Optional[Sequence["dlight.ScheduleRule"]] = None,
                 enabled: Optional[bool] = None,
                 fuse: Optional["tvm.transform.Pass"] = None,
                 pre: Sequence["tvm.transform.Pass"] = (),
                 wrap: Optional[dict] = None) -> "tvm.transform.Pass":
    """TVM's ``cpu_generic`` default Relax pipeline with :func:`cpu_schedule_pass` after FuseTIR
    (and gathers marked injective before fusion: :mod:`.gather_pattern`).

    The pass lists are TVM's own functions (``relax.backend.cpu_generic.pipeline``), so this
    stays TVM's pipeline plus one pass. ``enabled=False`` (or ``TVM_OLLIE_CPU_SCHEDULE=0``)
    leaves the schedule pass out, for ablation. ``fuse`` replaces TVM's greedy ``FuseOps``
    (kernel orchestration: :class:`tvm_ollie.orchestrate.Orchestrate`) and ``pre`` runs before
    legalization (operator fission); ``wrap`` maps a legalization pass's name to a function
    of that pass returning its replacement (joint selection keeps its alternatives alive
    through ``FoldConstant``).
    """

    target = tvm.target.Target(target) if not isinstance(target, tvm.target.Target) else target
    schedule = [cpu_schedule_pass(rules)] if cpu_schedule_enabled(enabled) else []

    @tvm.transform.module_pass(opt_level=0, name="OllieCPUPipeline")
    def _pipeline(mod: "tvm.IRModule", _ctx) -> "tvm.IRModule":
        with target:
            legalize = with_gathers_injective(cpu_generic.legalize_passes(target))
            if fuse is not None:
                legalize = [fuse if p.info.name == "FuseOps" else p for p in legalize]
            if wrap:
                legalize = [wrap[p.info.name](p) if p.info.name in wrap else p
                            for p in legalize]
            seq = tvm.transform.Sequential(
                cpu_generic.library_dispatch_passes(target)
                + list(pre)
                + legalize
                + schedule
                + cpu_generic.dataflow_lower_passes(target)
                + finalize_passes(target, cpu_generic)
            )
            return seq(mod)

    return _pipeline
