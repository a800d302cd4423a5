"""Per-kernel profiles of compiled models: where an inference's time goes, call by call.

``profile_model(model, ...)`` builds a model with the ollie pipeline (optionally TVM alone too),
times every call the Relax VM makes (TVM kernels, the native library's kernels reached through
``call_dps_packed``, VM builtins and allocations) through the VM's instrument hook, and for
ONNX models profiles ONNX Runtime on the same file. The result prints tables by kind and by
kernel name (:meth:`ProfileResult.to_text`) and gives a Chrome trace
(:meth:`ProfileResult.to_chrome_trace`). ``tvm-ollie profile MODEL`` is the command line.
"""

from .api import profile_executable, profile_model  # noqa: F401
from .kinds import KIND_ORDER, kind_of  # noqa: F401
from .ort import OrtProfile, profile_onnxruntime  # noqa: F401
from .result import ProfileResult, SystemProfile  # noqa: F401
from .vm_trace import vm_calls  # noqa: F401
