"""The tensor-algebra expression IR: nodes, text, simplification, fingerprints, interpreter."""

from .nodes import (  # noqa: F401
    Access,
    BinOp,
    Call,
    Const,
    IterVar,
    Node,
    Scope,
    Tensor,
    Var,
    as_node,
    free_vars,
    fresh_var,
    input_tensors,
    is_index,
    iter_nodes,
    substitute,
)
from .printer import to_text  # noqa: F401
