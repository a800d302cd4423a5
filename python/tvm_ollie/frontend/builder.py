"""Re-export: the one-function Relax module helpers live in :mod:`tvm_ollie.codegen.builder`."""

from ..codegen.builder import single_function_module, tensor_var  # noqa: F401

__all__ = ["single_function_module", "tensor_var"]
