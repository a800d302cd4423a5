"""A model built once into a library file, then loaded and run in another process.

The stability and crowded-process benchmarks time what a user deploys: the library that
``export_library`` writes (as ``tvm-ollie compile`` does), loaded by
:func:`tvm_ollie.runtime.load_module` in a process that did not build it. Both functions are
worker factories (:mod:`.worker`): module-level, picklable arguments.
"""

from __future__ import annotations

import os
import time

from ..compat import relax, tvm
from ..models import get_model, to_relax
from ..pipeline import build as ollie_build
from ..runtime import load_module
from .check import as_numpy_list
from .outcome import Outcome
from .tvm_build import build_tvm, make_target

#: Systems whose executable can be exported: the ollie pipeline and TVM's default one.
EXPORTABLE = ("ollie", "ollie-joint", "tvm")

#: The pass options of each ollie system that can be exported (as in :mod:`.systems`).
_OLLIE_OPTIONS = {"ollie": {}, "ollie-joint": {"orchestrate": True, "joint": True}}


def build_and_export(system: str, model: str, path: str, work_dir: str, quick: bool = True,
                     batch: int = 1, weights: str = "constants", threads: int = 1,
                     trials: int = 0) -> Outcome:  # fmt: skip
    """Import ``model``, build it with ``system`` (``"ollie"``: :func:`tvm_ollie.pipeline.build`
    with ``work_dir`` for its measurements and records; ``"tvm"``: TVM's pipeline) and write
    the library to ``path``. Returns ``({"status": "built", "compile_s", "import_s"}, None,
    None)``: nothing to run here."""

    if system not in EXPORTABLE:
        raise ValueError(f"system must be one of {EXPORTABLE}, not {system!r}")
    spec = get_model(model, quick=quick, batch=batch)
    start = time.perf_counter()
    mod, _ = to_relax(spec, weights=weights)
    import_s = time.perf_counter() - start
    target = make_target("llvm", threads)
    start = time.perf_counter()
    if system in _OLLIE_OPTIONS:
        ex, _ = ollie_build(mod, target=target, trials=trials, work_dir=work_dir,
                            **_OLLIE_OPTIONS[system])
    else:
        ex = build_tvm(mod, target, trials, work_dir).executable
    compile_s = time.perf_counter() - start
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ex.export_library(path)
    return {"status": "built", "compile_s": compile_s, "import_s": import_s,
            "path": path}, None, None  # fmt: skip


def load_exported(path: str, model: str, quick: bool = True, batch: int = 1,
                  weights: str = "constants") -> Outcome:  # fmt: skip
    """Load the library at ``path`` and run it once on ``model``'s example inputs (and its
    weights, imported again, when they are parameters of ``main``)."""

    spec = get_model(model, quick=quick, batch=batch)
    params = to_relax(spec, weights="params")[1] if weights == "params" else []
    start = time.perf_counter()
    vm = relax.VirtualMachine(load_module(path), tvm.cpu(0))
    load_s = time.perf_counter() - start
    args = [tvm.runtime.tensor(x.numpy(), tvm.cpu(0)) for x in spec.example_inputs] + params
    main = vm["main"]

    def run():
        return main(*args)

    outputs = as_numpy_list(run())
    return {"status": "built", "load_s": load_s, "pid": os.getpid()}, run, outputs
