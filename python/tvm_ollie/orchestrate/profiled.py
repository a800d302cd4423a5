"""Profiled kernel costs: the candidates a roofline cannot rank are built and timed.

Korch profiles every candidate kernel and lets the binary program choose on measured times;
a roofline (:class:`~.cost.AnalyticCost`) misses what decides real kernels: an untuned linear
loop nest with a fused epilogue, a reduction fused with what follows it, several primitives
whose loops fuse badly. :class:`ProfiledCost` keeps the roofline where it is tight and
measures the rest, within a budget:

* **What is profiled** (:func:`needs_profile`): a candidate of fusable primitives, not a lone
  view, whose analytic estimate is at least ``floor_s`` (below it the launch and call overhead
  dominate and a measurement is mostly noise), and of class ``linear`` (a linear primitive),
  ``reduce`` (a reduction) or ``fused`` (several primitives). A single elementwise or layout
  primitive (class ``simple``) is memory-bound with a regular access, which the calibrated
  roofline ranks well: it stays analytic.
* **One scale**: measured and estimated costs meet in one program, so the estimates must be
  on the measurements' scale: the :data:`SIMPLE_SAMPLES` largest ``simple`` primitives of an
  orchestration (above the floor) are timed first, and every other ``simple`` primitive costs
  its analytic estimate times their median measured/analytic ratio (1 before any sample).
* **Library candidates** (class ``library``: a native library call offered as an alternative
  of a heavy call, its epilogue folded or not, :func:`~.candidates.is_library_kernel`): built
  as a one-call module and timed like the others, with the library's calibrated estimate as
  their analytic cost (``estimates``, given by :class:`~.joint.JointCost`). They are few (at
  most a handful per heavy call) and each one decides between a vendor kernel and TVM's, so
  they are measured right after the samples, largest estimate first. Unmeasured ones keep
  their estimate scaled by the measured library calls' median ratio (else 1: the estimate is
  already the library's own calibration, not TVM's roofline).
* **Order**: those samples, the library candidates, then largest ``UNCERTAINTY[class] x
  analytic estimate`` first (:data:`UNCERTAINTY`: how far the roofline is typically off per
  class), so the budget goes where an error costs most time.
* **Budget**: ``profile_budget_s`` seconds of building and timing and ``profile_max_kernels``
  kernels per orchestration of a module, shared between its partitions in proportion to their
  primitives (a partition's unused share carries over). A kernel found in the cache is charged
  what measuring it cost the first time (kept with it), so a second orchestration of the same
  module stops at the same candidate and times nothing.
* **Measured cost**: ``launch + max(0, t - overhead)`` with ``t`` the untuned kernel's time
  through the VM (:func:`~.cost.build_and_time`, or ``rpc``) and ``overhead`` the time of a
  one-element kernel the same way (the VM call and output allocation, which a kernel inside
  a whole model does not pay alone); cached by structural hash in ``work_dir``
  (:class:`~.cost.MeasuredCost`) and in this process (a kernel is timed once per process
  even across work dirs: a second time would only add noise to the same decision).
* **Unmeasured** (past the budget): the analytic estimate times the median measured/analytic
  ratio of the measured candidates of its class in this orchestration, else of all measured
  candidates, else 1.
* **Failures**: a multi-primitive candidate or a library candidate that fails to build or run
  while profiled costs ``inf``: the selection bans it (a cut) and solves without it. A single
  primitive is built whatever its cost (it is the fallback of every plan): it keeps its
  scaled estimate and the failure is noted.

The statistics (profiled, from cache, failed, seconds, the measured/analytic ratios) are a
:class:`~.report.ProfileReport` in the orchestration report.
"""

from __future__ import annotations

import math
import time
from typing import Dict, List, Optional

import numpy as np

from ..codegen.builder import single_function_module, tensor_var
from ..compat import relax, tvm
from ..compile_profile import stage
from ..config import OrchestrateConfig
from ..target import normalize_target, target_kind
from .candidates import Candidate, is_library_kernel
from .cost import AnalyticCost, CostModel, KernelTimer, MeasuredCost
from .graph import PrimitiveGraph
from .report import ProfileReport

__all__ = ["ProfileLedger", "ProfiledCost", "SIMPLE_SAMPLES", "UNCERTAINTY", "cost_class",
           "forget_process_times", "make_cost", "needs_profile", "timeable"]

#: How far the roofline is typically off, per candidate class (a factor): untuned linear
#: loop nests most, reductions next, fused groups of memory-bound primitives less; a single
#: elementwise/layout primitive is what the ``eop`` efficiency was calibrated on.
UNCERTAINTY: Dict[str, float] = {"linear": 4.0, "reduce": 3.0, "fused": 2.0, "simple": 1.0,
                                 "library": 2.0}

#: ``simple`` primitives timed per orchestration to put their class on the measured scale.
SIMPLE_SAMPLES = 3

#: Caches of the runs without a work dir, per process (``{key: seconds}``, ``{key: spent}``).
_MEMORY: Dict[str, Dict[str, float]] = {"cache": {}, "spent": {}}


def forget_process_times() -> None:
    """Forget the kernels timed in this process without a work dir's cache (an ablation that
    compares profiling runs starts each from nothing)."""
    for table in _MEMORY.values():
        table.clear()


def cost_class(graph: PrimitiveGraph, cand: Candidate) -> str:
    """``library`` (a native library call alone), ``linear`` (holds a linear primitive),
    ``reduce`` (a reduction), ``fused`` (several primitives), else ``simple``."""
    if is_library_kernel(graph, cand):
        return "library"
    kinds = {graph.nodes[i].kind for i in cand.nodes}
    if "linear" in kinds:
        return "linear"
    if "reduce" in kinds:
        return "reduce"
    return "fused" if cand.size > 1 else "simple"


def timeable(graph: PrimitiveGraph, cand: Candidate, analytic_s: float,
             floor_s: float) -> bool:
    """Fusable primitives only (or a library call alone), not a lone view, an estimate of at
    least ``floor_s``: a kernel whose measurement means something."""
    nodes = [graph.nodes[i] for i in cand.nodes]
    if is_library_kernel(graph, cand):
        return analytic_s >= floor_s
    if not all(n.fusable for n in nodes) or (cand.size == 1 and nodes[0].view):
        return False
    return analytic_s >= floor_s


def needs_profile(graph: PrimitiveGraph, cand: Candidate, analytic_s: float,
                  floor_s: float) -> bool:
    """The module docstring's rule: :func:`timeable` and of a class other than ``simple``."""
    return timeable(graph, cand, analytic_s, floor_s) and cost_class(graph, cand) != "simple"


def _overhead_module() -> "tvm.IRModule":
    """A one-element negation as a fused one-kernel module: what timing any kernel alone
    costs beyond the kernel."""
    mod = single_function_module([tensor_var("x", (1,))],
                                 lambda bb, x: relax.op.negative(x))
    return relax.transform.LegalizeOps()(mod)


class _Budget:
    """Seconds and kernels left, shared between partitions by their primitives."""

    def __init__(self, seconds: float, kernels: int):
        self.seconds, self.kernels = float(seconds), int(kernels)
        self.primitives = 0  # primitives not yet costed (0: unknown, everything now)

    def share(self, primitives: int) -> tuple:
        """``(seconds, kernels)`` this partition of ``primitives`` primitives may spend."""
        part = 1.0 if self.primitives <= primitives else primitives / self.primitives
        self.primitives = max(0, self.primitives - primitives)
        return self.seconds * part, max(1, round(self.kernels * part)) if self.kernels else 0

    def charge(self, seconds: float, kernels: int = 1) -> None:
        """One kernel measured (or found in the cache), taking ``seconds``."""
        self.seconds -= seconds
        self.kernels -= kernels


class ProfileLedger:
    """One profiling budget for the orchestrations of one build (the joint build's plans,
    :mod:`tvm_ollie.pipeline.joint_plans`), instead of a full budget for each.

    Each orchestration (a plan) opens an :meth:`account` holding an equal share of what is
    left (``n``: the orchestrations still to run, this one included; unused shares carry over
    to the next), and a kernel charged to an earlier plan of the build is free for the later
    ones (they read its time from the cache at no cost). So the build profiles the union of its
    plans' candidates within one budget, as Korch profiles each distinct kernel once::

        account(plan, n) = (seconds left / n, kernels left / n)
        charge(key, s)   = 0 if another plan of the build was charged key, else s

    Why: the joint build orchestrates up to four related modules (the joint, refined,
    sequential and orchestration-only plans); with a full budget each, profiling was 61-72% of
    BERT quick's joint compile time (docs/orchestration.md). Deterministic: a plan
    orchestrated again (the tuned build's kept plan) gets the same account and charges its
    own kernels as the first time, and a second build reads every kernel from the cache,
    charged what measuring it cost, and stops where the first did.
    """

    def __init__(self, seconds: float, kernels: int):
        self.seconds, self.kernels = float(seconds), int(kernels)
        self.owner: Dict[str, str] = {}  # kernel key -> the plan first charged for it
        self.accounts: Dict[str, "_Account"] = {}

    def account(self, plan: str, orchestrations: int = 1) -> "_Account":
        """``plan``'s account: its share of what is left of ``orchestrations`` still to run
        (the same one when the plan is orchestrated again)."""
        if plan not in self.accounts:
            n = max(1, int(orchestrations))
            self.accounts[plan] = _Account(self, plan, max(0.0, self.seconds) / n,
                                           max(0, round(self.kernels / n)))
        return self.accounts[plan]


class _Account:
    """A plan's share of a :class:`ProfileLedger` (``seconds``, ``kernels``)."""

    def __init__(self, ledger: ProfileLedger, plan: str, seconds: float, kernels: int):
        self.ledger, self.plan, self.seconds, self.kernels = ledger, plan, seconds, kernels
        self.keys: set = set()  # the kernels this plan was charged for

    def charge(self, key: str, seconds: float) -> bool:
        """Whether measuring (or reading back) kernel ``key`` is charged to this plan (False:
        another plan of the build was; the ledger is debited once per kernel)."""
        owner = self.ledger.owner.setdefault(key, self.plan)
        if owner != self.plan:
            return False
        if key not in self.keys:
            self.keys.add(key)
            self.ledger.seconds -= seconds
            self.ledger.kernels -= 1
        return True


class ProfiledCost(CostModel):
    """Measured costs where the roofline is loose, analytic elsewhere (module docstring).

    Parameters
    ----------
    target : str | dict | Target
        Build and timing target.
    config : OrchestrateConfig
        ``profile_budget_s``, ``profile_max_kernels``, ``profile_floor_s``, ``work_dir``,
        ``rpc``.
    analytic : CostModel, optional
        The estimate (default :class:`~.cost.AnalyticCost` of ``target``).
    timer : KernelTimer, optional
        Builds and times one fused kernel module (default
        :func:`~.cost.build_and_time`; tests give a fake).
    overhead_s : float, optional
        The timing overhead to subtract; None: measured once (and cached).
    account : optional
        This orchestration's share of a build's budget (:meth:`ProfileLedger.account`),
        spent instead of ``config``'s full budget; kernels another plan of the build was
        charged are free.
    """

    name = "profiled"
    #: library calls alone are built and timed (:class:`~.joint.JointCost` passes their
    #: estimates instead of fixing their cost)
    times_library = True

    def __init__(self, target="llvm", config: OrchestrateConfig = OrchestrateConfig(),
                 analytic: Optional[CostModel] = None, timer: Optional[KernelTimer] = None,
                 overhead_s: Optional[float] = None, account: Optional[_Account] = None):
        self.target = target
        self.analytic = analytic or AnalyticCost(target)
        self.launch_s = getattr(self.analytic, "launch_s", 0.0)
        self.floor_s = float(config.profile_floor_s)
        self.measured = MeasuredCost(target, config.work_dir, rpc=config.rpc, timer=timer)
        # the process's times (a fake timer's stay its own)
        self.memory = _MEMORY if timer is None else {"cache": {}, "spent": {}}
        self.account = account
        seconds, kernels = (account.seconds, account.kernels) if account is not None else \
            (config.profile_budget_s, config.profile_max_kernels)
        self.budget = _Budget(seconds, kernels)
        self.overhead_s = overhead_s
        self.stats = ProfileReport(budget_s=float(seconds), max_kernels=int(kernels),
                                   rpc=config.rpc is not None)
        self._ratios: Dict[str, List[float]] = {}
        # costs already given, by (graph, candidate): a fallback plan's singletons asked again
        # are neither re-costed nor counted twice
        self._known: Dict[tuple, tuple] = {}

    def expect(self, primitives: int) -> None:
        """The module has about ``primitives`` primitives to cost (shares the budget)."""
        self.budget.primitives = int(primitives)

    def kernel_seconds(self, graph: PrimitiveGraph, cand: Candidate) -> float:
        known = self._known.get((id(graph), cand.mask))
        if known is not None and known[0] is graph:
            return known[1]
        return self.costs(graph, [cand])[0]

    def costs(self, graph: PrimitiveGraph, cands, estimates: Optional[Dict[int, float]] = None
              ) -> list:
        """Seconds of every candidate (module docstring); ``estimates``: node -> analytic
        seconds of the library calls among them (the library's calibrated estimate).

        A candidate this model costed before for ``graph`` keeps that cost: one graph's costs
        must not move between calls. :class:`~.joint.JointCost` costs each alternative's
        nodes alone first (its corrections are differences of those costs) and the whole
        partition later; the budget spent in between, a node measured first was priced at
        its scaled estimate the second time (Segformer quick: a TVM convolution measured at
        4.3 ms, then scaled to 0.55 ms, kept its 1.6 ms correction and beat the library
        kernel the Decider had measured 45x faster; the joint plan ran 3x slower)."""
        cands = list(cands)
        known = [self._known.get((id(graph), c.mask)) for c in cands]
        known = [k[1] if k is not None and k[0] is graph else None for k in known]
        if any(k is not None for k in known):
            new = iter(self._costs(graph, [c for c, k in zip(cands, known) if k is None],
                                   estimates))
            return [next(new) if k is None else k for k in known]
        return self._costs(graph, cands, estimates)

    def _costs(self, graph: PrimitiveGraph, cands: list,
               estimates: Optional[Dict[int, float]]) -> list:
        if not cands:
            return []
        analytic = self.analytic.costs(graph, cands)
        classes = [cost_class(graph, c) for c in cands]
        offered = set()
        for k, c in enumerate(cands):
            if classes[k] == "library" and estimates and c.nodes[0] in estimates:
                analytic[k] = estimates[c.nodes[0]]
                offered.add(k)
        out = list(analytic)
        # a library call that is no alternative (the derivation put it there) is chosen anyway
        timed = [k for k, c in enumerate(cands) if timeable(graph, c, analytic[k], self.floor_s)
                 and (classes[k] != "library" or k in offered)]
        eligible = [k for k in timed if classes[k] != "simple"]
        simple = [k for k in timed if classes[k] == "simple"]
        samples = sorted(simple, key=lambda k: -analytic[k])[:max(0, SIMPLE_SAMPLES
                                                                   - self.stats.samples)]
        self.stats.candidates += len(cands)
        self.stats.eligible += len(eligible) + len(samples)
        first = sorted((k for k in eligible if classes[k] == "library"),
                       key=lambda k: -analytic[k])
        order = samples + first + sorted((k for k in eligible if classes[k] != "library"),
                                         key=lambda k: -UNCERTAINTY[classes[k]] * analytic[k])
        nodes = set()
        for c in cands:
            nodes.update(c.nodes)
        seconds, kernels = self.budget.share(len(nodes))
        done = set()
        for k in order:
            if seconds <= 0 or kernels <= 0:
                self.stats.stopped = "budget"
                break
            charged = self._profile(graph, cands[k], analytic[k], out, k)
            if charged is None:
                continue  # not profiled (does not fuse alone): scaled below
            spent, counted = charged
            seconds, kernels = seconds - spent, kernels - counted
            self.budget.charge(spent, counted)
            done.add(k)
            self.stats.samples += classes[k] == "simple"
            self.stats.library += classes[k] == "library"
        for k in eligible:
            if k not in done:
                out[k] = analytic[k] * self._ratio(classes[k])
                self.stats.scaled += 1
        for k in simple:
            if k not in done:
                out[k] = analytic[k] * self._ratio("simple")
        for cand, value in zip(cands, out):
            self._known[(id(graph), cand.mask)] = (graph, value)
        return out

    def _profile(self, graph: PrimitiveGraph, cand: Candidate, analytic_s: float,
                 out: list, k: int) -> Optional[tuple]:
        """Measure (or look up) ``cand`` into ``out[k]``; the budget ``(seconds, kernels)``
        it is charged (``(0, 0)``: measured for another plan of the build), None when it
        cannot be built alone (then it is left to the scaled estimate)."""
        try:
            key, fused = self.measured.prepare(graph, cand)
        except Exception:  # pylint: disable=broad-except
            return None  # the selection's own check bans it if it is chosen
        if self._recall(key):
            self.stats.cached += 1
            seconds = self.measured.cache[key]
        else:
            start = time.perf_counter()
            with stage("orchestration profiling"):
                try:
                    seconds = self.measured.measure(key, fused)
                except Exception as err:  # pylint: disable=broad-except
                    seconds = math.inf
                    self._note_failure(graph, cand, err)
            self.stats.profiled += 1
            self.stats.profile_s += time.perf_counter() - start
            self._remember(key)
        spent, counted = self.measured.spent.get(key, 0.0), 1
        if self.account is not None and not self.account.charge(key, spent):
            spent, counted = 0.0, 0
        if not math.isfinite(seconds):
            self.stats.failed += 1
            # a single primitive is built whatever it costs: keep its (scaled) estimate;
            # a library call is an alternative, not a fallback: banned like a fused kernel
            cls = cost_class(graph, cand)
            out[k] = math.inf if cand.size > 1 or cls == "library" else \
                analytic_s * self._ratio(cls)
            return spent, counted
        cost = self.launch_s + max(0.0, seconds - self._overhead())
        out[k] = cost
        ratio = cost / analytic_s if analytic_s > 0 else 1.0
        self._ratios.setdefault(cost_class(graph, cand), []).append(ratio)
        self.stats.ratios.append(ratio)
        return spent, counted

    def _recall(self, key: str) -> bool:
        """Whether ``key`` was measured (in the work dir, or earlier in this process: then
        copied into the work dir's cache)."""
        if key in self.measured.cache:
            return True
        if key not in self.memory["cache"]:
            return False
        self.measured.cache[key] = self.memory["cache"][key]
        self.measured.spent[key] = self.memory["spent"].get(key, 0.0)
        self.measured._save()  # pylint: disable=protected-access
        return True

    def _remember(self, key: str) -> None:
        self.memory["cache"][key] = self.measured.cache[key]
        self.memory["spent"][key] = self.measured.spent.get(key, 0.0)

    def _note_failure(self, graph: PrimitiveGraph, cand: Candidate, err: Exception) -> None:
        names = "+".join(graph.nodes[i].name for i in cand.nodes)
        first = str(err).splitlines()[0][:160] if str(err) else ""
        if len(self.stats.failures) < 8:
            self.stats.failures.append(f"{names}: {type(err).__name__}: {first}")

    def _overhead(self) -> float:
        """Seconds of timing a one-element kernel (measured once per target, cached)."""
        if self.overhead_s is None:
            rpc = self.measured.rpc
            key = f"{target_kind(self.target)}{f'@rpc:{rpc.key}' if rpc else ''}" \
                  f":timing-overhead"
            if not self._recall(key):
                start = time.perf_counter()
                with stage("orchestration profiling"):
                    try:
                        self.measured.measure(key, _overhead_module())
                    except Exception as err:  # pylint: disable=broad-except
                        self.measured.cache[key] = 0.0
                        self.stats.failures.append(f"timing overhead (taken as 0): "
                                                   f"{type(err).__name__}: {err}"[:200])
                self.stats.profile_s += time.perf_counter() - start
                self._remember(key)
            value = self.measured.cache[key]
            self.overhead_s = value if math.isfinite(value) else 0.0
        self.stats.overhead_s = self.overhead_s
        return self.overhead_s

    def _ratio(self, cls: str) -> float:
        """Median measured/analytic ratio of the class, else of all (except for ``simple``
        and ``library``: their own or nothing), else 1."""
        ratios = self._ratios.get(cls)
        if not ratios and cls not in ("simple", "library"):
            ratios = [r for rs in self._ratios.values() for r in rs]
        return float(np.median(ratios)) if ratios else 1.0


def _is_local_or_reachable(target, rpc) -> bool:
    """Whether a kernel of ``target`` can be timed: through ``rpc``, or a local device of its
    kind (the CPU; a GPU present here)."""
    if rpc is not None:
        return True
    tgt = normalize_target(target)
    if target_kind(tgt) == "llvm":
        return True
    dev = tvm.device(target_kind(tgt), 0)
    return bool(dev.exist)


def make_cost(target, config: OrchestrateConfig, note: Optional[list] = None,
              account: Optional[_Account] = None) -> CostModel:
    """The cost model ``config.costs`` asks for: :class:`ProfiledCost` (when kernels of
    ``target`` can be timed here or through ``config.rpc``; otherwise the analytic cost, with
    a line in ``note``; ``account``: its share of a build's budget), or
    :class:`~.cost.AnalyticCost`."""
    if config.costs == "profiled":
        if _is_local_or_reachable(target, config.rpc):
            return ProfiledCost(target, config, account=account)
        if note is not None:
            note.append(f"no {target_kind(target)} device here and no rpc: analytic kernel "
                        f"costs instead of profiled ones")
    return AnalyticCost(target)
