"""``build_bundle``: everything a device run needs, in one folder, from one command.

For every case (:mod:`.cases`) the bundle holds its inputs and CPU reference outputs (raw
files under ``data/``) and one exported library per system under ``models/``: ``tvm`` (TVM
alone: its default pipeline, or MetaSchedule with the records of ``work_dir``, as the
benchmark's ``tvm`` system builds it) and ``ollie`` (:func:`tvm_ollie.pipeline.build`; on a
GPU target without a GPU here the decisions use the analytic cost), ``measured`` (the same
build deciding by the device timings of an earlier bundle's candidates,
:class:`~.candidates.DeviceTimer`) and ``library`` (``ollie`` with the CUDA library's cuBLAS
and cuDNN kernels offered although no GPU is here: the device provides the vendor
libraries). Tuning records reuse the benchmark's work-dir layout
(``WORK_DIR/<kind>/<system>/<case>``), so the records of an earlier GPU run (``tvm-ollie bench
--target cuda --trials N --work-dir WORK_DIR``) are applied. With ``candidates`` the bundle
also carries the alternatives the pass weighs for each unit (:mod:`.candidates`) and, on CUDA,
the calibration workloads (:mod:`.calibration`), listed in ``candidates.json``.

Then ``lib/`` (:mod:`.libraries`: the runtime, the native kernel libraries the executables
call, their dependencies), the C++ runner, ``manifest.txt``, ``run.sh`` and ``README.md``. CUDA
executables are exported with compiled kernels (:mod:`.cuda_pack`). The folder is checked
against the size limit (:func:`.sizes.check_size`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import models as models_package
from .. import native_cuda
from ..bench.tvm_build import build_tvm, make_target
from ..pipeline import build as ollie_build
from .calibration import calibration_entries
from .candidates import (CANDIDATES_FILE, DeviceTimer, candidate_entries, collect_candidates,
                         records_dir)
from .cases import OPERATOR_CASES, Case, iter_cases, reference_outputs
from .cuda_pack import export_precompiled
from .libraries import (NativeLibrary, cuda_library_dirs, dependency_closure, native_libraries,
                        referenced_libraries, runtime_libraries)
from .manifest import Manifest, ModelEntry, TensorEntry, write_manifest
from .runner import compile_runner, write_readme, write_run_script
from .sizes import DEFAULT_LIMIT, MIB, BundleError, check_size, file_sizes, total_size

__all__ = ["BundleResult", "SYSTEMS", "build_bundle"]

#: The systems a bundle can hold, in table order.
SYSTEMS = ("tvm", "ollie", "measured", "library")
#: The systems built when none are named: TVM alone and the pass as a user builds it here.
DEFAULT_SYSTEMS = ("tvm", "ollie")


@dataclasses.dataclass
class BundleResult:
    """What :func:`build_bundle` wrote: the folder, its files by size, per-case build seconds,
    and what failed to build (``(case, system, reason)``; those executables are left out)."""

    out: str
    sizes: List[Tuple[str, int]]
    build_s: Dict[str, float]
    failures: List[Tuple[str, str, str]]
    notes: List[str]

    @property
    def total_bytes(self) -> int:
        """Size of the whole folder."""
        return total_size(self.sizes)


def _log(message: str) -> None:
    print(f"[bundle] {message}", file=sys.stderr, flush=True)


def _device_kind(target: str) -> str:
    if target not in ("cuda", "llvm"):
        raise BundleError(f"bundle targets are 'cuda' and 'llvm', not {target!r}")
    return "cuda" if target == "cuda" else "cpu"


def _prepare_out(out: str) -> None:
    """An empty ``out`` (a previous bundle there is replaced; anything else is kept safe)."""
    if os.path.isdir(out) and os.listdir(out):
        if not os.path.isfile(os.path.join(out, "manifest.txt")):
            raise BundleError(f"{out} exists and is not a bundle: choose an empty folder")
        shutil.rmtree(out)
    for sub in ("lib", "models", "data"):
        os.makedirs(os.path.join(out, sub), exist_ok=True)


def _write_tensors(out: str, case: Case, refs: Sequence[np.ndarray]) -> ModelEntry:
    entry = ModelEntry(case.name, case.rtol, case.atol)
    folder = os.path.join("data", case.name)
    os.makedirs(os.path.join(out, folder), exist_ok=True)
    for kind, arrays, dest in (("in", case.inputs, entry.inputs),
                               ("out", refs, entry.outputs)):
        for k, array in enumerate(arrays):
            array = np.ascontiguousarray(array)
            rel = f"{folder}/{kind}{k}.bin"
            array.astype(array.dtype.newbyteorder("<")).tofile(os.path.join(out, rel))
            dest.append(TensorEntry(rel, str(array.dtype), tuple(array.shape)))
    return entry


def _build_system(system: str, case: Case, target, trials: int, work_dir: Optional[str],
                  kind: str, ollie_options: dict):
    """The executable of ``case`` by ``system`` (records under the benchmark's layout) and the
    pass's report (None for TVM alone)."""
    wd = os.path.join(work_dir, "cuda" if kind == "cuda" else "llvm", system, case.name) \
        if work_dir else None
    if system == "tvm":
        return build_tvm(case.mod, target, trials, wd).executable, None
    library = system == "library" and kind == "cuda"
    if system == "measured":
        timer = DeviceTimer.load(work_dir, case.name) if work_dir else None
        if timer is None:
            raise BundleError(f"no device timings of {case.name} under "
                              f"{records_dir(work_dir or 'WORK_DIR', case.name)}")
        ollie_options = {**ollie_options, "timer": timer}
        if timer.calibration is not None:  # (shortlists as the collecting build did)
            ollie_options["calibration"] = timer.calibration
        library = timer.cuda_library and kind == "cuda"
    with _assumed_cuda_kernels(library):
        ex, report = ollie_build(case.mod, target=target, trials=trials, work_dir=wd,
                                 **ollie_options)
    return ex, str(report)


def _export(ex, path: str, target, kind: str) -> None:
    """Export ``ex`` (CUDA kernels compiled) and strip the symbols the loader does not need
    (``strip --strip-unneeded`` keeps the dynamic ones: about a quarter of the file)."""
    if kind == "cuda":
        export_precompiled(ex, path, target)
    else:
        ex.export_library(path)
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, "--strip-unneeded", path], check=True, capture_output=True)


def _copy_libraries(out: str, kind: str, natives: Sequence[NativeLibrary],
                    carry: Sequence[str]) -> List[str]:
    """Copy the runtime, ``natives``, ``carry`` and their dependencies into ``out/lib``;
    returns the preload list (bundle-relative, in load order)."""
    files = runtime_libraries(kind) + [f for lib in natives for f in lib.files] + list(carry)
    libs, missing = dependency_closure(files, cuda_library_dirs() if kind == "cuda" else ())
    if missing:
        raise BundleError(f"libraries not found for the bundle: {', '.join(missing)}")
    for name, path in libs.items():
        shutil.copyfile(path, os.path.join(out, "lib", name))
    preload = ["lib/libtvm_runtime_cuda.so"] if kind == "cuda" else []
    for f in [f for lib in natives for f in lib.files] + list(carry):
        rel = f"lib/{os.path.basename(f)}"
        if rel not in preload:
            preload.append(rel)
    return preload


def _failure_line(err: Exception) -> str:
    """One line on why a build failed: the first line that names an error (a compiler's
    output ends with its statistics, not its error), else the last."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    named = [line for line in lines if "error" in line.lower()]
    return f"{type(err).__name__}: {(named or lines)[-1 if not named else 0][:200]}"


def _write_report(out: str, case: str, system: str, report: str) -> None:
    """The pass's report of ``case`` by ``system`` in ``OUT.reports/`` (not carried)."""
    folder = os.path.abspath(out).rstrip("/") + ".reports"
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{case}.{system}.txt"), "w", encoding="utf-8") as fh:
        fh.write(report + "\n")


def _copy_torch_script(out: str) -> None:
    """``torch_device.py`` and the zoo's model definitions (``zoo/``: the registry and the
    model modules, without the package's TVM-importing ``__init__``), for PyTorch on the
    device."""
    shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_device.py"),
                    os.path.join(out, "torch_device.py"))
    zoo = os.path.join(out, "zoo")
    os.makedirs(zoo, exist_ok=True)
    src = os.path.dirname(os.path.abspath(models_package.__file__))
    for name in sorted(os.listdir(src)):
        if name.endswith(".py") and name not in ("__init__.py", "export.py"):
            shutil.copyfile(os.path.join(src, name), os.path.join(zoo, name))
    with open(os.path.join(zoo, "__init__.py"), "w", encoding="utf-8") as fh:
        fh.write('"""The zoo\'s model definitions (copied from tvm_ollie.models)."""\n')


@contextlib.contextmanager
def _assumed_cuda_kernels(on: bool):
    """Within the block, :data:`tvm_ollie.native_cuda.ASSUME_ENV` is set when ``on``."""
    old = os.environ.get(native_cuda.ASSUME_ENV)
    if on:
        os.environ[native_cuda.ASSUME_ENV] = "assume"
    try:
        yield
    finally:
        if on and old is None:
            os.environ.pop(native_cuda.ASSUME_ENV, None)
        elif on:
            os.environ[native_cuda.ASSUME_ENV] = old


def build_bundle(out: str, target: str = "cuda", models: Optional[Sequence[str]] = None, *,
                 cases: Optional[Sequence[Case]] = None,
                 systems: Sequence[str] = DEFAULT_SYSTEMS,
                 trials: int = 0, work_dir: Optional[str] = None, limit: int = DEFAULT_LIMIT,
                 carry: Sequence[str] = (), ollie_options: Optional[dict] = None,
                 candidates: bool = False, cuda_library: bool = False,
                 log: Callable[[str], None] = _log) -> BundleResult:
    """Build a device bundle in ``out`` (module docstring).

    Parameters
    ----------
    out : str
        The folder (created; a previous bundle there is replaced).
    target : str
        ``"cuda"`` (the H200 tag's sm_90) or ``"llvm"`` (this CPU; the bundle's CI check).
    models : sequence of str, optional
        Case names (:func:`.cases.case_names`; default all); ignored when ``cases`` is given.
    cases : sequence of Case, optional
        Cases built by the caller (tests use a tiny module).
    systems : sequence of str
        Which of :data:`SYSTEMS` to build (default :data:`DEFAULT_SYSTEMS`).
    trials, work_dir
        MetaSchedule budget and records folder (records there are applied even with 0).
    limit : int
        Size limit in bytes; over it, :class:`~.sizes.BundleSizeError` with the file table.
    carry : sequence of str
        Extra shared libraries to carry and load first (e.g. a native kernel library the
        package does not know about).
    ollie_options : dict, optional
        More keywords of :func:`tvm_ollie.pipeline.build` (``library=False`` ...).
    candidates : bool
        Also carry each case's candidate kernels (:mod:`.candidates`) and, on CUDA, the
        calibration workloads (:mod:`.calibration`).
    cuda_library : bool
        On CUDA, the candidates include the CUDA library's kernels (cuBLAS, cuDNN) although no
        device is here (:func:`tvm_ollie.native_cuda.assumed`), as the ``library`` system's
        build does; the library is carried, the vendor libraries come from the device.

    Returns
    -------
    BundleResult
    """

    kind = _device_kind(target)
    cuda_library = cuda_library and kind == "cuda"
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        raise BundleError(f"unknown systems {bad} (known: {', '.join(SYSTEMS)})")
    if "library" in systems and kind != "cuda":
        raise BundleError("the 'library' system is for cuda bundles (on llvm, 'ollie' offers "
                          "the native library already)")
    tgt = make_target(target, os.cpu_count() or 1)
    cases = list(cases) if cases is not None else iter_cases(models)
    _prepare_out(out)
    manifest = Manifest(kind)
    available = native_libraries()
    used: Dict[str, NativeLibrary] = {}
    build_s: Dict[str, float] = {}
    failures: List[Tuple[str, str, str]] = []
    listing: dict = {"candidates": {}, "calibration": {}}

    def export(ex, path: str) -> None:  # (and note the kernel libraries it calls)
        for lib in referenced_libraries(ex, available):
            used[lib.prefix] = lib
        _export(ex, path, tgt, kind)

    built: List[Case] = []
    for case in cases:
        built.append(case)
        start = time.perf_counter()
        entry = _write_tensors(out, case, reference_outputs(case))
        for system in systems:
            rel = f"models/{case.name}.{system}.so"
            try:
                ex, report = _build_system(system, case, tgt, trials, work_dir, kind,
                                           dict(ollie_options or {}))
                export(ex, os.path.join(out, rel))
                if report is not None:  # (what the pass chose, beside the bundle)
                    _write_report(out, case.name, system, report)
            except Exception as err:  # pylint: disable=broad-except
                why = _failure_line(err)
                failures.append((case.name, system, why))
                log(f"{case.name} {system}: build failed: {why}")
                continue
            entry.systems.append((system, rel))
        manifest.models.append(entry)
        if candidates:
            with _assumed_cuda_kernels(cuda_library):
                units, calib = collect_candidates(case, tgt, ollie_options)
                entries, found = candidate_entries(case.name, units, out, tgt, export, log,
                                                   calib)
            manifest.models += entries
            listing["candidates"].update(found)
            log(f"{case.name}: {sum(len(e.systems) for e in entries)} candidate kernels of "
                f"{len(entries)} units")
        build_s[case.name] = time.perf_counter() - start
        log(f"{case.name}: {', '.join(s for s, _ in entry.systems) or 'nothing'} built in "
            f"{build_s[case.name]:.1f} s")
    if candidates and kind == "cuda":
        entries, listing["calibration"] = calibration_entries(out, tgt, export, log)
        manifest.models += entries
    if candidates:
        with open(os.path.join(out, CANDIDATES_FILE), "w", encoding="utf-8") as fh:
            json.dump(listing, fh, indent=1, sort_keys=True)
    if any(c.zoo or c.name in OPERATOR_CASES for c in built):
        _copy_torch_script(out)
    manifest.preload = _copy_libraries(out, kind, list(used.values()), carry)
    compile_runner(out)
    write_manifest(os.path.join(out, "manifest.txt"), manifest)
    write_run_script(out, "the GPU" if kind == "cuda" else "the CPU")
    notes = [f"native kernel library carried for {p}* calls" for p in used] or [
        "no executable calls a native kernel library: none carried"]
    notes += [f"{c} {s}: not built ({why})" for c, s, why in failures]
    models_list = [(m.name, [s for s, _ in m.systems]) for m in manifest.models]
    write_readme(out, target, models_list, file_sizes(out), limit, notes)
    write_readme(out, target, models_list, file_sizes(out), limit, notes)  # its own size
    sizes = check_size(out, limit)
    log(f"{out}: {total_size(sizes) / MIB:.1f} MiB in {len(sizes)} files")
    return BundleResult(out, sizes, build_s, failures, notes)
