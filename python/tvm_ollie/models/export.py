"""Turn a :class:`ModelSpec` into what each system runs: a Relax module or an ONNX file.

Both paths start from the same ``nn.Module`` and example inputs, so weights are identical.
"""

from __future__ import annotations

import os
from typing import List, Tuple

from tvm import relax

from .registry import ModelSpec


def export_program(spec: ModelSpec):
    """``torch.export`` the model on its example inputs (no autograd)."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    with torch.no_grad():
        return torch.export.export(spec.module, spec.example_inputs)


#: How :func:`to_relax` imports the weights: ``"params"`` (trailing ``main`` parameters, fed at
#: run time) or ``"constants"`` (bound into the module, what ``from_exported_program`` and
#: ``from_onnx`` give a TVM user by default: the compiler may fold transformations of them).
WEIGHTS = ("params", "constants")


def to_relax(spec: ModelSpec, weights: str = "params") -> Tuple[object, List[object]]:
    """Import the model into Relax.

    Parameters
    ----------
    spec : ModelSpec
        The model.
    weights : str
        ``"params"``: the weights are trailing ``main`` parameters (tuning and the roofline
        walk see them as tensors read by the ops; nothing computed from them folds at compile
        time). ``"constants"``: the weights are constants of the module, as a TVM user
        importing the model normally gets them; ``params`` is then empty.

    Returns
    -------
    mod : tvm.IRModule
        ``main(*inputs, *params)``.
    params : list of tvm.runtime.Tensor
        The weights, in ``main``'s parameter order after the inputs (empty for constants).
    """
    # lazy: torch is optional and takes seconds to import
    # pylint: disable=import-outside-toplevel
    from tvm.relax.frontend.torch import from_exported_program

    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, not {weights!r}")
    program = export_program(spec)
    keep = weights == "params"
    mod = from_exported_program(program, keep_params_as_input=keep, unwrap_unit_return_tuple=True)
    if not keep:
        return mod, []
    mod, params = relax.frontend.detach_params(mod)
    return mod, list(params.get("main", []))


def to_onnx(spec: ModelSpec, path: str, opset: int = 18) -> str:
    """Export the model to an ONNX file at ``path`` (created directories as needed)."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            spec.module,
            spec.example_inputs,
            path,
            input_names=[f"input{i}" for i in range(len(spec.example_inputs))],
            opset_version=opset,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
    return path
