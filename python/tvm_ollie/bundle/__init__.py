"""Device bundles: compiled models, the TVM runtime and a runner, for a machine without TVM.

``tvm-ollie bundle --target cuda --out DIR`` (or :func:`build_bundle`) writes a folder that a
GPU machine with nothing installed runs with ``sh DIR/run.sh``: the models built by TVM alone
and by the ollie pipeline, their inputs and CPU reference outputs, the runtime libraries and a
C++ runner that checks every output and prints a latency table. Modules: :mod:`.cases` (what
is built), :mod:`.build`, :mod:`.cuda_pack` (CUDA kernels compiled before export),
:mod:`.libraries` (what is carried), :mod:`.manifest`, :mod:`.runner` (runner, ``run.sh``,
README), :mod:`.sizes` (the size limit).
"""

from .build import SYSTEMS, BundleResult, build_bundle  # noqa: F401
from .cases import Case, case_names, get_cases  # noqa: F401
from .manifest import read_manifest  # noqa: F401
from .sizes import DEFAULT_LIMIT, BundleError, BundleSizeError, check_size  # noqa: F401
