"""Batch-norm folding on a frozen TorchDynamo graph: ``batch_norm(conv(x))`` -> ``conv(x)``.

In inference a batch norm after a convolution is an affine map per output channel, so it folds
into the convolution's weights (what the ONNX exporter does to an eval-mode model, and what
PyTorch's own freezing does):

    s  = γ / √(σ² + ε)                       per output channel c
    W' = W · s[c]      (conv: W[c, ...];  transposed conv, one group: W[:, c, ...])
    b' = (b − μ) · s + β                      (b = 0 when the conv has no bias)

Without it, the imported module runs a separate normalization between each convolution and its
activation, so the native kernels cannot take the bias, residual and activation as epilogues.

A pair folds only when it is safe: the batch norm is in inference mode (``training=False``),
its statistics and affine parameters and the convolution's weight and bias are frozen
constants (``get_attr`` of tensors, :mod:`.torch_freeze`), and the convolution's output feeds
the batch norm alone. The folded weights are computed in float64 and cast back.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

#: The name prefix of the folded weights in the graph module.
FOLDED_PREFIX = "_ollie_folded_"


def _conv_targets():
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    plain = {torch.conv1d, torch.conv2d, torch.conv3d}
    transposed = {torch.conv_transpose1d, torch.conv_transpose2d, torch.conv_transpose3d}
    return plain, transposed


def fold_batch_norms(gm) -> int:
    """Fold every safe (convolution, batch norm) pair of ``gm`` in place; returns how many.

    Parameters
    ----------
    gm : torch.fx.GraphModule
        A graph whose module weights are ``get_attr`` nodes (frozen).
    """
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    plain, transposed = _conv_targets()
    folded = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not torch.nn.functional.batch_norm:
            continue
        bn = _bn_arguments(gm, node)
        if bn is None:
            continue
        conv = bn["input"]
        if (conv.op != "call_function" or conv.target not in plain | transposed
                or len(conv.users) != 1):
            continue
        is_transposed = conv.target in transposed
        weight = _constant(gm, _argument(conv, 1, "weight"))
        bias_node = _argument(conv, 2, "bias")
        bias = None if bias_node is None else _constant(gm, bias_node)
        groups = _argument(conv, 6, "groups", 1) if is_transposed else 1
        if weight is None or (bias_node is not None and bias is None) or groups != 1:
            continue
        new_w, new_b = fold_weights(weight, bias, bn, is_transposed)
        _rewrite(gm, conv, node, new_w, new_b, folded)
        folded += 1
    if folded:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return folded


def fold_weights(weight, bias, bn: dict, transposed: bool):
    """(W', b') of the module docstring; ``bn`` holds tensors ``running_mean``,
    ``running_var``, ``weight`` and ``bias`` (None: 1 and 0) and the float ``eps``."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    mean = bn["running_mean"].double()
    gamma = torch.ones_like(mean) if bn["weight"] is None else bn["weight"].double()
    beta = torch.zeros_like(mean) if bn["bias"] is None else bn["bias"].double()
    scale = gamma / torch.sqrt(bn["running_var"].double() + bn["eps"])
    shape = [1] * weight.dim()
    shape[1 if transposed else 0] = -1
    new_w = (weight.double() * scale.reshape(shape)).to(weight.dtype)
    old_b = torch.zeros_like(mean) if bias is None else bias.double()
    new_b = ((old_b - mean) * scale + beta).to(weight.dtype)
    return new_w.contiguous(), new_b.contiguous()


def _bn_arguments(gm, node) -> Optional[dict]:
    """The batch norm's arguments as constants, or None when it cannot fold."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    try:
        bound = inspect.signature(torch.nn.functional.batch_norm).bind(*node.args,
                                                                        **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    args = bound.arguments
    if args["training"] is not False or not isinstance(args["eps"], (int, float)):
        return None
    out = {"input": args["input"], "eps": float(args["eps"])}
    for name in ("running_mean", "running_var", "weight", "bias"):
        value = args[name]
        if value is None and name in ("weight", "bias"):
            out[name] = None
            continue
        out[name] = _constant(gm, value)
        if out[name] is None:
            return None
    if not isinstance(out["input"], torch.fx.Node):
        return None
    return out


def _argument(node, position: int, name: str, default: Any = None):
    if len(node.args) > position:
        return node.args[position]
    return node.kwargs.get(name, default)


def _constant(gm, value):
    """The floating-point tensor a ``get_attr`` node names, else None."""
    # lazy: torch is optional and takes seconds to import
    import torch  # pylint: disable=import-outside-toplevel

    if not isinstance(value, torch.fx.Node) or value.op != "get_attr":
        return None
    tensor = gm
    for atom in value.target.split("."):
        tensor = getattr(tensor, atom, None)
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        return None
    return tensor.detach()


def _rewrite(gm, conv, bn_node, new_w, new_b, index: int) -> None:
    """``conv`` with the folded weight and bias; the batch norm's users read it instead."""
    names = []
    for kind, tensor in (("weight", new_w), ("bias", new_b)):
        name = f"{FOLDED_PREFIX}{index}_{kind}"
        gm.register_buffer(name, tensor)
        names.append(name)
    with gm.graph.inserting_before(conv):
        w_node = gm.graph.get_attr(names[0])
        b_node = gm.graph.get_attr(names[1])
    args = list(conv.args)
    kwargs = dict(conv.kwargs)
    if len(args) > 1:
        args[1] = w_node
    else:
        kwargs["weight"] = w_node
    if len(args) > 2:
        args[2] = b_node
    else:
        kwargs["bias"] = b_node
    conv.args = tuple(args)
    conv.kwargs = kwargs
    bn_node.replace_all_uses_with(conv)
    gm.graph.erase_node(bn_node)
