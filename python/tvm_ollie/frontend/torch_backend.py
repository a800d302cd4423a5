"""The ``torch.compile`` backend: ``torch.compile(model, backend="tvm_ollie")``.

TorchDynamo hands the backend each captured FX graph (graph breaks split a model into several),
with the module's parameters and buffers lifted to graph inputs. The backend freezes them: they
become constants of the imported module, as the ONNX path and PyTorch's own freezing have them
(:mod:`.torch_freeze` says when that is safe, and guards every call against a changed weight),
and batch norms after convolutions fold into the convolutions' weights (:mod:`.torch_fold`).
It imports the graph with TVM's ``from_fx`` (or, for graphs ``from_fx`` cannot convert, with
``torch.export`` and ``from_exported_program``), builds it with the ollie pipeline (``trials=0``
unless ``options`` say otherwise) and returns a function that runs it on the Relax VM, with the
user's inputs and the outputs exchanged through DLPack (zero-copy on CPU). Each compiled graph
is run once on the example inputs dynamo hands over and compared with eager PyTorch (the
tolerance of the output's dtype): an importer whose module computes something else is not used
(the next importer is tried). A graph that cannot be converted, built or matched (an operator
TVM lacks, symbolic shapes, autograd) runs in eager PyTorch instead, with one warning naming the
reason; the other graphs of the model still use TVM.

Options (``torch.compile(..., options={...})``): ``freeze`` (default True; False keeps every
weight an input of the compiled graph, which then follows in-place weight updates without
falling back), ``config`` (an :class:`~tvm_ollie.config.OllieConfig`) and any keyword of
:func:`tvm_ollie.pipeline.build` overriding its fields (``target``, default llvm; ``trials``,
default 0; ``work_dir``, ``max_depth``, ``search_time_s``, ``library``, ``derive``,
``calibration``...), validated when a graph is built (an invalid option is a graph that runs in
eager PyTorch, its warning naming the option).

The backend is found by name through the ``torch_dynamo_backends`` entry point of the package;
:func:`register` (called by ``import tvm_ollie`` when TorchDynamo is already imported, and by
``tvm_ollie.from_torch``) registers it directly for installs whose metadata lacks the entry.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from ..pipeline import build
from ..verify.tolerance import tolerance
from .errors import first_line
from .torch_entry import from_tvm, to_tvm
from .torch_fold import fold_batch_norms
from .torch_freeze import FrozenInputs, freezable_inputs, freeze_graph, mutated_inputs

#: The name ``torch.compile(backend=...)`` knows the backend by.
BACKEND_NAME = "tvm_ollie"

#: Reasons already warned about (one warning per distinct reason and process).
_WARNED: set = set()

#: Graphs handled in this process: ``compiled`` by TVM, or left to ``eager`` PyTorch.
STATS: Dict[str, int] = {"compiled": 0, "eager": 0}


class EagerFallback(Exception):
    """A graph the backend leaves to eager PyTorch; the message says why."""

def tvm_ollie_backend(gm, example_inputs: Sequence[Any], options: Optional[Dict] = None
                      ) -> Callable:  # fmt: skip
    """Compile one captured FX graph with tvm-ollie, or return it unchanged (eager) on failure.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The graph TorchDynamo captured.
    example_inputs : sequence of torch.Tensor
        Its inputs (weights included, as dynamo lifts them to graph inputs).
    options : dict, optional
        ``torch.compile``'s ``options``: ``freeze``, ``target``, ``trials``, ``work_dir`` and
        the keywords of :func:`tvm_ollie.pipeline.build`.

    Returns
    -------
    callable
        Runs the graph: the TVM-compiled function, or ``gm.forward`` when it fell back.
    """
    try:
        compiled = _compile_graph(gm, list(example_inputs), dict(options or {}))
        STATS["compiled"] += 1
        return compiled
    except Exception as err:  # pylint: disable=broad-except  # any failure: eager, one warning
        reason = first_line(err) if isinstance(err, EagerFallback) else (
            f"{type(err).__name__}: {first_line(err)}")
        _warn_once(f"tvm_ollie: a graph of {len(gm.graph.nodes)} nodes runs in eager PyTorch "
                   f"({reason})")  # fmt: skip
        STATS["eager"] += 1
        return gm.forward


def _compile_graph(gm, example_inputs: List[Any], options: Dict) -> Callable:
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    input_info = []
    for value in example_inputs:
        if not isinstance(value, torch.Tensor):
            raise EagerFallback(f"a non-tensor graph input ({type(value).__name__}): symbolic "
                                "shapes are not supported; torch.compile(..., dynamic=False)")
        if any(not isinstance(d, int) for d in value.shape):
            raise EagerFallback("symbolic shapes are not supported; use dynamic=False")
        if torch.is_grad_enabled() and value.requires_grad:
            raise EagerFallback("autograd is not supported (run under torch.no_grad())")
        if value.device.type != "cpu":
            raise EagerFallback(f"inputs on {value.device.type}: the backend runs on the CPU")
        input_info.append((tuple(value.shape), str(value.dtype).replace("torch.", "")))
    freeze = options.pop("freeze", True)
    single = _returns_single_tensor(gm)
    gm.graph.eliminate_dead_code()
    outputs, mutated = mutated_inputs(gm, example_inputs)
    expected = _flat(outputs)
    frozen = FrozenInputs(example_inputs, freezable_inputs(gm, example_inputs, mutated)
                          if freeze else ())  # fmt: skip
    graph = gm
    if frozen.count:
        graph = freeze_graph(gm, {i: example_inputs[i] for i in frozen.positions})
        fold_batch_norms(graph)
    live_inputs = [example_inputs[i] for i in frozen.live]
    live_info = [input_info[i] for i in frozen.live]
    failures = []
    for importer, mod in _imported_graphs(graph, live_inputs, live_info, single, failures):
        # options: ``config`` (an OllieConfig) and overrides of its fields (target, trials...)
        executable, _ = build(mod, **options)
        main = relax.VirtualMachine(executable, tvm.cpu(0))["main"]
        run = _runner(main, single, frozen, gm.forward)
        why = _differs(expected, _flat(run(*example_inputs)))
        if why is None:
            return run
        failures.append(f"{importer}: the compiled graph {why}")
    raise EagerFallback("; ".join(failures))


def _runner(main, single: bool, frozen: FrozenInputs, eager: Callable) -> Callable:
    """The compiled graph as dynamo calls it: every graph input in, a tuple of tensors out.

    Only the inputs that were not frozen go to the VM; the frozen ones are guarded (same
    tensors, unmodified), and a call whose weights changed since the build runs ``eager``.
    """
    live = frozen.live

    def run(*inputs):
        if frozen.count and not frozen.holds(inputs):
            _warn_once("tvm_ollie: a module parameter or buffer changed since the graph was "
                       "compiled with it as a constant; the graph runs in eager PyTorch "
                       "(torch._dynamo.reset() and compile again, or options={'freeze': "
                       "False})")  # fmt: skip
            return eager(*inputs)
        outputs = from_tvm(main(*[to_tvm(inputs[i]) for i in live]))
        return outputs if single or isinstance(outputs, tuple) else (outputs,)

    run.frozen = frozen  # what was frozen, and the guard
    run.main = main  # the VM function (benchmarks time it alone)
    return run


def _imported_graphs(gm, example_inputs: List[Any], input_info: List, single: bool,
                     failures: List[str]):
    """The graph as Relax modules, one per importer that converts it: TVM's ``from_fx``, then
    ``torch.export`` of the graph and ``from_exported_program`` (the next importer is tried when
    a module's outputs differ from eager PyTorch on the example inputs; ``failures`` collects
    why each one was not used).

    Dynamo's graphs call ``torch.nn.functional`` (e.g. ``batch_norm``), some of which
    ``from_fx`` lacks; ``torch.export`` decomposes them into ATen operators TVM converts. Every
    graph input (those not frozen) stays a parameter of ``main``, in order; ``get_attr`` tensors
    (the frozen weights) become constants.
    """
    # lazy: torch is optional and takes seconds to import
    # pylint: disable=import-outside-toplevel
    import torch
    from tvm.relax.frontend.torch import from_exported_program, from_fx

    try:
        yield "from_fx", from_fx(gm, input_info, unwrap_unit_return_tuple=single)
    except Exception as err:  # pylint: disable=broad-except  # an op from_fx lacks
        failures.append(f"from_fx: {first_line(err)}")
    try:
        with torch.no_grad():
            program = torch.export.export(gm, tuple(example_inputs))
        mod = from_exported_program(program, unwrap_unit_return_tuple=single)
    except Exception as err:  # pylint: disable=broad-except
        failures.append(f"torch.export + from_exported_program: {first_line(err)}")
        return
    yield "torch.export + from_exported_program", mod


def _flat(outputs) -> list:
    """The tensors of a graph's outputs, in order (nested tuples and lists flattened)."""
    if isinstance(outputs, (tuple, list)):
        return [t for o in outputs for t in _flat(o)]
    return [outputs]


def _differs(expected: list, got: list) -> Optional[str]:
    """Why ``got`` is not ``expected`` (None when every tensor agrees within the tolerance of its
    dtype, relative to its largest magnitude): the backend never returns a wrong graph."""


    if len(expected) != len(got):
        return f"returns {len(got)} outputs, eager {len(expected)}"
    for k, (ref_t, out_t) in enumerate(zip(expected, got)):
        if tuple(ref_t.shape) != tuple(out_t.shape):
            return f"output {k} has shape {list(out_t.shape)}, eager {list(ref_t.shape)}"
        if not ref_t.is_floating_point():
            if not np.array_equal(ref_t.detach().numpy(), out_t.detach().numpy()):
                return f"output {k} differs from eager"
            continue
        dtype = str(ref_t.dtype).replace("torch.", "")
        ref = ref_t.detach().double().numpy()
        out = out_t.detach().double().numpy()
        err = float(np.max(np.abs(out - ref))) if ref.size else 0.0
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        if not np.isfinite(err) or err > tolerance(dtype) * max(scale, 1e-6):
            return f"differs from eager on the example inputs (output {k}: max abs err " \
                   f"{err:.3g}, scale {scale:.3g})"
    return None


def _returns_single_tensor(gm) -> bool:
    """Whether the graph's output is one value rather than a tuple/list (dynamo: usually not)."""
    for node in gm.graph.nodes:
        if node.op == "output":
            return not isinstance(node.args[0], (tuple, list))
    return False


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def register() -> bool:
    """Register the backend with TorchDynamo under :data:`BACKEND_NAME` (idempotent).

    Returns True when it is known to dynamo afterwards (by this call or the entry point).
    """
    try:
        # lazy: torch is optional and takes seconds to import
        # pylint: disable=import-outside-toplevel
        from torch._dynamo.backends import registry
    except ImportError:
        return False
    # pylint: disable=protected-access
    if BACKEND_NAME in registry._COMPILER_FNS:
        return True
    if registry._BACKENDS.get(BACKEND_NAME) is not None:
        # Found through the entry point: torch registers it when it loads it (perhaps right
        # now, importing this module); registering here too would be a duplicate name.
        return True
    registry.register_backend(tvm_ollie_backend, name=BACKEND_NAME)
    return True
