"""64-bit fingerprints of expressions, to recognize derivation states already visited.

Two expressions that differ only in how they are written get the same fingerprint:

* iterator names: a loop iterator is identified by its position and range; a reduction
  iterator by its range and by how the body uses it (below), never by name or list order;
* the order of the reduction iterators;
* operand order of commutative operators (``+ * == != and or max min``), and ``a > b`` versus
  ``b < a``;
* the spelling of index expressions: each is hashed through its affine normal form
  (:func:`.affine.to_affine`), so ``h + r - 1``, ``r - 1 + h`` and ``4*(x//4) + x%4 + r - 1``
  with ``x = h`` agree, and floor division AND floor modulo atoms are part of the hash.

Reduction iterators with equal ranges are told apart by a Weisfeiler-Lehman style refinement:
each round relabels an iterator by the multiset of its occurrence contexts (the position of the
index slot in the body: operator path, tensor or nested-scope fingerprint and dimension; the
div/mod atoms and coefficient around the iterator; and the hash of the whole index under the
current labels, which carries the labels of the iterators it is combined with). Rounds repeat
while they split classes. ``Σ A[r,s]*K[r,s]`` and ``Σ A[r,s]*K[s,r]`` therefore differ even when
``r`` and ``s`` have the same range.

Everything else is part of the hash: tensor name, shape, dtype, padding and pad value; scope
ranges, padding and reducer; constants (floats by their bits); nested scopes (by their own
fingerprint, so a nested stage is identified up to its own renaming).

What it does not catch (equal expressions that may get different fingerprints): associativity
(``(a+b)+c`` vs ``a+(b+c)`` in value bodies), distributivity, algebra beyond the affine normal
form (``(3*i)//2`` vs ``i + i//2``), range-dependent identities (call
:func:`.simplify.simplify` first: ``h // 8`` with ``h < 8`` is ``0`` only there), and loops that
could be permuted together with the output layout. What could make different expressions look
equal: 64-bit hash collisions (about 2^-64 per pair with a well-mixed hash: Python's tuple hash
over integers, strings mapped through BLAKE2b), and reduction iterators that the refinement
cannot separate, which happens only for highly regular structures (as for graph isomorphism with
1-WL) where the iterators are usually interchangeable anyway. Free iterators of a bare
expression (outside any scope) are identified by name. Fingerprints are deterministic across
processes (no use of Python's salted string hash).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Dict, List, Optional, Tuple

from .affine import Affine, to_affine
from .nodes import Access, BinOp, Call, Const, IterVar, Node, Scope, Tensor, Var, is_index, live_nodes

_MASK64 = (1 << 64) - 1
_CACHE_FP = "fingerprint"
_CODES: Dict[str, int] = {}


def _code(text: str) -> int:
    """A process-independent 62-bit code of a string."""
    code = _CODES.get(text)
    if code is None:
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
        code = int.from_bytes(digest, "little") >> 2
        _CODES[text] = code
    return code


_MINUS_ONE = _code("int:-1")


def _int(value: int) -> int:
    # hash(-1) == hash(-2) in CPython: keep -1 apart from -2 in hashed tuples.
    return _MINUS_ONE if value == -1 else value


_T_SCOPE = _code("scope")
_T_LOOP = _code("loop")
_T_REDUCE = _code("reduce")
_T_TENSOR = _code("tensor")
_T_ACCESS = _code("access")
_T_CONST = _code("const")
_T_AFFINE = _code("affine")
_T_FREE = _code("free-var")
_T_ROOT = _code("root")
_T_ITER = _code("itervar")
_T_CONTEXT = _code("context")
_T_REFINE = _code("refine")
_OPS = {op: _code("op:" + op) for op in ("+", "-", "*", "//", "%", "/", "<", "<=", "==", "!=",
                                         "and", "or")}
_COMMUTATIVE = frozenset(("+", "*", "==", "!=", "and", "or"))
_FLIPPED = {">": "<", ">=": "<="}
_COMMUTATIVE_FUNCS = frozenset(("max", "min"))


def fingerprint(node: Node) -> int:
    """A 64-bit unsigned fingerprint of ``node`` (see the module docstring for invariances)."""
    return _fp(node) & _MASK64


def clear_cache() -> None:
    """Forget every cached fingerprint (for benchmarks of cold behaviour)."""
    for node in live_nodes():
        cache = node._cache
        for key in (_CACHE_FP, _CACHE_INDEX, _CACHE_ACCESS):
            cache.pop(key, None)


_CACHE_INDEX = "fingerprint.index"
_CACHE_ACCESS = "fingerprint.access"

#: Iterator labels are keyed by iterator name (names are unique within a scope); Python-level
#: ``Node.__hash__`` would make every lookup a function call.
Labels = Dict[str, int]


def _fp(node: Node) -> int:
    cache = node._cache
    out = cache.get(_CACHE_FP)
    if out is None:
        kind = type(node)
        if kind is Scope:
            out = _scope_hash(node)
        elif kind is Tensor:
            out = _tensor_hash(node)
        elif kind is IterVar:
            out = hash((_T_ITER, _code(node.var.name), _int(node.begin), _int(node.end)))
        else:
            out = _expr_hash(node, {})
        cache[_CACHE_FP] = out
    return out


def _tensor_hash(t: Tensor) -> int:
    return hash((_T_TENSOR, _code(t.name), t.shape, _code(t.dtype), t.pad,
                 _float_bits(t.pad_value)))


def _float_bits(value: float) -> int:
    return _int(struct.unpack("<q", struct.pack("<d", value))[0])


def _is_index(node: Node) -> bool:
    # nodes.is_index builds a closure on every call; read its cached answer first.
    hit = node._cache.get("is_index")
    return is_index(node) if hit is None else hit


def _label(name: str, labels: Labels) -> int:
    label = labels.get(name)
    if label is None:  # a free iterator of a bare expression: identified by name
        label = hash((_T_FREE, _code(name)))
    return label


# -- index expressions -------------------------------------------------------------------------
#
# Every index node caches a label-independent "template" of its affine normal form:
# ``(const, ((name | None, sub, coeff), ...))`` where ``sub`` is ``(op, k, template)`` for a
# div/mod atom, and the list of its iterator occurrences ``(name, path, coeff)`` (``path``: the
# div/mod atoms around the occurrence). Hashing under labels then only walks small tuples.

Occurrence = Tuple[str, int, int]


def _index_info(node: Node) -> Tuple[Optional[tuple], Tuple[Occurrence, ...]]:
    info = node._cache.get(_CACHE_INDEX)
    if info is None:
        aff = to_affine(node)
        occurrences: List[Occurrence] = []
        if aff is not None:
            _affine_occurrences(aff, _T_ROOT, occurrences)
            info = (_template(aff), tuple(occurrences))
        else:
            _tree_occurrences(node, _T_ROOT, occurrences)
            info = (None, tuple(occurrences))
        node._cache[_CACHE_INDEX] = info
    return info


def _template(aff: Affine) -> tuple:
    terms = []
    for atom, c in aff.terms:
        if type(atom) is Var:
            terms.append((atom._args[0], None, _int(c)))
        else:
            sub = (_OPS[atom.op], _int(atom.b.value), _template(to_affine(atom.a)))
            terms.append((None, sub, _int(c)))
    return _int(aff.const), tuple(terms)


def _template_hash(template: tuple, labels: Labels) -> int:
    const, terms = template
    hashed = []
    for name, sub, c in terms:
        if name is not None:
            h = labels.get(name)
            if h is None:
                h = _label(name, labels)
        else:
            h = hash((sub[0], sub[1], _template_hash(sub[2], labels)))
        hashed.append((h, c))
    hashed.sort()
    return hash((_T_AFFINE, const, tuple(hashed)))


def _index_hash(node: Node, labels: Labels) -> int:
    template = _index_info(node)[0]
    if template is not None:
        return _template_hash(template, labels)
    # Not affine (a product of iterators, a division by an iterator): hash the tree.
    x = _index_hash(node.a, labels)
    y = _index_hash(node.b, labels)
    if node.op in _COMMUTATIVE and x > y:
        x, y = y, x
    return hash((_OPS[node.op], x, y))


def _affine_occurrences(aff: Affine, path: int, out: List[Occurrence]) -> None:
    for atom, c in aff.terms:
        if type(atom) is Var:
            out.append((atom._args[0], path, _int(c)))
        else:
            inner_path = hash((path, _OPS[atom.op], _int(atom.b.value), _int(c)))
            _affine_occurrences(to_affine(atom.a), inner_path, out)


def _tree_occurrences(node: Node, path: int, out: List[Occurrence]) -> None:
    aff = to_affine(node)
    if aff is not None:
        _affine_occurrences(aff, path, out)
        return
    op = node.op
    if op in _COMMUTATIVE:
        child = hash((path, _OPS[op]))
        _tree_occurrences(node.a, child, out)
        _tree_occurrences(node.b, child, out)
    else:
        _tree_occurrences(node.a, hash((path, _OPS[op], 0)), out)
        _tree_occurrences(node.b, hash((path, _OPS[op], 1)), out)


# -- bodies ------------------------------------------------------------------------------------


def _access_info(node: Access) -> tuple:
    """Per access (cached): source fingerprint and, per dimension, ``(dim_code, index,
    template, occurrences)`` (template and occurrences None when the index reads tensors)."""
    info = node._cache.get(_CACHE_ACCESS)
    if info is None:
        source = _fp(node.source)
        dims = []
        for dim, index in enumerate(node.indices):
            code = hash((_T_ACCESS, source, dim))
            if _is_index(index):
                template, occurrences = _index_info(index)
                dims.append((code, index, template, occurrences))
            else:
                dims.append((code, index, None, None))
        info = (source, tuple(dims))
        node._cache[_CACHE_ACCESS] = info
    return info


def _expr_hash(node: Node, labels: Labels) -> int:
    kind = type(node)
    if kind is Access:
        source, dims = _access_info(node)
        parts = []
        for _, index, template, occurrences in dims:
            if template is not None:
                parts.append(_template_hash(template, labels))
            elif occurrences is not None:
                parts.append(_index_hash(index, labels))
            else:
                parts.append(_expr_hash(index, labels))
        return hash((_T_ACCESS, source, tuple(parts)))
    if _is_index(node):
        return _index_hash(node, labels)
    if kind is BinOp:
        op, a, b = node._args
        if op in _FLIPPED:
            op, a, b = _FLIPPED[op], b, a
        x = _expr_hash(a, labels)
        y = _expr_hash(b, labels)
        if op in _COMMUTATIVE and x > y:
            x, y = y, x
        return hash((_OPS[op], x, y))
    if kind is Call:
        args = [_expr_hash(a, labels) for a in node.args]
        if node.func in _COMMUTATIVE_FUNCS:
            args.sort()
        return hash((_code("call:" + node.func), tuple(args)))
    if kind is Const:
        return hash((_T_CONST, _code(node.dtype), _float_bits(node.value)))
    return _fp(node)  # Scope or Tensor used as a value


# -- scopes ------------------------------------------------------------------------------------


def _scope_hash(scope: Scope) -> int:
    loops, reduce, body, pad, reducer = scope._args
    labels: Labels = {}
    loop_labels = []
    for pos, iv in enumerate(loops):
        var, begin, end = iv._args
        label = hash((_T_LOOP, pos, _int(begin), _int(end)))
        labels[var._args[0]] = label
        loop_labels.append(label)
    reduce_names = []
    for iv in reduce:
        var, begin, end = iv._args
        labels[var._args[0]] = hash((_T_REDUCE, _int(begin), _int(end)))
        reduce_names.append(var._args[0])
    if len(reduce_names) > 1 and len({labels[v] for v in reduce_names}) < len(reduce_names):
        _refine(body, reduce_names, labels)
    body_hash = _expr_hash(body, labels)
    reduce_labels = tuple(sorted([labels[v] for v in reduce_names]))
    return hash((_T_SCOPE, _code(reducer), tuple(loop_labels), pad, reduce_labels, body_hash))


Slot = Tuple[int, Node, Optional[tuple], Tuple[Occurrence, ...]]


def _refine(body: Node, reduce_names: List[str], labels: Labels) -> None:
    """Relabel reduction iterators by their occurrence contexts until the classes are stable.

    The first round uses only where each iterator occurs (slot position, atoms around it,
    coefficient); later rounds add the hash of the whole index under the current labels, which
    brings in the labels of the iterators it is combined with.
    """
    slots: List[Slot] = []
    _collect_slots(body, _T_ROOT, slots)
    classes = len({labels[v] for v in reduce_names})
    for round_ in range(len(reduce_names)):
        contexts: Dict[str, List[int]] = {v: [] for v in reduce_names}
        for sig, node, template, occurrences in slots:
            if round_ == 0:
                slot_hash = 0
            elif template is not None:
                slot_hash = _template_hash(template, labels)
            else:
                slot_hash = _index_hash(node, labels)
            for name, path, coeff in occurrences:
                ctx = contexts.get(name)
                if ctx is not None:
                    ctx.append(hash((_T_CONTEXT, sig, path, coeff, slot_hash)))
        for name in reduce_names:
            contexts[name].sort()
            labels[name] = hash((_T_REFINE, labels[name], tuple(contexts[name])))
        refined = len({labels[v] for v in reduce_names})
        if refined == len(reduce_names) or (round_ > 0 and refined == classes):
            return
        classes = refined


def _collect_slots(node: Node, sig: int, out: List[Slot]) -> None:
    """Index slots of a body (maximal index expressions) with a position signature each."""
    kind = type(node)
    if kind is Access:
        for code, index, template, occurrences in _access_info(node)[1]:
            child = hash((code, sig))
            if occurrences is not None:
                out.append((child, index, template, occurrences))
            else:
                _collect_slots(index, child, out)
    elif _is_index(node):
        template, occurrences = _index_info(node)
        out.append((sig, node, template, occurrences))
    elif kind is BinOp:
        op, a, b = node._args
        if op in _FLIPPED:
            op, a, b = _FLIPPED[op], b, a
        if op in _COMMUTATIVE:
            child = hash((_OPS[op], sig))
            _collect_slots(a, child, out)
            _collect_slots(b, child, out)
        else:
            _collect_slots(a, hash((_OPS[op], 0, sig)), out)
            _collect_slots(b, hash((_OPS[op], 1, sig)), out)
    elif kind is Call:
        func = _code("call:" + node.func)
        for pos, arg in enumerate(node.args):
            where = 0 if node.func in _COMMUTATIVE_FUNCS else pos
            _collect_slots(arg, hash((func, where, sig)), out)
