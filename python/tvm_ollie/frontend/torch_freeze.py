"""Freezing the weights of a TorchDynamo graph: module parameters and buffers become constants.

TorchDynamo lifts every parameter and buffer of the compiled module to an input of the graph it
hands a backend, so a graph imported as it comes takes the weights as arguments of ``main``:
nothing that depends on them alone (a native kernel's weight reorder, a derived program's
weight gather, a transposed or concatenated weight) folds at compile time, and every call pays
for it, and for passing each weight through DLPack. Inference wants what the ONNX path gets
and what PyTorch's own freezing (``torch._inductor.config.freezing``) does: the weights bound
into the compiled module as constants.

A graph input is frozen when it is safe to:

* dynamo marked it a *static input*: a parameter or buffer of an ``nn.Module``
  (``node.meta["tensor_dict"]["_dynamo_static_input_type"]``, or an ``nn.Parameter``), never a
  tensor the user passes;
* it does not require grad while grad is enabled (the backend compiles inference only);
* running the graph does not modify it in place (its version counter is unchanged after a run
  on copies, e.g. batch norm in training mode updating its running statistics).

Unlike PyTorch's freezing, which assumes the weights never change, a frozen graph is guarded:
each call checks that every frozen input is the same tensor object, at the same address, with
the same version counter (``tensor._version``, which every in-place write bumps, e.g.
``load_state_dict`` or an optimizer step). When one changed, the call runs the graph in eager
PyTorch (:class:`FrozenInputs` says so once), so results never come from stale weights.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

#: The name prefix of the frozen tensors in the frozen graph module.
FROZEN_PREFIX = "_ollie_frozen_"


def is_module_state(node, value) -> bool:
    """Whether graph input ``node`` (example ``value``) is a parameter or buffer of a module,
    as dynamo marks it (a static input), rather than a tensor the user passes."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    if isinstance(value, torch.nn.Parameter):
        return True
    tensor_dict = node.meta.get("tensor_dict") or {}
    return tensor_dict.get("_dynamo_static_input_type") is not None


def freezable_inputs(gm, example_inputs: Sequence[Any], mutated: Sequence[bool]) -> List[int]:
    """Positions of the graph inputs that may be frozen (see the module docstring).

    Parameters
    ----------
    gm : torch.fx.GraphModule
        The graph dynamo captured.
    example_inputs : sequence of torch.Tensor
        Its inputs, in placeholder order.
    mutated : sequence of bool
        Per input: whether running the graph modified it in place.
    """
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    grad = torch.is_grad_enabled()
    return [i for i, (node, value) in enumerate(zip(placeholders, example_inputs))
            if isinstance(value, torch.Tensor) and is_module_state(node, value)
            and not mutated[i] and not (grad and value.requires_grad)]


def mutated_inputs(gm, example_inputs: Sequence[Any]) -> Tuple[list, List[bool]]:
    """Run ``gm`` on copies of its inputs: (its flat outputs, per input whether the run wrote
    to it in place). The originals are left untouched.

    A write shows as a bumped version counter or as changed values: some kernels update an
    argument without bumping its counter (``native_batch_norm``'s running statistics).
    """
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in example_inputs]
    before = [x._version if isinstance(x, torch.Tensor) else 0 for x in copies]
    with torch.no_grad():
        outputs = gm(*copies)
    mutated = []
    for x, copy, version in zip(example_inputs, copies, before):
        mutated.append(isinstance(x, torch.Tensor) and (
            copy._version != version or not torch.equal(copy, x)))
    return outputs, mutated


def freeze_graph(gm, frozen: Dict[int, Any]):
    """A copy of ``gm`` whose inputs at the positions of ``frozen`` are module attributes
    (``get_attr`` of the given tensors) instead of placeholders; ``gm`` is left unchanged.

    TVM's ``from_fx`` imports ``get_attr`` tensors as constants, and ``torch.export`` +
    ``from_exported_program`` binds them as constants too.
    """
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    graph = torch.fx.Graph()
    root: Dict[str, Any] = {}
    env: Dict[Any, Any] = {}
    position = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if position in frozen:
                name = f"{FROZEN_PREFIX}{position}"
                root[name] = frozen[position]
                env[node] = graph.get_attr(name)
                env[node].meta = dict(node.meta)
            else:
                env[node] = graph.node_copy(node, lambda n: env[n])
            position += 1
            continue
        if node.op in ("get_attr", "call_module"):
            root[node.target] = _fetch(gm, node.target)
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.lint()
    return torch.fx.GraphModule(root, graph)


def _fetch(gm, target: str):
    value = gm
    for atom in target.split("."):
        value = getattr(value, atom)
    return value


class FrozenInputs:
    """Which inputs of a graph were frozen, and the guard that they still hold those values.

    Parameters
    ----------
    inputs : sequence of torch.Tensor
        The graph's example inputs (the frozen ones are the module's own tensors).
    frozen : sequence of int
        Positions of the frozen inputs.
    """

    def __init__(self, inputs: Sequence[Any], frozen: Sequence[int]):
        frozen_set = set(frozen)
        #: positions of the inputs the compiled function still takes, in order
        self.live = tuple(i for i in range(len(inputs)) if i not in frozen_set)
        self._frozen = tuple(sorted(frozen_set))
        # the tensors themselves (kept alive, so that ``is`` cannot match a recycled object)
        self._tensors = tuple(inputs[i] for i in self._frozen)
        self._state = tuple((x.data_ptr(), x._version) for x in self._tensors)

    def holds(self, inputs: Sequence[Any]) -> bool:
        """Whether every frozen input of this call is the tensor frozen, at the same address
        and unmodified (same version counter)."""
        for i, x, (ptr, version) in zip(self._frozen, self._tensors, self._state):
            y = inputs[i]
            if y is not x or y._version != version or y.data_ptr() != ptr:
                return False
        return True

    @property
    def positions(self) -> Tuple[int, ...]:
        """Positions of the frozen inputs."""
        return self._frozen

    @property
    def count(self) -> int:
        """How many inputs are frozen."""
        return len(self._frozen)
