"""What kind of work a Relax VM call is, from the name the VM calls it by.

The VM's instrument sees every ``call`` instruction with the name of its function: a VM builtin
(``vm.builtin.alloc_storage``), a native library kernel (``tvm_ollie.cpu.conv2d``, called
through ``call_dps_packed``) or a TVM kernel (a PrimFunc named after the operators it holds,
``fused_conv2d_add_relu``). The compiled executable keeps no operator pattern, so the kind is
read from the name, in the vocabulary of TVM's ``OpPattern`` (out-elementwise-fusable
conv/matmul, reduction, elementwise/broadcast, injective data movement).

The rules are data: each :class:`KindRule` has a name (the kind), a guard (a predicate on the
called name) and what it yields; the first rule whose guard holds decides, so the table reads
top to bottom as "a kernel is a conv/matmul if it holds one, else a reduction if it holds
one...". A name no rule knows is ``other``, never dropped.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Tuple

#: Kinds, in the order the profile's tables list them.
LIBRARY_CONV = "library conv"
LIBRARY_MATMUL = "library matmul"
LIBRARY_OTHER = "library other"
TVM_CONV_MATMUL = "TVM conv/matmul (+epilogue)"
TVM_REDUCE = "TVM reduction/pool/norm"
TVM_ELEMWISE = "TVM elementwise/broadcast"
TVM_EOP = "TVM eOperator (derived)"
TVM_LAYOUT = "layout/reshape"
VM_ALLOC = "VM alloc/free"
VM_CHECK = "VM shape/type checks"
VM_OTHER = "VM builtin (other)"
OTHER = "other"

KIND_ORDER = (LIBRARY_CONV, LIBRARY_MATMUL, LIBRARY_OTHER, TVM_CONV_MATMUL, TVM_REDUCE,
              TVM_ELEMWISE, TVM_EOP, TVM_LAYOUT, VM_ALLOC, VM_CHECK, VM_OTHER, OTHER)

#: Kinds that are kernels (compute on tensors) rather than the VM's own bookkeeping.
KERNEL_KINDS = frozenset(KIND_ORDER[:8]) | {OTHER}


def _word(*words: str) -> "re.Pattern[str]":
    """A pattern matching any of ``words`` as a whole ``_``-separated part of a kernel name
    (TVM numbers duplicates, ``reshape1``, so trailing digits still match)."""
    return re.compile(r"(?:^|_)(?:" + "|".join(words) + r")\d*(?=_|$)")


_CONV_MATMUL = _word(r"conv\dd", r"conv\dd_transpose", "matmul", "dense", "batch_matmul",
                     "einsum", "g2bmm", "gbmm")  # fmt: skip
_REDUCE = _word("sum", "mean", "max", "min", "prod", "variance", "std", "argmax", "argmin",
                "softmax", "log_softmax", r"(?:max|avg|adaptive_avg|adaptive_max)_pool\dd",
                r"pool\dd", "layer_norm", "group_norm", "batch_norm", "rms_norm", "instance_norm",
                "cumsum", "topk")  # fmt: skip
_LAYOUT = _word("reshape", "transpose", "permute_dims", "layout_transform", "concatenate",
                "concat", "split", "strided_slice", "dynamic_strided_slice", "take", "squeeze",
                "expand_dims", "flatten", "broadcast_to", "repeat", "tile", "pad", "copy",
                "resize2d", "image_resize2d", "collapse_sum_to", "collapse_sum_like", "gather",
                "scatter_elements", "index_tensor", "flip", "one_hot", "T_reshape",
                "T_transpose", "fused", r"ollie_region", "region", "cast")  # fmt: skip
_EOP = _word("eop", r"ollie_eop")


def _tvm_words(name: str) -> Tuple[str, ...]:
    """The ``_``-separated parts of a kernel name, digits and the ``fused`` prefix dropped."""
    parts = [re.sub(r"\d+$", "", p) for p in name.split("_")]
    return tuple(p for p in parts if p and p != "fused")


def _only_layout(name: str) -> bool:
    """Whether every part of ``name`` is a data-movement operator (no arithmetic)."""
    rest = _LAYOUT.sub("_", name)
    return not any(w for w in _tvm_words(rest) if not w.isdigit())


@dataclasses.dataclass(frozen=True)
class KindRule:
    """``kind`` when ``guard(name)`` holds."""

    kind: str
    guard: Callable[[str], bool]
    why: str


#: The classification, first match wins.
RULES: Tuple[KindRule, ...] = (
    KindRule(VM_ALLOC, lambda n: n in ("vm.builtin.alloc_storage", "vm.builtin.alloc_tensor",
                                       "vm.builtin.null_value", "vm.builtin.kill_object",
                                       "vm.builtin.memory_stats", "tvm_ollie.vm.cached_alloc"),
             "memory planning at run time: storage and tensor views, releases, the cached "
             "planned memory (codegen/cached_alloc.py)"),
    KindRule(VM_CHECK, lambda n: n in ("vm.builtin.check_tensor_info", "vm.builtin.match_shape",
                                       "vm.builtin.make_shape", "vm.builtin.check_shape_info",
                                       "vm.builtin.check_tuple_info", "vm.builtin.shape_of",
                                       "vm.builtin.check_prim_value_info",
                                       "vm.builtin.match_prim_value"),
             "argument checks and shape bookkeeping of main"),
    KindRule(VM_OTHER, lambda n: n.startswith("vm.builtin.") or n.startswith("vm."),
             "another VM builtin (tuples, copies, closures)"),
    KindRule(LIBRARY_CONV, lambda n: bool(re.match(r"tvm_ollie\.\w+\.conv", n)),
             "native library convolution (oneDNN/cuDNN), through call_dps_packed"),
    KindRule(LIBRARY_MATMUL, lambda n: bool(re.match(r"tvm_ollie\.\w+\.(?:\w*matmul|g2bmm|gbmm)",
                                                     n)),
             "native library matmul (OpenBLAS/oneDNN/cuBLAS), through call_dps_packed"),
    KindRule(LIBRARY_OTHER, lambda n: n.startswith("tvm_ollie."),
             "another native library function"),
    KindRule(TVM_CONV_MATMUL, lambda n: bool(_CONV_MATMUL.search(n)),
             "TVM kernel holding a conv or matmul (out-elementwise-fusable), with its epilogue"),
    KindRule(TVM_REDUCE, lambda n: bool(_REDUCE.search(n)),
             "TVM kernel holding a reduction (pooling, softmax, norms, sums)"),
    KindRule(TVM_EOP, lambda n: bool(_EOP.search(n)),
             "a derived program's eOperator (memory-bound index arithmetic)"),
    KindRule(TVM_LAYOUT, _only_layout,
             "TVM kernel that only moves data (reshape, transpose, layout_transform, concat)"),
    KindRule(TVM_ELEMWISE, lambda n: bool(re.match(r"[A-Za-z_]\w*$", n)),
             "TVM kernel of elementwise/broadcast arithmetic (add, multiply, activations)"),
)


#: The stage kinds of a derived program's kernels, named ``ollie_<operator>_<stage>_<k>`` by the
#: emitter (``ollie_conv2d_eop_3`` is an eOperator of a derived conv, not a conv).
_OLLIE_STAGE = re.compile(r"ollie_\w+?_(?=(?:eop|matmul|batch_matmul|conv\dd|conv\dd_transpose|"
                          r"g2bmm|gbmm)_\d)")


def kind_of(name: str) -> str:
    """The kind (one of :data:`KIND_ORDER`) of a call to the function named ``name``."""
    name = _OLLIE_STAGE.sub("ollie_", name)
    for rule in RULES:
        if rule.guard(name):
            return rule.kind
    return OTHER


def is_kernel(kind: str) -> bool:
    """Whether calls of ``kind`` compute on tensors (not VM bookkeeping)."""
    return kind in KERNEL_KINDS
