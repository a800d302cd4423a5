"""The bundle tests' set-up: the bundles' C++ runner compiled once for the whole run.

``build_bundle`` compiles ``runner.cc`` into every bundle (``g++ -O2``, about 5.5 CPU s); the
program is the same for every bundle of a run: one source, the same flags, linked against the
same copies of ``libtvm_ffi.so`` and ``libtvm_runtime.so`` with ``RPATH=$ORIGIN/lib``. The first
bundle of the run compiles it (``compile_runner`` is still tested by it); later ones get a
copy, with ``runner.cc`` beside it as ``compile_runner`` leaves it.
"""

import os
import shutil

import pytest

from tvm_ollie.bundle import build as bundle_build
from tvm_ollie.bundle import runner as bundle_runner


@pytest.fixture(scope="session", autouse=True)
def _one_runner_per_run(tmp_path_factory):
    """Session-scoped, so that the modules' bundle fixtures get it too."""
    kept_dir = str(tmp_path_factory.mktemp("runner"))
    compiled = {}  # the compiler ("" for the default) -> the kept runner
    real = bundle_runner.compile_runner

    def compile_once(bundle: str, cxx: str = "") -> str:
        key = cxx or os.environ.get("CXX", "")
        if key not in compiled:
            built = real(bundle, cxx)
            compiled[key] = os.path.join(kept_dir, f"runner{len(compiled)}")
            shutil.copy2(built, compiled[key])
            return built
        shutil.copyfile(bundle_runner.RUNNER_SOURCE, os.path.join(bundle, "runner.cc"))
        out = os.path.join(bundle, "runner")
        shutil.copy2(compiled[key], out)
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bundle_build, "compile_runner", compile_once)
        yield
