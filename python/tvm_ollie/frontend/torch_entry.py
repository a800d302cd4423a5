"""PyTorch entry points: ``nn.Module`` -> Relax ``IRModule`` -> a compiled, torch-callable model.

:func:`from_torch` captures the module with ``torch.export.export`` and imports the exported
program with TVM's ``from_exported_program``; :func:`compile_torch` then builds it with the
ollie pipeline and returns a callable that takes and returns torch tensors, exchanged with the
Relax VM through DLPack (no copies on CPU).

torch is imported only when these functions run, so ``import tvm_ollie`` does not need it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence, Tuple

from ..compat import relax, tvm
from ..config import OllieConfig, resolve_config
from ..pipeline import build
from ..target import kind_name, normalize_target
from .errors import FrontendError, first_line


class TorchImportError(FrontendError):
    """``torch.export`` or TVM's importer rejected the module (one-line message)."""

def from_torch(module, example_inputs: Sequence[Any], *, dynamic_shapes=None,
               keep_params_as_input: bool = False) -> "tvm.IRModule":  # fmt: skip
    """Import a PyTorch module into Relax through ``torch.export``.

    Parameters
    ----------
    module : torch.nn.Module
        The model; it is exported in eval mode under ``torch.no_grad``, as inference runs it.
    example_inputs : sequence of torch.Tensor
        Positional inputs; their shapes and dtypes become ``main``'s parameter types.
    dynamic_shapes : optional
        Passed to ``torch.export.export`` (dimensions left symbolic in the Relax module).
    keep_params_as_input : bool
        False (default): weights are bound into ``main`` as constants, so a compiled library
        holds them. True: weights stay trailing parameters of ``main`` and are attached as the
        ``params`` attribute, as TVM does (split them off with ``relax.frontend.detach_params``).

    Returns
    -------
    mod : tvm.IRModule
        ``main(*inputs)``; a single output is returned as a tensor, several as a tuple.
    """
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel
    from tvm.relax.frontend.torch import from_exported_program  # pylint: disable=C0415

    if not isinstance(module, torch.nn.Module):
        raise TorchImportError(f"from_torch needs a torch.nn.Module, got {type(module).__name__}")
    inputs = example_inputs_tuple(example_inputs)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            program = torch.export.export(module, inputs, dynamic_shapes=dynamic_shapes)
    except Exception as err:  # torch.export raises many error types (Unsupported, UserError...)
        raise TorchImportError(f"torch.export failed: {first_line(err)}") from err
    finally:
        module.train(was_training)
    try:
        return from_exported_program(program, keep_params_as_input=keep_params_as_input,
                                     unwrap_unit_return_tuple=True)  # fmt: skip
    except Exception as err:  # the importer raises AssertionError/KeyError for unknown ops
        raise TorchImportError(f"TVM cannot import the exported program: {first_line(err)}"
                               ) from err  # fmt: skip


@dataclasses.dataclass
class TorchCompiled:
    """A module compiled by :func:`compile_torch`: call it with torch tensors.

    Attributes
    ----------
    mod : tvm.IRModule
        The imported Relax module (before the ollie rewrite).
    executable : tvm.runtime.Executable
        The compiled module.
    report : OptimizeReport
        What the ollie pass chose for each operator (``print(report)``).
    device : tvm.runtime.Device
        Where it runs.
    """

    mod: "tvm.IRModule"
    executable: Any
    report: Any
    device: Any
    _vm: Any = None

    def __post_init__(self):
        self._vm = relax.VirtualMachine(self.executable, self.device)

    def __call__(self, *inputs):
        """Run on torch tensors (zero-copy in and out through DLPack); torch tensors back."""
        return from_tvm(self._vm["main"](*[to_tvm(x) for x in inputs]))


def compile_torch(module, example_inputs: Sequence[Any], target=None,
                  config: Optional[OllieConfig] = None, **options) -> TorchCompiled:
    """:func:`from_torch`, then the ollie pass and TVM's build; returns a torch-callable model.

    ``config`` (an :class:`~tvm_ollie.config.OllieConfig`), ``target`` and ``options``
    (overrides of its fields: ``trials``, ``work_dir``, ``max_depth``, ``search_time_s``...,
    and :func:`tvm_ollie.pipeline.build`'s test hooks) go to :func:`tvm_ollie.pipeline.build`;
    the target defaults to llvm.
    """

    mod = from_torch(module, example_inputs)
    target = resolve_config(config, target=target).target or "llvm"
    executable, report = build(mod, target=target, config=config, **options)
    kind = kind_name(normalize_target(target))
    device = tvm.cuda(0) if kind == "cuda" else tvm.cpu(0)
    return TorchCompiled(mod, executable, report, device)


def to_tvm(tensor) -> "tvm.runtime.Tensor":
    """A torch tensor as a TVM tensor sharing its memory (a contiguous, detached view)."""
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tvm.runtime.from_dlpack(tensor)


def from_tvm(value):
    """TVM outputs (a tensor or nested tuples of tensors) as torch tensors, sharing memory."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tvm.runtime.Tensor):
        return torch.from_dlpack(value)
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return tuple(from_tvm(v) for v in value)
    raise TorchImportError(f"unexpected output of type {type(value).__name__}")


def example_inputs_tuple(example_inputs) -> Tuple[Any, ...]:
    """Example inputs as a tuple (a single tensor is allowed)."""
    return tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (
        example_inputs,)
