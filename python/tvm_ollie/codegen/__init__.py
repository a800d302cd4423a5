"""Expressions back into TVM: TE stages, PrimFuncs, CPU modules, CUDA source and PTX."""

from .cuda import CudaBuildError, build_cuda, compile_ptx  # noqa: F401
from .lower import LoweringError, build, lower, run, to_te  # noqa: F401
