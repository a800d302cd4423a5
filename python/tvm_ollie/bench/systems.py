"""The systems a benchmark compares, in a registry keyed by name.

A system is one function ``prepare(spec, ctx) -> Prepared``: it builds whatever it needs for the
model (compiling, exporting, tuning) and returns a callable that runs one inference on the
model's example inputs. Adding a system (the ``ollie`` column, for instance) is one decorated
function::

    @register_system("ollie", tvm_based=True)
    def prepare_ollie(spec, ctx):
        mod, params = ctx.relax_module(spec)
        ex = tvm.compile(mod, ctx.target, relax_pipeline="ollie")
        return prepare_tvm_executable(ex, params, spec, ctx, compile_s=...)

``prepare`` raises :class:`SystemUnavailable` when a package or device it needs is missing:
the harness reports the column as skipped instead of failing.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from .. import native
from ..compat import relax, tvm
from ..models import to_onnx, to_relax
from ..models.export import WEIGHTS
from ..orchestrate import orchestrate_pipeline
from ..orchestrate.tuned import tuned_orchestrate_build
from ..pipeline import build as ollie_build
from ..pipeline.library_offers import library_offer, offer_library
from ..tune.metaschedule import STATS, Tuner
from .tvm_build import build_tvm, make_target


class SystemUnavailable(Exception):
    """The system cannot run here (missing package or device); the reason is the message."""


@dataclasses.dataclass
class Prepared:
    """A system ready to run one model.

    Attributes
    ----------
    run : callable or None
        One full inference (synchronized); returns the raw outputs. None when the system was
        built but cannot be measured here (e.g. CUDA build without a GPU).
    compile_s : float
        Time to build (export + compile, excluding tuning).
    tune_s : float or None
        Tuning time (TVM-based systems).
    info : dict
        Anything else worth reporting (trials, database reuse, providers...).
    """

    run: Optional[Callable[[], object]]
    compile_s: float = 0.0
    tune_s: Optional[float] = None
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class System:
    """A registered system."""

    name: str
    prepare: Callable[..., Prepared]
    tvm_based: bool
    description: str


_SYSTEMS: Dict[str, System] = {}


def register_system(name: str, tvm_based: bool = False, description: str = ""):
    """Register ``prepare(spec, ctx) -> Prepared`` as the system ``name``."""

    def _wrap(prepare):
        if name in _SYSTEMS:
            raise ValueError(f"system {name!r} registered twice")
        doc = description or (prepare.__doc__ or "").strip().splitlines()[0]
        _SYSTEMS[name] = System(name, prepare, tvm_based, doc)
        return prepare

    return _wrap


def get_system(name: str) -> System:
    """The registered system ``name``."""
    if name not in _SYSTEMS:
        raise KeyError(f"unknown system {name!r}; known: {', '.join(_SYSTEMS)}")
    return _SYSTEMS[name]


def list_systems() -> List[str]:
    """Registered system names, in registration order."""
    return list(_SYSTEMS)


class BenchContext:
    """Settings shared by all systems in a run, and per-model artifacts they share.

    Parameters
    ----------
    target : str
        ``"llvm"`` or ``"cuda"``.
    threads : int
        Threads for every system (the machine's cores by default).
    trials : int
        MetaSchedule trials per model for TVM-based systems (0: untuned default pipeline).
    work_dir : str
        Where tuning databases and ONNX files are kept between runs.
    weights : str
        How every TVM-based system imports the weights (:func:`~tvm_ollie.models.to_relax`):
        ``"params"`` (runtime parameters of ``main``) or ``"constants"`` (bound into the
        module, as a TVM user importing a model normally gets them).
    ort_spinning : bool
        Leave ONNX Runtime's intra-op threads spinning after each run (its default): right for
        a process where ONNX Runtime runs alone (the isolated mode), wrong where the next
        system's call follows on the same cores (the interleaved mode).
    """

    def __init__(self, target: str = "llvm", threads: Optional[int] = None, trials: int = 0,
                 work_dir: str = "bench_work", weights: str = "params",
                 ort_spinning: bool = False):  # fmt: skip

        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, not {weights!r}")
        self.weights = weights
        self.ort_spinning = bool(ort_spinning)
        self.target_kind = target
        self.threads = int(threads or os.cpu_count() or 1)
        self.trials = int(trials)
        self.work_dir = os.path.abspath(work_dir)
        self._relax_cache: Dict[str, tuple] = {}
        self._target = None

    @property
    def target(self):
        """The TVM target object."""
        if self._target is None:
            self._target = make_target(self.target_kind, self.threads)
        return self._target

    def tvm_device(self):
        """The TVM device of the target."""

        return tvm.cuda(0) if self.target_kind == "cuda" else tvm.cpu(0)

    def relax_module(self, spec) -> tuple:
        """``(mod, params, import_s)`` of ``spec``, imported once per run and shared."""
        if spec.key not in self._relax_cache:
            start = time.perf_counter()
            mod, params = to_relax(spec, weights=self.weights)
            self._relax_cache[spec.key] = (mod, params, time.perf_counter() - start)
        return self._relax_cache[spec.key]

    def model_dir(self, spec, system: str) -> str:
        """Per model, target and system directory under ``work_dir`` (tuning DBs, files);
        builds with constant weights keep theirs apart (another module, other records)."""
        key = spec.key if self.weights == "params" else f"{spec.key}-{self.weights}"
        return os.path.join(self.work_dir, self.target_kind, system, key)


def prepare_tvm_executable(
    ex, params, spec, ctx: BenchContext, compile_s: float,
    tune_s: Optional[float] = None, info: Optional[dict] = None,
) -> Prepared:  # fmt: skip
    """Wrap a Relax executable as a :class:`Prepared` (inputs converted once, outside timing)."""

    dev = ctx.tvm_device()
    if not dev.exist:
        return Prepared(None, compile_s, tune_s, dict(info or {}, note="built; no device to run"))
    vm = relax.VirtualMachine(ex, dev)
    info = dict(info or {}, parallel_runtime=native.get_parallel_runtime())  # bound just now
    args = [tvm.runtime.tensor(x.numpy(), dev) for x in spec.example_inputs]
    args += [p.copyto(dev) for p in params] if ctx.target_kind == "cuda" else list(params)
    main = vm["main"]

    def run():
        out = main(*args)
        dev.sync()
        return out

    return Prepared(run, compile_s, tune_s, info)


@register_system("tvm", tvm_based=True)
def prepare_tvm(spec, ctx: BenchContext) -> Prepared:
    """TVM alone: torch.export -> Relax -> static_shape_tuning_pipeline / default pipeline.

    Its kernels run on TVM's own thread pool, as a TVM user's do (tvm-ollie's executables run
    TVM's parallel loops on the OpenMP pool of the native kernels: docs/threads.md)."""
    mod, params, import_s = ctx.relax_module(spec)
    build = build_tvm(mod, ctx.target, ctx.trials, ctx.model_dir(spec, "tvm"))
    info = {"trials": build.trials, "reused_db": build.reused_db, "import_s": import_s}
    tune_s = build.tune_s if ctx.trials > 0 else None
    with native.parallel_runtime("tvm"):
        return prepare_tvm_executable(build.executable, params, spec, ctx, build.compile_s,
                                      tune_s, info)


@register_system("tvm-orch", tvm_based=True)
def prepare_tvm_orch(spec, ctx: BenchContext) -> Prepared:
    """TVM's default pipeline with kernel orchestration (BLP, profiled costs) for FuseOps; with
    trials, the chosen kernels tuned by MetaSchedule with the same total budget as ``tvm``."""
    return _prepare_tvm_orch(spec, ctx, "tvm-orch", library=False)


@register_system("tvm-orch-lib", tvm_based=True)
def prepare_tvm_orch_lib(spec, ctx: BenchContext) -> Prepared:
    """``tvm-orch`` with library candidates: each eligible matmul/conv's native kernel, plain
    and with its epilogue folded, chosen by the BLP against TVM's kernels (no derivation)."""
    return _prepare_tvm_orch(spec, ctx, "tvm-orch-lib", library=True)


def _prepare_tvm_orch(spec, ctx: BenchContext, system: str, library: bool) -> Prepared:
    mod, params, import_s = ctx.relax_module(spec)
    reports: list = []
    start = time.perf_counter()
    tune_s = None
    info = {"import_s": import_s}
    if ctx.trials > 0:
        ex, tune_s, info["trials_spent"] = _tuned_orchestrated(spec, ctx, mod, reports, system,
                                                               library)
        info["trials"] = ctx.trials
    else:
        offer = library_offer(ctx.target) if library else None
        ex = tvm.compile(mod, target=ctx.target, relax_pipeline=orchestrate_pipeline(
            ctx.target, reports=reports, offer=offer))
    compile_s = time.perf_counter() - start - (tune_s or 0.0)
    info.update(orchestration_info(reports[-1] if reports else None))
    return prepare_tvm_executable(ex, params, spec, ctx, compile_s, tune_s, info)


def orchestration_info(rep) -> dict:
    """The selection's statistics of an orchestration report (empty for None): primitives,
    kernels, candidates, BLP variables and constraints, solve time and gap, library calls
    offered and chosen (None without library candidates)."""
    if rep is None:
        return {}
    parts = rep.partitions
    return {
        "primitives": rep.primitives, "kernels": rep.kernels, "partitions": len(parts),
        "candidates": sum(p.candidates for p in parts),
        "blp_variables": sum(p.variables for p in parts),
        "blp_constraints": sum(p.constraints for p in parts),
        "solve_s": sum(p.solve_s for p in parts),
        "max_gap": max((p.gap for p in parts), default=0.0),
        "statuses": sorted({p.status for p in parts}),
        "enumeration": sorted({p.enumeration for p in parts}),
        "fallbacks": sum(len(p.fallbacks) for p in parts),
        "orchestrate_s": rep.total_s,
        "library": list(rep.library) if rep.library is not None else None}


def _tuned_orchestrated(spec, ctx: BenchContext, mod, reports: list, system: str = "tvm-orch",
                        library: bool = False) -> tuple:
    """``(executable, tune_s, trials spent)``: TVM's pipeline with orchestration (``library``:
    with library candidates), the chosen kernels tuned with ``ctx.trials`` by the project's
    tuner (records kept in the model's work dir: a rerun tunes only what has no record)."""

    trials0, seconds0 = STATS.trials, STATS.seconds
    tuner = Tuner(ctx.target, ctx.model_dir(spec, system))
    table = None
    if library:
        mod, table = offer_library(mod, ctx.target)
    ex = tuned_orchestrate_build(mod, ctx.target, tuner, ctx.trials, cpu_schedules=False,
                                 reports=reports, joint=table or None)
    return ex, STATS.seconds - seconds0, STATS.trials - trials0


#: The work dir (under the model's) that the ollie systems share when untuned: the Decider's
#: untuned timings and the joint build's measured kernels, so that every system decides from
#: the same measurements (the first system to build measures, the others reuse).
UNTUNED_SHARED = "ollie-untuned"


def _prepare_ollie(spec, ctx: BenchContext, system: str, **opts) -> Prepared:
    """The ollie build of ``spec`` with pass options ``opts``, tuning records in work_dir."""

    mod, params, import_s = ctx.relax_module(spec)
    # untuned, the ollie systems share one measurement cache per model (UNTUNED_SHARED): each
    # would otherwise decide from its own timings of the same alternatives, which move with
    # the machine's load, and comparing them would compare decisions, not builds
    work_dir = ctx.model_dir(spec, system if ctx.trials > 0 else UNTUNED_SHARED)
    start = time.perf_counter()
    ex, report = ollie_build(mod, target=ctx.target, trials=ctx.trials, work_dir=work_dir,
                             **opts)
    total_s = time.perf_counter() - start
    tune_s = report.tuning_s if ctx.trials > 0 else None
    info = {"trials": ctx.trials, "trials_spent": report.trials_spent, "import_s": import_s,
            "search_s": report.search_s,
            "rewritten": [d.var_name for d in report.decisions if d.chosen != "original"],
            "decisions": [f"{d.op_name} {d.var_name}: {d.chosen}" for d in report.decisions],
            "epilogues": dict(report.epilogues),
            "regions": [f"{r.var_name} [{r.contents}]: {r.chosen}"
                        for r in getattr(report, "regions", [])]}
    info["rewritten"] += [r.var_name for r in getattr(report, "regions", []) if r.rewritten]
    for key in ("plans", "model_guard"):  # the never-worse guards: joint build, whole model
        guard = getattr(report, key, None)
        if guard is not None:
            info[key] = {"winner": guard.winner, "times_s": guard.times(),
                         "kept_s": guard.kept_s,  # the guard's timing of the kept plan
                         "text": guard.to_text()}
    info.update(orchestration_info(getattr(report, "orchestration", None)))
    return prepare_tvm_executable(ex, params, spec, ctx, total_s - (tune_s or 0.0), tune_s, info)


@register_system("ollie", tvm_based=True)
def prepare_ollie(spec, ctx: BenchContext) -> Prepared:
    """tvm-ollie: derivation + native library kernels + TVM's pipeline."""
    return _prepare_ollie(spec, ctx, "ollie")


@register_system("ollie-lib", tvm_based=True)
def prepare_ollie_lib(spec, ctx: BenchContext) -> Prepared:
    """Ablation: native library kernels for the original operators, no derivation."""
    return _prepare_ollie(spec, ctx, "ollie-lib", derive=False)


@register_system("ollie-derive", tvm_based=True)
def prepare_ollie_derive(spec, ctx: BenchContext) -> Prepared:
    """Ablation: derivation with TVM-built kernels only (no native library)."""
    return _prepare_ollie(spec, ctx, "ollie-derive", library=False)


@register_system("ollie-orch", tvm_based=True)
def prepare_ollie_orch(spec, ctx: BenchContext) -> Prepared:
    """tvm-ollie with kernel orchestration: derivation + library kernels, then fission and
    BLP-chosen kernels (analytic kernel costs) in place of TVM's greedy fusion, tuned with the
    final task's share of the trials."""
    return _prepare_ollie(spec, ctx, "ollie-orch", orchestrate=True)


@register_system("ollie-joint", tvm_based=True)
def prepare_ollie_joint(spec, ctx: BenchContext) -> Prepared:
    """tvm-ollie with joint selection: every verified alternative of a heavy call (original,
    library kernel, derived programs) enters the orchestration's binary program, which picks
    the alternative and the kernel boundaries together; the never-worse guard keeps the
    fastest plan of the same decisions, which the rest of the trials then tune."""
    return _prepare_ollie(spec, ctx, "ollie-joint", orchestrate=True, joint=True)


def _torch_device(ctx: BenchContext):
    try:
        # lazy: torch is a heavy, optional dependency
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise SystemUnavailable("torch is not installed") from err
    if ctx.target_kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemUnavailable("torch has no CUDA device")
        return torch, torch.device("cuda")
    torch.set_num_threads(ctx.threads)
    return torch, torch.device("cpu")


def _module_on(spec, device):
    """The model on ``device``; a copy when that is not the CPU (the spec stays on the CPU)."""
    return spec.module if device.type == "cpu" else copy.deepcopy(spec.module).to(device)


def _torch_runner(torch, module, inputs, device):
    def run():
        with torch.inference_mode():
            out = module(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    return run


@register_system("torch")
def prepare_torch(spec, ctx: BenchContext) -> Prepared:
    """PyTorch eager (the correctness reference)."""
    torch, device = _torch_device(ctx)
    module = _module_on(spec, device)
    inputs = [x.to(device) for x in spec.example_inputs]
    return Prepared(_torch_runner(torch, module, inputs, device), 0.0)


def fresh_inductor_cache(directory: str):
    """A context in which torch.compile's caches are empty: inductor's in-process caches
    cleared, ``TORCHINDUCTOR_CACHE_DIR`` (the FX graph, AOT autograd and compiled-kernel
    caches) and ``TRITON_CACHE_DIR`` in a new directory under ``directory``, kept afterwards
    (a recompilation writes there too). Why: the benchmark's ``compile_s`` is a cold build;
    with inductor's default directory (``/tmp/torchinductor_<user>``, shared by every model and
    every earlier run) a model compiled before read back its kernels, and every model after the
    first skipped inductor's one-time work (DCGAN 2.0 s in the quiet table of 2026-12-04,
    docs/compile-time.md "cold14")."""
    # lazy: torch is a heavy, optional dependency
    from torch._inductor.utils import fresh_cache  # pylint: disable=import-outside-toplevel

    os.makedirs(directory, exist_ok=True)
    return fresh_cache(dir=directory, delete=False)


@register_system("torch_compile")
def prepare_torch_compile(spec, ctx: BenchContext) -> Prepared:
    """torch.compile with the default (inductor) backend; compile time is the first call,
    cold: in caches of its own (:func:`fresh_inductor_cache`)."""
    torch, device = _torch_device(ctx)
    module = _module_on(spec, device)
    inputs = [x.to(device) for x in spec.example_inputs]
    torch._dynamo.reset()  # pylint: disable=protected-access
    compiled = torch.compile(module)
    run = _torch_runner(torch, compiled, inputs, device)
    with fresh_inductor_cache(os.path.join(ctx.model_dir(spec, "torch_compile"), "inductor")):
        start = time.perf_counter()
        run()
        compile_s = time.perf_counter() - start
    return Prepared(run, compile_s)


@register_system("onnxruntime")
def prepare_onnxruntime(spec, ctx: BenchContext) -> Prepared:
    """ONNX Runtime on the model exported by ``torch.onnx`` (CPU, or CUDA provider)."""
    try:
        # lazy: onnxruntime is an optional dependency
        import onnxruntime as ort  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise SystemUnavailable("onnxruntime is not installed") from err

    provider = "CUDAExecutionProvider" if ctx.target_kind == "cuda" else "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        raise SystemUnavailable(f"onnxruntime has no {provider}")
    start = time.perf_counter()
    path = to_onnx(spec, os.path.join(ctx.model_dir(spec, "onnxruntime"), "model.onnx"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx.threads
    # ORT's intra-op workers spin for a long time after ``run`` returns (tens of ms measured
    # here); in an interleaved run that spinning steals the cores from the next system (torch
    # eager went from 1 ms to 28 ms right after ORT). Spinning only helps back-to-back ORT calls,
    # so it is the one ORT default changed.
    # (the isolated mode keeps the default: there the next system runs in another process,
    # after this one's threads have gone idle).
    if not ctx.ort_spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(path, options, providers=[provider])
    compile_s = time.perf_counter() - start
    run = ort_runner(session, spec.example_inputs, "cuda" if ctx.target_kind == "cuda" else "cpu")
    return Prepared(run, compile_s, info={"provider": provider, "spinning": ctx.ort_spinning})


def ort_runner(session, inputs, device: str = "cpu") -> Callable[[], object]:
    """One ONNX Runtime inference with inputs bound once on ``device`` (``"cpu"``/``"cuda"``).

    IO binding keeps host-to-device copies of the inputs out of the timed call on GPUs, as for
    the other systems; outputs are allocated on ``device`` by each run.
    """
    # lazy: onnxruntime is an optional dependency
    import onnxruntime as ort  # pylint: disable=import-outside-toplevel

    binding = session.io_binding()
    # On the CPU an OrtValue wraps the numpy buffer without copying: keep arrays and values alive.
    arrays = [np.ascontiguousarray(x.numpy()) for x in inputs]
    values = [ort.OrtValue.ortvalue_from_numpy(a, device, 0) for a in arrays]
    for meta, value in zip(session.get_inputs(), values):
        binding.bind_ortvalue_input(meta.name, value)
    for meta in session.get_outputs():
        binding.bind_output(meta.name, device)

    def run(_keep=(arrays, values)):
        session.run_with_iobinding(binding)
        return list(binding.get_outputs())  # OrtValues; converted outside the timed call

    return run
