"""One frozen configuration for every entry point: :class:`OllieConfig`.

The options of a run (target, derivation limits, trial budget, work dir, which implementations
compete, orchestration) used to be keyword arguments repeated, with drifting defaults, by the
CLI, :func:`~tvm_ollie.pipeline.build`, :func:`~tvm_ollie.transform.optimize_module`, the
``"ollie"`` pipeline, :class:`~tvm_ollie.transform.OllieOptimize`, the demo and the tuner. They
now live here, once; every entry point takes ``config=`` and keywords that override its fields
(validated by :meth:`OllieConfig.replace`; an unknown name is a :class:`ConfigError`)::

    cfg = OllieConfig(trials=64, work_dir="db", max_depth=5)
    ex, report = build(mod, "llvm", config=cfg)
    ex = tvm.compile(mod, "llvm", relax_pipeline=relax.get_pipeline("ollie", config=cfg))
    with config_scope(cfg):                    # what PassContext(config=...) would have done
        ex = tvm.compile(mod, "llvm", relax_pipeline="ollie")

TVM 0.27 rejects ``PassContext(config={...})`` keys that C++ did not register, and Python
cannot register any (``transform.ListConfigs`` is fixed when ``libtvm`` loads), so a
``PassContext`` cannot carry these options: :func:`config_scope` is the scoped equivalent that
the pass reads when it is given no explicit config.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional, Tuple

__all__ = ["ConfigError", "OllieConfig", "OrchestrateConfig", "DEFAULTS", "config_scope",
           "current_config", "resolve_config"]


class ConfigError(ValueError):
    """An invalid option (the message is one line naming the option)."""


@dataclass(frozen=True)
class OrchestrateConfig:
    """Limits of orchestration (one frozen object that travels through the pass; also
    importable as ``tvm_ollie.orchestrate.OrchestrateConfig``).

    ``max_kernel_size`` primitives per kernel; ``max_candidates`` per partition enumeration;
    ``time_limit_s`` per binary program; partitions of ``min_partition_nodes`` to
    ``max_partition_nodes`` primitives (:func:`tvm_ollie.orchestrate.partition.partition`),
    split in two while they have more than ``max_partition_candidates`` candidates;
    ``max_rounds`` solves per partition when chosen kernels fail their check or form a cycle.
    ``solver(problem, time_limit_s) -> BLPResult`` (a
    :class:`~tvm_ollie.orchestrate.blp.BLPProblem` in, a
    :class:`~tvm_ollie.orchestrate.blp.BLPResult` out) replaces
    :func:`tvm_ollie.orchestrate.blp.solve_blp` (None: HiGHS), so that a solver that times out
    or finds nothing can be given through the public pipeline (the fault tests do; the build
    then keeps the primitives as single kernels and says why).

    Kernel costs (:mod:`tvm_ollie.orchestrate.profiled`): ``costs="profiled"`` builds and
    times, untuned, the candidates the roofline cannot bound tightly (the rule is
    :func:`~tvm_ollie.orchestrate.profiled.needs_profile`: not a view, an analytic estimate of
    at least ``profile_floor_s``, and a linear or reduction primitive or several primitives),
    largest uncertainty x estimate first, until ``profile_budget_s`` seconds of building and
    timing or ``profile_max_kernels`` kernels are spent; the rest keep the analytic cost
    scaled by the measured/analytic ratio of their class. ``costs="analytic"``: the roofline
    only. Times are cached by structural hash in ``work_dir`` (None: in this process only),
    and taken through ``rpc`` (a :class:`~tvm_ollie.tune.rpc.RPCConfig`) when given.
    """

    max_kernel_size: int = 8
    max_candidates: int = 3000
    time_limit_s: float = 10.0
    max_partition_nodes: int = 128
    min_partition_nodes: int = 48
    max_partition_candidates: int = 1000
    max_rounds: int = 4
    solver: Optional[Callable[[Any, float], Any]] = None
    costs: str = "profiled"
    profile_budget_s: float = 60.0
    profile_max_kernels: int = 256
    profile_floor_s: float = 5e-6
    work_dir: Optional[str] = None
    rpc: Any = None

    def __post_init__(self):
        if self.costs not in ("profiled", "analytic"):
            raise ConfigError(f"OrchestrateConfig.costs must be 'profiled' or 'analytic', not "
                              f"{self.costs!r}")
        if self.work_dir is not None and not isinstance(self.work_dir, str):
            object.__setattr__(self, "work_dir", str(self.work_dir))  # a pathlib.Path


@dataclass(frozen=True)
class OllieConfig:
    """Every option of a tvm-ollie run, with its one default.

    Attributes
    ----------
    target : str | dict | Target, optional
        Compilation target; None: ``Target.current()`` when the pass runs, else llvm.
    trials : int
        MetaSchedule trials for the whole module (0: no tuning, the calibrated cost model
        decides). One budget, shared by the decisions' tuned measurements and the final build
        by expected gain (:mod:`tvm_ollie.tune.budget`); the report says how it was spent.
    work_dir : str, optional
        MetaSchedule database and measurement cache (reused by later compiles).
    max_depth : int
        Derivation depth (explorative rule steps on a path).
    search_time_s : float
        Derivation time for the whole module, shared by its distinct operator signatures in
        proportion to their estimated time (each gets at least :data:`MIN_SEARCH_S`; what a
        search that stops early leaves flows on to the next).
    search_payback_runs : float
        The module's search time is at most this many runs of what its searches could gain
        (each signature's best known estimate less its roofline bound:
        :class:`tvm_ollie.tune.budget.SearchPayback`), and each search stops once its seconds
        reach this many runs of what is left to gain (``paid_back``:
        :class:`tvm_ollie.derive.search.CostBound`); ``math.inf``: ``search_time_s`` always.
    min_share : float
        A signature whose calls' estimated time is below this share of the module's is not
        decided (not searched, checked, built or timed: "skipped: too small to matter",
        :class:`tvm_ollie.tune.budget.SmallUnitGuard`); 0 decides every one.
    max_states : int, optional
        Derivation states visited per signature (None: only the time limits).
    max_candidates : int, optional
        Derived programs kept per signature (cheapest of each operator kind first; None: all).
    max_measured : int
        Alternatives (cheapest first) verified and measured per signature when measuring.
    targets : tuple of str, optional
        Relax operators the pass considers (``("relax.nn.conv2d",)``); None: all derivable.
    library : bool, optional
        Native library kernels as alternatives (None: on CPU targets when the library is
        loaded; False: TVM kernels only).
    derive : bool
        Derived programs as alternatives (False: the ``ollie-lib`` ablation).
    fold_inference : bool
        Before deciding, fold inference-mode batch norms into the convolutions (and matmuls)
        before them, write ``x * sigmoid(x)`` as SiLU and the exporters' spellings of GELU,
        ReLU6, hard-swish, hard-sigmoid and leaky ReLU as one activation each
        (:mod:`tvm_ollie.transform.inference_fold`, :mod:`tvm_ollie.transform.activations`),
        so that the native kernels take the bias and activation as epilogues. False: the
        module as imported.
    check_untuned : bool, optional
        With ``trials=0``, also time the original and accepted candidates untuned (None: on
        for CPU targets unless ``calibration`` is given).
    region_calls : int
        Most calls in one region decided as a whole (1: every call alone).
    merge_group : int
        Most independent matmuls / convs reading one input decided as one group (a merged
        GEMM over concatenated weights competes with them; below 2: no groups).
    orchestrate : bool
        Fission and kernel orchestration instead of TVM's greedy fusion (with ``trials``, the
        chosen kernels are tuned).
    joint : bool
        With ``orchestrate`` (local builds; with ``trials`` where the target can be tuned
        here): the derivation alternatives of every heavy call and the kernel boundaries are
        chosen by one selection (:mod:`tvm_ollie.pipeline.joint_plans`).
    joint_guard : bool
        With ``joint`` on a target that runs here (local CPU): also build the refined,
        sequential (derive, then orchestrate), derivation-only and orchestration-only plans
        from the joint build's decisions and the module as given by TVM alone, time them
        whole on the same inputs and keep the fastest (:mod:`tvm_ollie.pipeline.guard`;
        ``report.plans`` says which; with ``trials``, the rest of the budget then tunes the
        kept plan). False: the joint plan as selected, no extra builds.
    model_guard : bool, optional
        Never slower than TVM alone for the whole model: when the pass rewrote something
        (sequential build, on a target that runs here: the local CPU or a GPU present here;
        not with ``rpc``), also build the module as given the same way, time both whole under
        the guard's protocol (:mod:`tvm_ollie.pipeline.guard`) and keep the rewrite only when
        it computes the same and is separated faster; otherwise TVM's build is kept and every
        decision is reported reverted (``report.model_guard`` says why). Decisions are timed
        one unit at a time, and their sum can lose. None: on unless ``calibration`` is given
        (a calibration asks for reproducible decisions, and the guard's outcome depends on
        the machine's load); True: on wherever timing is possible; False: off.
    orchestration : OrchestrateConfig, optional
        Limits of orchestration (:class:`OrchestrateConfig`; None: its defaults).
    calibration : Calibration, optional
        Analytic cost calibration (None: measured for the target; give one for reproducible
        decisions).
    rpc : RPCConfig, optional
        Measure on the devices behind this RPC tracker (builds stay local).
    verbose : bool
        Log the report at INFO level.
    dtype : str, optional
        ``"float16"``: the model is converted by TVM's ``ToMixedPrecision`` before the pass
        (:func:`tvm_ollie.transform.precision.to_precision`); None or ``"float32"``: as given.
    blocked_layout : bool
        After the rewrite, keep chains of native convolutions (linked directly or through
        elementwise operators) in the activation format oneDNN prefers on this CPU, with
        layout transforms only at a chain's entries and exits
        (:mod:`tvm_ollie.transform.blocked_layout`, docs/layouts.md); CPU targets with the
        native library only.
    pack_weights : bool
        With ``blocked_layout``: also pack the constant weights of the chains' convolutions
        into oneDNN's format at compile time, so that no call reorders them. A pack is made for
        this machine (CPU and thread count); where the module runs on another, or with another
        thread count, the kernel reorders it from the oneDNN format named in its header on
        every call, as it does unpacked weights (docs/layouts.md).
    norm_kernels : bool
        Before the decisions, replace every instance normalization (Relax's
        ``nn.instance_norm`` or the ONNX importer's mean/variance decomposition) by the native
        library's ``tvm_ollie.cpu.instance_norm``, its residual add and activation folded in
        (:mod:`tvm_ollie.transform.norm_kernels`), and every softmax over the last axis by
        ``tvm_ollie.cpu.softmax`` (:mod:`tvm_ollie.transform.softmax_kernel`); after the
        layout step, every bilinear or nearest ``image.resize2d``, with the concatenation it
        feeds and the layout transform after that, by ``tvm_ollie.cpu.resize2d``
        (:mod:`tvm_ollie.transform.resize_kernel`); CPU targets with the native library
        only.
    library_plan : bool
        The whole-model guard (``model_guard``) also builds and times the library plan: every
        operator the native library has on its kernel (no derivation), chains of
        convolutions in oneDNN's format (``blocked_layout``), and keeps it when it is the
        fastest whole (:mod:`tvm_ollie.pipeline.build`). CPU targets with the native library
        only. The per-unit decisions cannot see what a whole chain of library calls gains
        (layouts kept across it, no hand-over between oneDNN's and TVM's threads), so this plan
        can win although it lost unit by unit.
    cached_alloc : bool
        CPU targets: allocate a static-shape function's planned intermediate memory once per
        virtual machine and reuse it at every call, instead of allocating and freeing every
        storage and tensor view at each call (:mod:`tvm_ollie.codegen.cached_alloc`; needs the
        native library's ``tvm_ollie.vm.cached_alloc``). A VM then serves one call at a time,
        as TVM's VM does anyway; returned tensors are still allocated per call. On by default
        since 2026-12-04: the 2x slower quick Segformer that had turned it off was the build,
        not the cache (it ran 1.61 ms with the cache off too), and exported library plans run
        1.8-6.7% faster with it at the 10th percentile (ResNet-18, YOLOX, Segformer;
        docs/per-call.md). ``library=False`` turns it off (its executable runs without the
        native library, which holds the builtin).
    derivation_cache : bool
        Reuse derivation search results across compiles and models (in ``work_dir`` and the
        per-user cache, :mod:`tvm_ollie.derive.cache`); False: search every signature.
    build_pool : bool, optional
        Build the decisions' candidate modules in worker processes, one part per worker at
        once, and the guard's library plan beside the rewritten module
        (:mod:`tvm_ollie.transform.build_pool`): None when the module has at least
        :data:`~tvm_ollie.transform.build_pool.MIN_UNITS` signatures to decide and this
        process may run on two CPUs or more; True whenever it may; False (default) never.
        A worker builds under the caller's ``cached_alloc`` switch (sent with each module),
        so the guard's library plan goes to the pool under the default config too.
        Off by default: on the loaded 2-core machine it made GCN's cold build slower
        (docs/compile-time.md, helper cold9); not measured on a quiet machine yet.
    build_together : bool
        Prepare each run of a module's decisions (units that overlap nothing rewritten nor
        each other) one after the other (search, shortlist) and build their merged modules
        together, up to :data:`~tvm_ollie.transform.batched.TOGETHER` decisions in one TVM
        build (:class:`~tvm_ollie.transform.batched.BuildGroup`), before checking and timing
        each; the same decisions, fewer builds
        (docs/compile-time.md, cold15). False: each decision builds its own when decided.
    """

    target: Any = None
    trials: int = 0
    work_dir: Optional[str] = None
    max_depth: int = 7
    search_time_s: float = 20.0
    search_payback_runs: float = 100_000
    min_share: float = 0.01
    max_states: Optional[int] = 2000
    max_candidates: Optional[int] = None
    max_measured: int = 3
    targets: Optional[Tuple[str, ...]] = None
    library: Optional[bool] = None
    derive: bool = True
    fold_inference: bool = True
    check_untuned: Optional[bool] = None
    region_calls: int = 16
    merge_group: int = 4
    orchestrate: bool = False
    joint: bool = False
    joint_guard: bool = True
    model_guard: Optional[bool] = None
    orchestration: Optional[OrchestrateConfig] = None
    calibration: Any = None
    rpc: Any = None
    verbose: bool = False
    dtype: Optional[str] = None
    derivation_cache: bool = True
    blocked_layout: bool = True
    pack_weights: bool = True
    norm_kernels: bool = True
    library_plan: bool = True
    cached_alloc: bool = True
    build_pool: Optional[bool] = False
    build_together: bool = True

    def __post_init__(self):
        if self.targets is not None and not isinstance(self.targets, tuple):
            targets = (self.targets,) if isinstance(self.targets, str) else self.targets
            object.__setattr__(self, "targets", tuple(targets))
        self.validate()
        if self.library is False and self.cached_alloc:
            # library=False promises an executable that runs without the native library; the
            # cached memory's builtin is in it, so that promise turns the cache off
            object.__setattr__(self, "cached_alloc", False)

    def validate(self) -> None:
        """Raise :class:`ConfigError` (one line) on the first invalid option."""
        _int(self, "trials", 0)
        _int(self, "max_depth", 0)
        _int(self, "max_measured", 0)
        _int(self, "region_calls", 1)
        _int(self, "merge_group", 0)
        _int(self, "max_states", 1, optional=True)
        _int(self, "max_candidates", 1, optional=True)
        if isinstance(self.search_time_s, bool) or not isinstance(
                self.search_time_s, numbers.Real) or not self.search_time_s > 0:
            raise ConfigError(f"OllieConfig.search_time_s must be a number > 0, not "
                              f"{self.search_time_s!r}")
        if isinstance(self.search_payback_runs, bool) or not isinstance(
                self.search_payback_runs, numbers.Real) or not self.search_payback_runs > 0:
            raise ConfigError(f"OllieConfig.search_payback_runs must be a number > 0, not "
                              f"{self.search_payback_runs!r}")
        if isinstance(self.min_share, bool) or not isinstance(
                self.min_share, numbers.Real) or not 0 <= self.min_share < 1:
            raise ConfigError(f"OllieConfig.min_share must be a number in [0, 1), not "
                              f"{self.min_share!r}")
        for name in ("derive", "fold_inference", "orchestrate", "joint", "joint_guard",
                     "verbose", "derivation_cache", "blocked_layout",
                     "pack_weights", "norm_kernels", "library_plan", "cached_alloc",
                     "build_together"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"OllieConfig.{name} must be True or False, not "
                                  f"{getattr(self, name)!r}")
        for name in ("library", "check_untuned", "model_guard", "build_pool"):
            if not any(getattr(self, name) is v for v in (None, True, False)):
                raise ConfigError(f"OllieConfig.{name} must be None, True or False, not "
                                  f"{getattr(self, name)!r}")
        if self.work_dir is not None and not isinstance(self.work_dir, str):
            object.__setattr__(self, "work_dir", str(self.work_dir))  # a pathlib.Path
        if self.dtype not in (None, "float32", "float16"):
            raise ConfigError(f"OllieConfig.dtype must be None, 'float32' or 'float16', not "
                              f"{self.dtype!r}")
        if self.targets is not None and not all(isinstance(t, str) for t in self.targets):
            raise ConfigError(f"OllieConfig.targets must be operator names, not "
                              f"{self.targets!r}")

    def replace(self, **changes: Any) -> "OllieConfig":
        """A copy with ``changes`` applied (validated; an unknown name is a
        :class:`ConfigError`)."""
        _check_names(changes)
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> "OllieConfig":
        """A config from ``{name: value}``; names may carry an ``ollie.`` prefix (the form a
        ``PassContext`` key would have), ``orchestration`` may be a dict of its fields."""
        opts = {(k[len("ollie."):] if k.startswith("ollie.") else k): v
                for k, v in options.items()}
        _check_names(opts)
        orch = opts.get("orchestration")
        if isinstance(orch, Mapping):
            try:
                opts["orchestration"] = OrchestrateConfig(**orch)
            except TypeError as err:
                raise ConfigError(f"OllieConfig.orchestration: {err}") from None
        return cls(**opts)

    def to_dict(self) -> dict:
        """The options as a flat dict (objects such as ``rpc`` kept as they are)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def orchestrate_config(self) -> OrchestrateConfig:
        """:attr:`orchestration`, or the orchestration defaults; its ``work_dir`` and ``rpc``
        default to this config's (the profiled kernel costs are cached and timed there)."""
        orch = self.orchestration if self.orchestration is not None else OrchestrateConfig()
        fill = {k: getattr(self, k) for k in ("work_dir", "rpc")
                if getattr(orch, k) is None and getattr(self, k) is not None}
        return dataclasses.replace(orch, **fill) if fill else orch


#: Least derivation time per signature, however small its share of the module's estimated
#: time: enough to find the forms the lifted rule tests expect (``docs/compile-time.md``: on the
#: shared 2-core machine at load 7 they came after 0.001-1.7 s, one transposed convolution's
#: after 3.4 s).
MIN_SEARCH_S = 2.0

#: Former names of config fields, still accepted as keywords of the entry points (with a
#: :class:`DeprecationWarning`) for one release: ``{old name: field}``.
KEYWORD_ALIASES = {"time_budget_s": "search_time_s", "search_budget_s": "search_time_s"}

_SCOPE: contextvars.ContextVar = contextvars.ContextVar("tvm_ollie_config", default=None)


def current_config() -> OllieConfig:
    """The config of the innermost :func:`config_scope`, else :data:`DEFAULTS`."""
    return _SCOPE.get() or DEFAULTS


@contextlib.contextmanager
def config_scope(config: Optional[OllieConfig] = None, **changes: Any) -> Iterator[OllieConfig]:
    """Within the block, entry points given no ``config=`` use ``config`` (with ``changes``;
    default: the enclosing scope's config with ``changes``). Nested scopes stack."""
    cfg = (config if config is not None else current_config())
    cfg = cfg.replace(**changes) if changes else cfg
    if not isinstance(cfg, OllieConfig):
        raise ConfigError(f"config_scope needs an OllieConfig, not {type(cfg).__name__}")
    token = _SCOPE.set(cfg)
    try:
        yield cfg
    finally:
        _SCOPE.reset(token)


def resolve_config(config: Optional[OllieConfig] = None, **overrides: Any) -> OllieConfig:
    """``config`` (or :func:`current_config`) with every override that is not None applied.

    This is how the entry points take their keywords: ``build(mod, trials=8)`` is
    ``build(mod, config=current_config().replace(trials=8))``. None means "from the config"
    (for ``library``/``check_untuned``/``work_dir``, whose None is also a value, set the
    config field instead); an unknown name is a :class:`ConfigError`, a former name
    (:data:`KEYWORD_ALIASES`) a :class:`DeprecationWarning`.
    """
    if config is None:
        config = current_config()
    elif isinstance(config, Mapping):
        config = OllieConfig.from_dict(config)
    elif not isinstance(config, OllieConfig):
        raise ConfigError(f"config must be an OllieConfig or a dict, not "
                          f"{type(config).__name__}")
    changes = {}
    for keyword, value in overrides.items():  # (a loop: the warning's stack level is fixed)
        if value is not None:
            changes[_field_name(keyword)] = value
    return config.replace(**changes) if changes else config


def _field_name(keyword: str) -> str:
    """The config field a keyword names (a former name warns: :data:`KEYWORD_ALIASES`)."""
    field = KEYWORD_ALIASES.get(keyword)
    if field is None:
        return keyword
    # stacklevel: the caller of the entry point that resolves its options
    warnings.warn(f"{keyword}= is deprecated; use {field}=", DeprecationWarning, stacklevel=4)
    return field


def _check_names(changes: Mapping[str, Any]) -> None:
    names = {f.name for f in dataclasses.fields(OllieConfig)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise ConfigError(f"unknown OllieConfig option {unknown[0]!r} (options: "
                          f"{', '.join(sorted(names))})")


def _int(cfg: OllieConfig, name: str, least: int, optional: bool = False) -> None:
    value = getattr(cfg, name)
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        what = f"an int >= {least}" + (" or None" if optional else "")
        raise ConfigError(f"OllieConfig.{name} must be {what}, not {value!r}")


#: The defaults (``OllieConfig()``): the one place every entry point takes them from.
DEFAULTS = OllieConfig()
