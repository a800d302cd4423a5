"""``build_bundle``: everything a device run needs, in one folder, from one command.

For every case (:mod:`.cases`) the bundle holds its inputs and CPU reference outputs (raw
files under ``data/``) and one exported library per system under ``models/``: ``tvm`` (TVM
alone: its default pipeline, or MetaSchedule with the records of ``work_dir``, as the
benchmark's ``tvm`` system builds it) and ``ollie`` (:func:`tvm_ollie.pipeline.build`; on a
GPU target without a GPU here the decisions use the analytic cost). Tuning records reuse the
benchmark's work-dir layout (``WORK_DIR/<kind>/<system>/<case>``), so the records of an earlier
GPU run (``tvm-ollie bench --target cuda --trials N --work-dir WORK_DIR``) are applied.

Then ``lib/`` (:mod:`.libraries`: the runtime, the native kernel libraries the executables
call, their dependencies), the C++ runner, ``manifest.txt``, ``run.sh`` and ``README.md``. CUDA
executables are exported with compiled kernels (:mod:`.cuda_pack`). The folder is checked
against the size limit (:func:`.sizes.check_size`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..bench.tvm_build import build_tvm, make_target
from ..pipeline import build as ollie_build
from .cases import Case, iter_cases, reference_outputs
from .cuda_pack import export_precompiled
from .libraries import (NativeLibrary, cuda_library_dirs, dependency_closure, native_libraries,
                        referenced_libraries, runtime_libraries)
from .manifest import Manifest, ModelEntry, TensorEntry, write_manifest
from .runner import compile_runner, write_readme, write_run_script
from .sizes import DEFAULT_LIMIT, MIB, BundleError, check_size, file_sizes, total_size

__all__ = ["BundleResult", "SYSTEMS", "build_bundle"]

#: The systems a bundle can hold, in table order.
SYSTEMS = ("tvm", "ollie")


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
    """The executable of ``case`` by ``system`` (records under the benchmark's layout)."""
    wd = os.path.join(work_dir, "cuda" if kind == "cuda" else "llvm", system, case.name) \
        if work_dir else None
    if system == "tvm":
        return build_tvm(case.mod, target, trials, wd).executable

    ex, _ = ollie_build(case.mod, target=target, trials=trials, work_dir=wd, **ollie_options)
    return ex


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


def build_bundle(out: str, target: str = "cuda", models: Optional[Sequence[str]] = None, *,
                 cases: Optional[Sequence[Case]] = None, systems: Sequence[str] = SYSTEMS,
                 trials: int = 0, work_dir: Optional[str] = None, limit: int = DEFAULT_LIMIT,
                 carry: Sequence[str] = (), ollie_options: Optional[dict] = None,
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
        Which of :data:`SYSTEMS` to build.
    trials, work_dir
        MetaSchedule budget and records folder (records there are applied even with 0).
    limit : int
        Size limit in bytes; over it, :class:`~.sizes.BundleSizeError` with the file table.
    carry : sequence of str
        Extra shared libraries to carry and load first (e.g. a native kernel library the
        package does not know about).
    ollie_options : dict, optional
        More keywords of :func:`tvm_ollie.pipeline.build` (``library=False`` ...).

    Returns
    -------
    BundleResult
    """

    kind = _device_kind(target)
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or not systems:
        raise BundleError(f"unknown systems {bad} (known: {', '.join(SYSTEMS)})")
    tgt = make_target(target, os.cpu_count() or 1)
    cases = list(cases) if cases is not None else iter_cases(models)
    _prepare_out(out)
    manifest = Manifest(kind)
    available = native_libraries()
    used: Dict[str, NativeLibrary] = {}
    build_s: Dict[str, float] = {}
    failures: List[Tuple[str, str, str]] = []
    for case in cases:
        start = time.perf_counter()
        entry = _write_tensors(out, case, reference_outputs(case))
        for system in systems:
            rel = f"models/{case.name}.{system}.so"
            try:
                ex = _build_system(system, case, tgt, trials, work_dir, kind,
                                   dict(ollie_options or {}))
                _export(ex, os.path.join(out, rel), tgt, kind)
            except Exception as err:  # pylint: disable=broad-except
                why = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}" \
                    if str(err).strip() else type(err).__name__
                failures.append((case.name, system, why))
                log(f"{case.name} {system}: build failed: {why}")
                continue
            for lib in referenced_libraries(ex, available):
                used[lib.prefix] = lib
            entry.systems.append((system, rel))
        manifest.models.append(entry)
        build_s[case.name] = time.perf_counter() - start
        log(f"{case.name}: {', '.join(s for s, _ in entry.systems) or 'nothing'} built in "
            f"{build_s[case.name]:.1f} s")
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
