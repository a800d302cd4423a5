"""tvm-ollie: derivation-based tensor-program optimization for Apache TVM.

The public entry points (see the README):

* :func:`lift` turns an operator (a PrimFunc, a ``te.Tensor``, or a Relax call) into an
  expression of the tensor-algebra IR (:mod:`tvm_ollie.ir`);
* :func:`evaluate` runs an expression on numpy arrays (the reference interpreter);
* :func:`lower` turns an expression back into a TVM PrimFunc;
* :func:`derive` searches equivalent programs: target operators plus memory-bound eOperators;
* :mod:`tvm_ollie.transform` holds the Relax pass ``OllieOptimize``;
* :func:`build` (:mod:`tvm_ollie.pipeline`) rewrites and compiles a Relax module; importing
  ``tvm_ollie`` registers the ``"ollie"`` Relax pipeline, so ``tvm.compile(mod, target,
  relax_pipeline="ollie")`` works.

* :class:`OllieConfig` holds every option (one default each); every entry point takes
  ``config=``, and :func:`config_scope` sets it for the passes run inside a block.

* :func:`from_torch` imports a PyTorch module (``torch.export``) into Relax, and
  ``torch.compile(model, backend="tvm_ollie")`` compiles its graphs with the ollie pipeline;
  :func:`from_onnx` imports an ONNX model, folding its shape computations first.

* :func:`profile_model` builds a model and times every call of one inference, beside ONNX
  Runtime's per-node profile for ONNX models (:mod:`tvm_ollie.profiler`).

``tvm_ollie.lift`` and ``tvm_ollie.derive`` are subpackages that can be called like functions.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Mapping

from . import native
from . import ir  # noqa: F401
from .config import OllieConfig, config_scope  # noqa: F401  (the options of every entry point)
from . import derive, lift  # noqa: F401  (callable subpackages: ollie.lift(x), ollie.derive(e))
from . import orchestrate, transform  # noqa: F401  (the two passes)
from . import pipeline  # noqa: F401  (registers the "ollie" pipeline)
from .codegen.lower import lower as _lower
from .ir.interp import evaluate as _evaluate
from .pipeline import build  # noqa: F401  (rewrite + compile: ollie.build(mod, target))

__version__ = "0.1.0"

# Register the native kernels (tvm_ollie.cpu.*) as tvm-ffi globals; on failure this logs one
# warning and the package works without them (native.available() is then False).
native.load()

# torch.compile finds the "tvm_ollie" backend through the package's entry point. A checkout
# whose installed metadata predates the entry point still gets it when TorchDynamo is already
# loaded (importing it here would add seconds to every import: TVM itself imports torch).
if "torch._dynamo" in sys.modules:
    from .frontend.torch_backend import register as _register_torch_backend

    _register_torch_backend()


def evaluate(expr: "ir.Node", inputs: Mapping[str, Any], **kwargs: Any):
    """Evaluate an expression on numpy inputs. See :func:`tvm_ollie.ir.interp.evaluate`."""
    return _evaluate(expr, inputs, **kwargs)


def lower(expr: "ir.Scope", name: str = "main", **kwargs: Any):
    """Lower an expression to a TVM PrimFunc. See :func:`tvm_ollie.codegen.lower.lower`."""
    return _lower(expr, name=name, **kwargs)


def from_torch(module, example_inputs, **kwargs: Any):
    """Import a PyTorch module into a Relax IRModule through ``torch.export``.

    See :func:`tvm_ollie.frontend.torch_entry.from_torch`; compile the result with
    ``tvm.compile(mod, target, relax_pipeline="ollie")``, or use
    :func:`tvm_ollie.frontend.torch_entry.compile_torch` for a torch-callable model.
    """
    # pylint: disable=import-outside-toplevel
    # lazy: the importers load when used (register() imports torch, an optional dependency)
    from .frontend.torch_backend import register
    from .frontend.torch_entry import from_torch as _from_torch

    register()  # importing torch here makes torch.compile(backend="tvm_ollie") available
    return _from_torch(module, example_inputs, **kwargs)


def from_onnx(model, shapes=None, **kwargs: Any):
    """Import an ONNX model (path or ModelProto), fixing ``shapes`` and folding shape arithmetic.

    See :func:`tvm_ollie.frontend.loader.load_onnx`.
    """
    # lazy: the importers load when used (the loader then imports onnx, an optional dependency)
    from .frontend.loader import load_onnx  # pylint: disable=import-outside-toplevel

    return load_onnx(model, shapes, **kwargs)


def profile_model(model, **kwargs: Any):
    """Build ``model`` with the ollie pipeline and time every Relax VM call of an inference.

    See :func:`tvm_ollie.profiler.profile_model`; the result has ``.to_text()`` and
    ``.to_chrome_trace()``.
    """
    # lazy: keeps `import tvm_ollie` from loading the profiler and frontend
    from .profiler import profile_model as _profile  # pylint: disable=import-outside-toplevel

    return _profile(model, **kwargs)


# -- deprecated: tvm_ollie.transform.build & co. moved to tvm_ollie.pipeline ------------------
# transform/ sits below pipeline/ and never imports it; the old names are provided from here
# (above every floor) for one release: attribute access warns, and ``import
# tvm_ollie.transform.build`` finds the module's new home.

_MOVED_FROM_TRANSFORM = ("build", "cuda_source", "ollie_pipeline", "PIPELINE_NAME")


def _transform_getattr(name: str):
    if name in _MOVED_FROM_TRANSFORM:
        warnings.warn(f"tvm_ollie.transform.{name} moved to tvm_ollie.pipeline.{name} "
                      f"(tvm_ollie.{name} for build); the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return getattr(pipeline, name)
    raise AttributeError(f"module 'tvm_ollie.transform' has no attribute {name!r}")


transform.__getattr__ = _transform_getattr
sys.modules.setdefault("tvm_ollie.transform.build", sys.modules["tvm_ollie.pipeline.build"])
