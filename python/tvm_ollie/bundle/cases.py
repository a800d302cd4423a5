"""What a bundle builds: models as Relax modules with their inputs and CPU reference outputs.

A :class:`Case` is one model: a Relax module whose ``main`` takes the inputs and then the
weights (runtime parameters, as the benchmark's default ``weights="params"``: both systems of a
model share one copy of the weight files), those arrays, and the reference outputs. The zoo's
references are PyTorch eager on the CPU (:func:`zoo_case`); the operator cases' are float64
PyTorch; a case without references gets TVM's llvm build run on the CPU
(:func:`reference_outputs`).

Names: every zoo model (``tvm_ollie.models.list_models()``, quick sizes), ``conv3x3_512``
(W1 of the OLLIE paper: a 3x3 convolution 1x512x7x7 -> 512) and ``convtranspose`` (EinNet's
transposed convolution: 4x4 stride 2, 16x448x2x2 -> 256).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np

from ..codegen.builder import single_function_module, tensor_var
from ..compat import relax, tvm
from ..models import get_model, list_models, to_relax

__all__ = ["ATOL", "Case", "OPERATOR_CASES", "RTOL", "case_names", "conv3x3_512_case",
           "conv_transpose_case", "flatten_outputs", "get_cases", "iter_cases", "reference_outputs",
           "zoo_case"]

#: Default tolerances of the runner's check (the benchmark's, :mod:`tvm_ollie.bench.check`).
RTOL = 1e-3
ATOL = 1e-3


@dataclasses.dataclass
class Case:
    """A model of a bundle.

    Attributes
    ----------
    name : str
        File-safe name (also the work-dir key of its tuning records).
    mod : tvm.IRModule
        ``main(*inputs)``, weights included among the inputs.
    inputs : list of ndarray
        ``main``'s arguments, in order.
    reference : list of ndarray, optional
        ``main``'s outputs (tuples flattened); None: :func:`reference_outputs` computes them.
    rtol, atol : float
        Tolerances of the check (module :mod:`.manifest`).
    zoo : bool
        A zoo model (``name`` is its :attr:`~tvm_ollie.models.ModelSpec.key`): PyTorch on the
        device can build it again (``torch_device.py``).
    """

    name: str
    mod: object
    inputs: List[np.ndarray]
    reference: Optional[List[np.ndarray]] = None
    rtol: float = RTOL
    atol: float = ATOL
    zoo: bool = False


def flatten_outputs(value) -> List[np.ndarray]:
    """Arrays of a result (a tensor, or tuples/lists of them; VM or PyTorch), in order."""
    if hasattr(value, "numpy"):
        return [np.ascontiguousarray(value.detach().numpy() if hasattr(value, "detach")
                                     else value.numpy())]
    if isinstance(value, dict):
        return [a for v in value.values() for a in flatten_outputs(v)]
    return [a for v in value for a in flatten_outputs(v)]


def reference_outputs(case: Case) -> List[np.ndarray]:
    """``case.reference``, or the outputs of TVM's llvm build of ``case.mod`` on the CPU."""
    if case.reference is not None:
        return case.reference

    ex = tvm.compile(case.mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return flatten_outputs(vm["main"](*[tvm.runtime.tensor(a) for a in case.inputs]))


def zoo_case(name: str) -> Case:
    """A zoo model at its quick size: imported with weights as parameters
    (:func:`tvm_ollie.models.to_relax`), reference = PyTorch eager on the CPU."""
    # lazy: torch is optional and takes seconds to import
    # pylint: disable=import-outside-toplevel
    import torch


    spec = get_model(name, quick=True)
    mod, params = to_relax(spec, weights="params")
    with torch.no_grad():
        reference = flatten_outputs(spec.module(*spec.example_inputs))
    inputs = [x.numpy() for x in spec.example_inputs] + [p.numpy() for p in params]
    return Case(spec.key, mod, inputs, reference, zoo=True)


def _operator_case(name: str, shapes, body, torch_fn) -> Case:
    """A one-operator case: random float32 inputs (seed 0), reference in float64 PyTorch."""
    # lazy: torch is optional and takes seconds to import
    # pylint: disable=import-outside-toplevel
    import torch


    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes]
    mod = single_function_module([tensor_var(f"x{k}", s) for k, s in enumerate(shapes)], body)
    ref = torch_fn(*[torch.from_numpy(a.astype("float64")) for a in inputs])
    return Case(name, mod, inputs, [ref.numpy().astype("float32")])


def conv3x3_512_case() -> Case:
    """W1: ``conv2d(x: 1x512x7x7, w: 512x512x3x3, padding 1)``."""

    def torch_fn(x, w):
        # lazy: torch is optional and takes seconds to import
        import torch  # pylint: disable=import-outside-toplevel

        return torch.nn.functional.conv2d(x, w, padding=1)

    return _operator_case("conv3x3_512", [(1, 512, 7, 7), (512, 512, 3, 3)],
                          lambda bb, x, w: relax.op.nn.conv2d(x, w, padding=1), torch_fn)


def conv_transpose_case() -> Case:
    """EinNet's transposed convolution: ``conv2d_transpose(x: 16x448x2x2, k: 448x256x4x4,
    stride 2, padding 1)`` -> 16x256x4x4."""

    def torch_fn(x, k):
        # lazy: torch is optional and takes seconds to import
        import torch  # pylint: disable=import-outside-toplevel

        return torch.nn.functional.conv_transpose2d(x, k, stride=2, padding=1)

    return _operator_case(
        "convtranspose", [(16, 448, 2, 2), (448, 256, 4, 4)],
        lambda bb, x, k: relax.op.nn.conv2d_transpose(x, k, strides=2, padding=1), torch_fn)


#: The operator cases by name.
OPERATOR_CASES: Dict[str, Callable[[], Case]] = {
    "conv3x3_512": conv3x3_512_case,
    "convtranspose": conv_transpose_case,
}


def case_names() -> List[str]:
    """Every name :func:`get_cases` knows: the zoo's models, then the operator cases."""

    return list(list_models()) + list(OPERATOR_CASES)


def iter_cases(names: Optional[Sequence[str]] = None) -> Iterator[Case]:
    """The cases named (default: :func:`case_names`, all of them), each made when it is
    reached (importing a zoo model runs ``torch.export``); ``ValueError`` for an unknown name,
    before any is made."""
    known = case_names()
    names = list(names) if names else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown bundle models {unknown} (known: {', '.join(known)})")
    return (OPERATOR_CASES[n]() if n in OPERATOR_CASES else zoo_case(n) for n in names)


def get_cases(names: Optional[Sequence[str]] = None) -> List[Case]:
    """:func:`iter_cases` as a list."""
    return list(iter_cases(names))
