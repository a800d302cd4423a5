"""Load a model given on the command line into a Relax ``IRModule``.

Accepted forms:

* ``model.onnx``: imported with TVM's Relax ONNX frontend; weights become constants
  (``keep_params_in_input=False``), so they end up inside the compiled library;
* ``module.json``: a Relax module saved with ``tvm.ir.save_json``;
* ``path/to/file.py:function``: a Python function returning an ``IRModule``, or a
  ``(IRModule, params)`` pair whose params are bound into ``main`` as constants (params: a dict
  from parameter name to array, or ``relax.frontend.detach_params``'s ``{"main": [arrays]}``),
  or an ``(nn.Module, example_inputs)`` pair, imported through ``torch.export``.

Every problem with the model itself raises :class:`ModelLoadError` with a one-line message.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import json
import logging
import os
import re
import sys
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..compat import relax, tvm
from .errors import FrontendError, first_line
from .onnx_decompose import importer_ops
from .onnx_native import native_converters
from .onnx_prep import prepare_onnx
from .onnx_rules import RULES
from .torch_entry import from_torch


_LOG = logging.getLogger(__name__)


class ModelLoadError(FrontendError):
    """The model cannot be loaded: missing or corrupt file, unsupported format or operator."""

def parse_shapes(specs: Union[Sequence[str], Mapping[str, Sequence[int]], None]
                 ) -> Dict[str, List[int]]:  # fmt: skip
    """``["x=1,3,224,224"]`` (or ``{"x": (1, 3, 224, 224)}``) -> ``{"x": [1, 3, 224, 224]}``."""
    if isinstance(specs, Mapping):
        specs = [f"{name}={','.join(str(d) for d in dims)}" for name, dims in specs.items()]
    shapes = {}
    for spec in specs or ():
        name, sep, dims = spec.partition("=")
        if not sep or not name:
            raise ModelLoadError(f"bad --shape {spec!r}: expected NAME=D1,D2,...")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError as err:
            raise ModelLoadError(f"bad --shape {spec!r}: dimensions must be integers") from err
        if any(d <= 0 for d in shapes[name]):
            raise ModelLoadError(f"bad --shape {spec!r}: dimensions must be positive")
    return shapes


ShapeSpecs = Union[Sequence[str], Mapping[str, Sequence[int]], None]


def load_module(model: str, shapes: ShapeSpecs = ()) -> "tvm.IRModule":
    """Load ``model`` (see the module docstring) as a Relax IRModule.

    Parameters
    ----------
    model : str
        ``file.onnx``, ``file.json`` or ``file.py:function``.
    shapes : sequence of str, or mapping from input name to dimensions
        ``NAME=D1,D2,...`` input shapes (or ``{"x": (1, 3, 48, 192)}``); only ONNX models use
        them (to fix dynamic dimensions, so that shape computations fold to constants).

    Returns
    -------
    mod : tvm.IRModule
        The Relax module, with every weight a constant.
    """
    path, sep, func_name = model.rpartition(":")
    if sep and path.endswith(".py"):
        return _load_python(path, func_name)
    if not os.path.exists(model):
        raise ModelLoadError(f"no such model file: {model}")
    if os.path.isdir(model):
        raise ModelLoadError(f"{model} is a directory, not a model file")
    if model.endswith(".onnx"):
        return load_onnx(model, shapes)
    if model.endswith(".json"):
        return _load_json(model)
    raise ModelLoadError(
        f"unsupported model format: {model} (expected .onnx, .json or file.py:function)"
    )


def load_onnx(model, shapes: ShapeSpecs = None, simplifier: str = "auto") -> "tvm.IRModule":
    """Import an ONNX model as exporters write it (dynamic axes, shape arithmetic) into Relax.

    The named inputs get the given shapes, then shape computations and constant subgraphs are
    folded to constants (:func:`~tvm_ollie.frontend.onnx_prep.prepare_onnx`) before TVM's
    importer runs: ``Shape -> Cast/Gather/Concat -> Reshape`` chains, which the importer cannot
    follow, become constant reshape targets. A model whose inputs are all static is folded too.

    Parameters
    ----------
    model : str or onnx.ModelProto
        An ``.onnx`` path or a loaded model.
    shapes : mapping from input name to dimensions, or ``NAME=D1,D2,...`` strings, optional
        Shapes of inputs with dynamic dimensions.
    simplifier : str
        ``"auto"``, ``"onnxslim"``, ``"onnxsim"``, ``"builtin"`` or ``"none"`` (see
        :func:`~tvm_ollie.frontend.onnx_prep.prepare_onnx`).

    Returns
    -------
    mod : tvm.IRModule
        The Relax module, weights as constants.

    Raises
    ------
    ModelLoadError
        One line: an unreadable file, a bad shape, or the operator (and node) TVM cannot import.
    """
    try:
        # lazy: onnx is optional
        import onnx  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise ModelLoadError("loading ONNX models needs the 'onnx' package") from err
    path = model if isinstance(model, str) else "<onnx model>"
    if isinstance(model, str):
        try:
            model = onnx.load(model)
        except Exception as err:  # onnx raises DecodeError and others for corrupt files
            raise ModelLoadError(f"cannot read ONNX file {path}: {first_line(err)}") from err
    shapes = parse_shapes(shapes)
    _check_shapes(path, model, shapes)
    original = model
    refused: Dict[str, str] = {}
    if not shapes and _dynamic_inputs(model):
        refused = _decomposable_without_shapes(model)
    if shapes or not _dynamic_inputs(model):
        with _quiet_stderr():
            model, prep = prepare_onnx(model, shapes, simplifier=simplifier)
        refused = prep.decomposed.refused
        if prep.decomposed.summary():
            _LOG.info("%s: decomposed for TVM's importer: %s", path, prep.decomposed.summary())
    _check_supported_ops(path, model, original, refused)
    # The importer prints the failing operator on stdout, and the C++ BlockBuilder it leaves
    # unfinished warns on stderr when freed: both are replaced by the one-line error.
    with _quiet_stderr():
        mod, failure = _import_onnx(path, model, shapes)
        if failure and model is not original:
            # What the simplifier wrote does not import: the model as given may (the error
            # reported stays the first one when neither does).
            mod, _ = _import_onnx(path, original, shapes)
            failure = None if mod is not None else failure
        gc.collect()
    if failure:
        dynamic = [name for name in _dynamic_inputs(model) if name not in shapes]
        if dynamic:
            failure += f" (inputs {', '.join(dynamic)} have dynamic dimensions: fix them with " \
                "--shape NAME=D1,D2,...)"
        raise ModelLoadError(failure)
    return mod


def _check_shapes(path: str, model, shapes: Dict[str, List[int]]) -> None:
    """Every named input exists and gets as many dimensions as it declares."""
    graph_inputs = {i.name: i for i in model.graph.input}
    unknown = sorted(set(shapes) - set(graph_inputs))
    if unknown:
        raise ModelLoadError(
            f"--shape names {', '.join(unknown)} are not inputs of {path} "
            f"(inputs: {', '.join(sorted(graph_inputs)) or 'none'})"
        )
    for name, dims in shapes.items():
        declared = _declared_rank(graph_inputs[name])
        if declared is not None and declared != len(dims):
            raise ModelLoadError(
                f"--shape {name}={','.join(map(str, dims))} has {len(dims)} dimensions, but "
                f"input {name} of {path} has {declared}"
            )


def _dynamic_inputs(model) -> List[str]:
    """Graph inputs (not initializers) with a dimension that is not a fixed number."""
    weights = {t.name for t in model.graph.initializer}
    names = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in weights and any(not d.HasField("dim_value") for d in dims):
            names.append(value.name)
    return names


def _import_onnx(path: str, model, shapes: Dict[str, List[int]]):
    """``(module, None)``, or ``(None, one-line message)`` when TVM's importer fails."""
    # lazy: TVM's ONNX importer needs onnx (optional)
    from tvm.relax.frontend.onnx import from_onnx  # pylint: disable=import-outside-toplevel

    printed = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(printed), \
                native_converters():
            # The ONNX checker's complaint about outputs declared without a shape is harmless.
            warnings.filterwarnings("ignore", message="Field 'shape' of 'type' is required")
            return from_onnx(model, shape_dict=shapes or None, keep_params_in_input=False), None
    except tvm.error.OpNotImplemented as err:
        return None, f"{path}: {first_line(err)}"
    except (RuntimeError, ValueError, KeyError, AttributeError, IndexError, TypeError) as err:
        found = re.search(r"Error converting operator (\S+?),", printed.getvalue())
        where = ""
        if found:
            nodes = [n.name for n in model.graph.node if n.op_type == found.group(1)]
            where = f" (operator {found.group(1)}" + (
                f", node '{nodes[0]}')" if len(nodes) == 1 and nodes[0] else ")")
        return None, f"cannot import ONNX file {path}{where}: {first_line(err)}"


def _declared_rank(value_info) -> Optional[int]:
    """The rank an ONNX graph input declares (None when it declares no shape)."""
    tensor_type = value_info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return len(tensor_type.shape.dim)


def _unsupported_nodes(model) -> List[Tuple[int, Any]]:
    """``(index, node)`` of every node TVM's ONNX importer has no converter for."""
    known = importer_ops()
    if not known:  # a TVM without that table: let the importer check
        return []
    return [(i, n) for i, n in enumerate(model.graph.node) if n.op_type not in known]


def _decomposable_without_shapes(model) -> Dict[str, str]:
    """Operator -> why it was not decomposed, for the decomposable operators of a model whose
    inputs have dynamic dimensions (decompositions need static shapes)."""
    why = "inputs have dynamic dimensions: fix them with --shape NAME=D1,D2,..."
    return {n.op_type: why for n in model.graph.node if n.op_type in RULES}


def _check_supported_ops(path: str, model, original=None,
                         refused: Optional[Mapping[str, str]] = None) -> None:  # fmt: skip
    """Name the first operator (and its node) that TVM's ONNX importer has no converter for.

    ``model`` is what will be imported; nodes are named as in ``original`` (the user's file:
    simplifiers rename unnamed nodes), whose unsupported nodes folding did not remove.
    ``refused`` (operator -> reason) says why a decomposition rule did not apply.
    """
    missing = _unsupported_nodes(model)
    if not missing:
        return
    if original is not None and original is not model:
        left = {node.op_type for _, node in missing}
        missing = [(i, n) for i, n in _unsupported_nodes(original) if n.op_type in left] or missing
    index, node = missing[0]
    name = f"node '{node.name}'" if node.name else f"node #{index}"
    more = f" (and {len(missing) - 1} more unsupported node(s))" if len(missing) > 1 else ""
    why = (refused or {}).get(node.op_type)
    why = f"; not decomposed: {why}" if why else ""
    raise ModelLoadError(
        f"{path}: operator {node.op_type} ({name}) is not supported by TVM's ONNX importer"
        f"{more}{why}"
    )


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Send the process's standard error (C++ logging) to /dev/null meanwhile."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stderr.flush()
    saved = []
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        yield
        return
    try:
        with contextlib.suppress(OSError):
            saved.append((2, os.dup(2)))
            os.dup2(devnull, 2)
        yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
        os.close(devnull)


def _load_json(path: str) -> "tvm.IRModule":
    with open(path, encoding="utf-8") as file:
        text = file.read()
    try:
        json.loads(text)
    except ValueError as err:
        raise ModelLoadError(f"{path} is not valid JSON: {err}") from err
    try:
        mod = tvm.ir.load_json(text)
    except Exception as err:  # the FFI raises several error types for foreign JSON
        raise ModelLoadError(
            f"{path} is not a module saved by tvm.ir.save_json: {first_line(err)}"
        ) from err
    if not isinstance(mod, tvm.IRModule):
        raise ModelLoadError(f"{path} holds a {type(mod).__name__}, not an IRModule")
    return mod


def _load_python(path: str, func_name: str) -> "tvm.IRModule":
    if not os.path.exists(path):
        raise ModelLoadError(f"no such file: {path}")
    if not func_name.isidentifier():
        raise ModelLoadError(f"bad function name {func_name!r} in {path}:{func_name}")
    spec = importlib.util.spec_from_file_location("_ollie_user_model", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise ModelLoadError(f"{path}: {first_line(err)}") from err
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ModelLoadError(f"{path} has no function {func_name!r}")
    result = func()
    params = None
    if isinstance(result, tuple) and len(result) == 2:
        result, params = result
    if _is_torch_module(result):
        return _load_torch(f"{path}:{func_name}", result, params)
    if not isinstance(result, tvm.IRModule):
        raise ModelLoadError(
            f"{path}:{func_name} returned {type(result).__name__}, not an IRModule, "
            "an (IRModule, params) pair or an (nn.Module, example_inputs) pair"
        )
    return bind_params(result, params) if params else result


def _is_torch_module(value) -> bool:
    torch = sys.modules.get("torch")  # a file returning an nn.Module has imported torch
    return torch is not None and isinstance(value, torch.nn.Module)


def _load_torch(where: str, module, example_inputs) -> "tvm.IRModule":
    """An ``(nn.Module, example_inputs)`` pair, imported through ``torch.export``."""

    if example_inputs is None:
        raise ModelLoadError(f"{where} returned an nn.Module without example inputs")
    try:
        return from_torch(module, example_inputs)
    except FrontendError as err:
        raise ModelLoadError(f"{where}: {err}") from err


def bind_params(mod: "tvm.IRModule", params: Mapping[str, Any]) -> "tvm.IRModule":
    """Bind weights into ``main`` as constants, so that compiling embeds them in the library.

    ``params`` maps parameter names to arrays, or is ``detach_params``'s ``{"main": [arrays]}``:
    the arrays then fill the trailing parameters of ``main`` (``detach_params`` removes the
    weights from the end of the parameter list and records the number of real inputs).
    """
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ModelLoadError("the module has no 'main' function to bind params into")
    func = mod["main"]
    names = [p.name for p in func.params]
    if isinstance(params.get("main"), (list, tuple)):
        values = list(params["main"])
        if len(values) > len(names):
            raise ModelLoadError(
                f"{len(values)} params given but main has only {len(names)} parameters"
            )
        params = dict(zip(names[len(names) - len(values):], values))
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise ModelLoadError(f"params {', '.join(unknown)} are not parameters of main")
    arrays = {name: _to_tensor(name, value) for name, value in params.items()}
    mod = relax.transform.BindParams("main", arrays)(mod)
    if "num_input" in (mod["main"].attrs or {}):
        # The attribute counted the inputs before the weights; with the weights bound every
        # remaining parameter is an input.
        mod["main"] = mod["main"].without_attr("num_input")
    return mod


def _to_tensor(name: str, value: Any) -> "tvm.runtime.Tensor":
    if isinstance(value, tvm.runtime.Tensor):
        return value
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    try:
        return tvm.runtime.tensor(np.ascontiguousarray(value))
    except (TypeError, ValueError) as err:
        raise ModelLoadError(f"param {name!r} is not an array: {type(value).__name__}") from err


def iter_op_calls(mod: "tvm.IRModule") -> Iterator[Tuple[str, "relax.Var", "relax.Call"]]:
    """Every ``var = op(...)`` binding of a Relax operator, as (function, var, call)."""
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        body = func.body
        for block in getattr(body, "blocks", ()):
            for binding in block.bindings:
                value = getattr(binding, "value", None)
                if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    yield gv.name_hint, binding.var, value
