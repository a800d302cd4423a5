"""Immutable, hash-consed nodes of the tensor-algebra expression IR.

An operator body is a :class:`Scope`: traversal iterators ``L`` (one per output dimension), optional
reduction iterators (``Σ`` for sum, ``Max`` for max), one scalar body and per-output zero padding.
Bodies are built from iterator variables, constants, arithmetic, scalar function calls (casts
included: ``float32(x)``, see :data:`CAST_DTYPES`) and subscripts (:class:`Access`) of input
tensors or of nested scopes. A stage's element type is that of its body (:func:`value_dtype`).

Every node is interned: constructing a node equal to one that already exists returns that very
object, so structural equality is ``is`` and equal subtrees are shared. Nodes are never mutated;
rewrites build new nodes.

Semantics that every pass relies on (the reference interpreter in ``interp.py`` is their oracle):

* A :class:`Tensor` with padding ``(lo, hi)`` on a dimension of size ``n`` may be read at indices
  ``[-lo, n + hi)``; reads outside ``[0, n)`` give ``pad_value`` (0 unless stated). Reads beyond
  the padded range are errors.
* A :class:`Scope` denotes a tensor of shape ``end - begin + lo + hi`` per loop iterator. Its
  element at loop value ``v`` (``begin <= v < end``) is the reduction of the body over the
  reduction iterators; the padded margins ``[begin - lo, begin)`` and ``[end, end + hi)`` read 0.
  An :class:`Access` of a scope indexes it in loop-value coordinates (index ``v`` reads loop value
  ``v``), so a scope with ``begin = 0`` and no padding is read exactly like a tensor.
* Scopes are closed: their body uses only their own iterators. A nested scope is a separate stage.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable, Iterable, Iterator, Sequence, Tuple, Union

import numpy as np

Pad = Tuple[Tuple[int, int], ...]

ARITH_OPS = ("+", "-", "*", "//", "%", "/")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=", "and", "or")
BINARY_OPS = ARITH_OPS + COMPARE_OPS
REDUCERS = ("sum", "max")
SCALAR_FUNCS = {
    # name: arity
    "relu": 1, "tanh": 1, "sigmoid": 1, "exp": 1, "log": 1, "erf": 1, "sqrt": 1, "rsqrt": 1,
    "abs": 1, "neg": 1, "max": 2, "min": 2, "pow": 2, "select": 3,
}
#: Element types a value can be cast to. A cast is the one-argument scalar function named by its
#: target type (``float16(x)``), so every pass that treats calls generically handles it. Float
#: targets round to the nearest value of the type; integer targets truncate towards zero (TIR's
#: ``Cast``). A cast of a constant is folded into a constant of that type when it is built, which
#: is also how a typed constant prints (``float16(0.5)``).
CAST_DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")
SCALAR_FUNCS.update({dtype: 1 for dtype in CAST_DTYPES})
#: Default types of literals: constants of other types print as a cast of a literal.
DEFAULT_DTYPES = ("int32", "float32")


#: The interning table: (class, fields) -> weak reference to the one node with those fields. A
#: plain dict of KeyedRefs (what WeakValueDictionary does, minus its Python-level overhead on
#: this hot path); an entry goes away with its node.
_TABLE: dict = {}
_set = object.__setattr__


def _forget(ref: "weakref.KeyedRef") -> None:
    if _TABLE.get(ref.key) is ref:
        del _TABLE[ref.key]


#: How a node prints: :mod:`tvm_ollie.ir.printer`, a floor above this module, installs its
#: ``to_text`` here (:func:`install_printer`) when the package loads; until then the class name.
_PRINTER = [lambda node: f"<{type(node).__name__}>"]


def install_printer(to_text: Callable[["Node"], str]) -> None:
    """Make ``str(node)`` the text ``to_text(node)`` (called once by the printer module)."""
    _PRINTER[0] = to_text


#: A node's cache entry meaning "this node itself" (an idempotent transformation's answer): a
#: node holding itself in its cache would be a reference cycle, which refcounting never frees
#: and the cyclic collector must find (a search drops thousands of such nodes a second).
SELF = type("SelfType", (), {"__repr__": lambda self: "SELF", "__slots__": ()})()


def live_nodes() -> list:
    """Every node alive now (for caches that must be cleared, e.g. in cold benchmarks)."""
    return [node for node in (ref() for ref in list(_TABLE.values())) if node is not None]


class Node:
    """Base of all IR nodes: interned, immutable, hashed by identity.

    Subclasses store their fields in ``_args`` (a tuple of hashable values and child nodes).
    """

    __slots__ = ("_args", "_cache", "__weakref__")

    @classmethod
    def _make(cls, args: tuple) -> "Node":
        key = (cls, args)
        ref = _TABLE.get(key)
        if ref is not None:
            node = ref()
            if node is not None:
                return node
        node = object.__new__(cls)
        _set(node, "_args", args)
        _set(node, "_cache", {})
        _TABLE[key] = weakref.KeyedRef(node, _forget, key)
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} nodes are immutable")

    #: Nodes are interned, so equality is identity and the identity hash (a C slot: no Python
    #: call per dict lookup, the hot path of every search) is consistent with it.
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __reduce__(self):
        return (_rebuild, (type(self), self._args))

    def __copy__(self) -> "Node":
        return self

    def __deepcopy__(self, memo: dict) -> "Node":
        return self

    @property
    def children(self) -> Tuple["Node", ...]:
        """Direct child nodes, in field order (computed once per node: a hot path of searches)."""
        kids = self._cache.get("children")
        if kids is None:
            kids = self._cache["children"] = self._children()
        return kids

    def _children(self) -> Tuple["Node", ...]:
        return tuple(_iter_nodes(self._args))

    def __str__(self) -> str:
        return _PRINTER[0](self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self})"

    # Operator overloads build index and body arithmetic (== stays structural identity).
    def __add__(self, other: "ExprLike") -> "Node":
        return BinOp("+", self, as_node(other))

    def __radd__(self, other: "ExprLike") -> "Node":
        return BinOp("+", as_node(other), self)

    def __sub__(self, other: "ExprLike") -> "Node":
        return BinOp("-", self, as_node(other))

    def __rsub__(self, other: "ExprLike") -> "Node":
        return BinOp("-", as_node(other), self)

    def __mul__(self, other: "ExprLike") -> "Node":
        return BinOp("*", self, as_node(other))

    def __rmul__(self, other: "ExprLike") -> "Node":
        return BinOp("*", as_node(other), self)

    def __floordiv__(self, other: "ExprLike") -> "Node":
        return BinOp("//", self, as_node(other))

    def __mod__(self, other: "ExprLike") -> "Node":
        return BinOp("%", self, as_node(other))

    def __truediv__(self, other: "ExprLike") -> "Node":
        return BinOp("/", self, as_node(other))

    def __neg__(self) -> "Node":
        return BinOp("*", Const(-1), self) if is_index(self) else Call("neg", (self,))


def _rebuild(cls: type, args: tuple) -> Node:
    return cls._make(args)


def _iter_nodes(value: Any) -> Iterator[Node]:
    if isinstance(value, Node):
        yield value
    elif isinstance(value, tuple):
        for item in value:
            yield from _iter_nodes(item)


class Var(Node):
    """An iterator variable; its identity is its name, its range lives in the binding scope."""

    __slots__ = ()

    def _children(self) -> Tuple[Node, ...]:
        return ()

    def __new__(cls, name: str) -> "Var":
        if not isinstance(name, str) or not name:
            raise TypeError("Var name must be a non-empty string")
        return cls._make((name,))

    @property
    def name(self) -> str:
        return self._args[0]


class Const(Node):
    """A scalar constant. Integers index; floats appear in bodies (``inf`` allowed)."""

    __slots__ = ()

    def __new__(cls, value: Union[int, float], dtype: str = None) -> "Const":
        if isinstance(value, bool):
            value = int(value)
        if dtype is None:
            dtype = "int32" if isinstance(value, int) else "float32"
        value = int(value) if dtype.startswith("int") else float(value)
        if dtype in ("float16", "bfloat16") and math.isfinite(value):
            value = _round_to(value, dtype)  # a literal holds a value of its type
        return cls._make((value, dtype))

    @property
    def value(self) -> Union[int, float]:
        return self._args[0]

    @property
    def dtype(self) -> str:
        return self._args[1]


class BinOp(Node):
    """``a op b``. ``//`` and ``%`` are floor division and floor modulo; ``/`` is true division."""

    __slots__ = ()

    def __new__(cls, op: str, a: "ExprLike", b: "ExprLike") -> "BinOp":
        if op not in BINARY_OPS:
            raise ValueError(f"unknown binary op {op!r}")
        return cls._make((op, as_node(a), as_node(b)))

    def _children(self) -> Tuple[Node, ...]:
        return self._args[1:]

    @property
    def op(self) -> str:
        return self._args[0]

    @property
    def a(self) -> Node:
        return self._args[1]

    @property
    def b(self) -> Node:
        return self._args[2]


class Call(Node):
    """A call of a scalar function from :data:`SCALAR_FUNCS` (``select(c, t, f)`` included)."""

    __slots__ = ()

    def __new__(cls, func: str, args: Sequence["ExprLike"]) -> "Call":
        arity = SCALAR_FUNCS.get(func)
        if arity is None:
            raise ValueError(f"unknown scalar function {func!r}")
        args = tuple(as_node(a) for a in args)
        if len(args) != arity:
            raise ValueError(f"{func} takes {arity} arguments, got {len(args)}")
        if func in CAST_DTYPES and isinstance(args[0], Const):
            return cast_const(args[0], func)
        return cls._make((func, args))

    @property
    def func(self) -> str:
        return self._args[0]

    @property
    def args(self) -> Tuple[Node, ...]:
        return self._args[1]


class Tensor(Node):
    """An input tensor (graph input or weight): name, shape, dtype, per-dimension padding."""

    __slots__ = ()

    def __new__(
        cls,
        name: str,
        shape: Sequence[int],
        dtype: str = "float32",
        pad: Union[None, Sequence[Union[int, Tuple[int, int]]]] = None,
        pad_value: float = 0.0,
    ) -> "Tensor":
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise ValueError(f"tensor {name} has a non-positive extent: {shape}")
        return cls._make((name, shape, dtype, normalize_pad(pad, len(shape)), float(pad_value)))

    @property
    def name(self) -> str:
        return self._args[0]

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._args[1]

    @property
    def dtype(self) -> str:
        return self._args[2]

    @property
    def pad(self) -> Pad:
        return self._args[3]

    @property
    def pad_value(self) -> float:
        return self._args[4]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def with_pad(self, pad: Union[None, Sequence[Union[int, Tuple[int, int]]]]) -> "Tensor":
        """The same tensor with another padding."""
        return Tensor(self.name, self.shape, self.dtype, pad, self.pad_value)

    def __getitem__(self, indices: Union["ExprLike", Sequence["ExprLike"]]) -> "Access":
        return Access(self, indices if isinstance(indices, tuple) else (indices,))


class IterVar(Node):
    """An iterator with its half-open range ``[begin, end)``."""

    __slots__ = ()

    def __new__(cls, var: Union[Var, str], begin: int, end: int) -> "IterVar":
        var = Var(var) if isinstance(var, str) else var
        begin, end = int(begin), int(end)
        if end <= begin:
            raise ValueError(f"empty range for {var.name}: [{begin}, {end})")
        return cls._make((var, begin, end))

    @property
    def var(self) -> Var:
        return self._args[0]

    @property
    def begin(self) -> int:
        return self._args[1]

    @property
    def end(self) -> int:
        return self._args[2]

    @property
    def extent(self) -> int:
        return self.end - self.begin


class Scope(Node):
    """``L<loops> Σ<reduce> pad[...] { body }``: one stage of a tensor program."""

    __slots__ = ()

    def __new__(
        cls,
        loops: Sequence[IterVar],
        reduce: Sequence[IterVar],
        body: "ExprLike",
        pad: Union[None, Sequence[Union[int, Tuple[int, int]]]] = None,
        reducer: str = "sum",
    ) -> "Scope":
        loops, reduce = tuple(loops), tuple(reduce)
        if reducer not in REDUCERS:
            raise ValueError(f"unknown reducer {reducer!r}")
        if not reduce:
            reducer = "sum"
        body = as_node(body)
        names = [iv.var.name for iv in loops + reduce]
        if len(set(names)) != len(names):
            raise ValueError(f"scope iterators are not distinct: {names}")
        free = free_vars(body) - {iv.var for iv in loops + reduce}
        if free:
            raise ValueError(f"scope is not closed: free iterators {sorted(v.name for v in free)}")
        return cls._make((loops, reduce, body, normalize_pad(pad, len(loops)), reducer))

    @property
    def loops(self) -> Tuple[IterVar, ...]:
        return self._args[0]

    @property
    def reduce(self) -> Tuple[IterVar, ...]:
        return self._args[1]

    @property
    def body(self) -> Node:
        return self._args[2]

    @property
    def pad(self) -> Pad:
        return self._args[3]

    @property
    def reducer(self) -> str:
        return self._args[4]

    @property
    def shape(self) -> Tuple[int, ...]:
        """Shape of the materialized stage, padding included."""
        return tuple(iv.extent + lo + hi for iv, (lo, hi) in zip(self.loops, self.pad))

    @property
    def ndim(self) -> int:
        return len(self.loops)

    @property
    def inputs(self) -> Tuple[Tensor, ...]:
        """The input tensors read anywhere below this scope, in order of first appearance."""
        return input_tensors(self)

    @property
    def dtype(self) -> str:
        """Element type of the stage: the float type of its body (casts decide it), else that of
        its first input tensor, float32 without any."""

        def compute() -> str:
            dtype, weak = _dtype_info(self.body)
            if is_float_dtype(dtype) and not weak:
                return dtype
            ins = self.inputs
            return ins[0].dtype if ins else "float32"

        return _cached(self, "dtype", compute)

    def iter_range(self, var: Var) -> IterVar:
        """The binding of ``var`` in this scope."""
        for iv in self.loops + self.reduce:
            if iv.var is var:
                return iv
        raise KeyError(var.name)

    def replace(self, **fields: Any) -> "Scope":
        """A copy with some of ``loops``, ``reduce``, ``body``, ``pad``, ``reducer`` replaced."""
        args = dict(loops=self.loops, reduce=self.reduce, body=self.body, pad=self.pad,
                    reducer=self.reducer)
        args.update(fields)
        return Scope(**args)

    def __getitem__(self, indices: Union["ExprLike", Sequence["ExprLike"]]) -> "Access":
        return Access(self, indices if isinstance(indices, tuple) else (indices,))


class Access(Node):
    """``source[indices]``: a subscript of a :class:`Tensor` or of a nested :class:`Scope`."""

    __slots__ = ()

    def __new__(cls, source: Union[Tensor, Scope], indices: Iterable["ExprLike"]) -> "Access":
        if not isinstance(source, (Tensor, Scope)):
            raise TypeError(f"cannot subscript {type(source).__name__}")
        indices = tuple(as_node(i) for i in indices)
        if len(indices) != source.ndim:
            raise ValueError(f"{len(indices)} indices for a {source.ndim}-d source")
        return cls._make((source, indices))

    def _children(self) -> Tuple[Node, ...]:
        return (self._args[0],) + self._args[1]

    @property
    def source(self) -> Union[Tensor, Scope]:
        return self._args[0]

    @property
    def indices(self) -> Tuple[Node, ...]:
        return self._args[1]


ExprLike = Union[Node, int, float]


def as_node(value: ExprLike) -> Node:
    """Wrap Python numbers as :class:`Const`; pass nodes through."""
    if isinstance(value, Node):
        return value
    if isinstance(value, (int, float)):
        return Const(value)
    raise TypeError(f"cannot use {type(value).__name__} as an expression")


def normalize_pad(
    pad: Union[None, Sequence[Union[int, Tuple[int, int]]]], ndim: int
) -> Pad:
    """Padding as ``((lo, hi), ...)``; an int ``p`` means ``(p, p)``."""
    if pad is None:
        return ((0, 0),) * ndim
    pad = tuple(pad)
    if len(pad) != ndim:
        raise ValueError(f"padding {pad} does not match rank {ndim}")
    out = []
    for p in pad:
        lo, hi = (p, p) if isinstance(p, int) else tuple(p)
        if lo < 0 or hi < 0:
            raise ValueError(f"negative padding {pad}")
        out.append((int(lo), int(hi)))
    return tuple(out)


def _cached(node: Node, key: str, compute):
    cache = node._cache
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def free_vars(node: Node) -> frozenset:
    """Iterator variables used by ``node`` and not bound inside it."""

    if type(node) is Var:
        return frozenset((node,))  # not cached: a node holding itself is a reference cycle
    cache = node._cache
    out = cache.get("free_vars")
    if out is not None:
        return out
    if isinstance(node, (Scope, Tensor, Const)):
        out = _NO_VARS  # scopes are closed by construction
    else:
        kids = node.indices if isinstance(node, Access) else node.children
        out = _NO_VARS
        for child in kids:
            fv = free_vars(child)
            if fv:
                out = out | fv if out else fv
    cache["free_vars"] = out
    return out


_NO_VARS: frozenset = frozenset()


def input_tensors(node: Node) -> Tuple[Tensor, ...]:
    """Input tensors below ``node``, each once, in order of first appearance (depth first)."""

    if type(node) is Tensor:
        return (node,)  # not cached: a node holding itself is a reference cycle

    def compute() -> Tuple[Tensor, ...]:
        seen: dict = {}
        for child in node.children:
            for t in input_tensors(child):
                seen.setdefault(t.name, t)
        return tuple(seen.values())

    return _cached(node, "inputs", compute)


def is_index(node: Node) -> bool:
    """True when ``node`` is integer index arithmetic (no tensor reads, no floats)."""
    cache = node._cache
    out = cache.get("is_index")
    if out is None:
        kind = type(node)
        if kind is Var:
            out = True
        elif kind is Const:
            out = node.dtype.startswith("int")
        elif kind is BinOp:
            out = node.op in _INDEX_OPS and is_index(node.a) and is_index(node.b)
        else:
            out = False
        cache["is_index"] = out
    return out


_INDEX_OPS = frozenset(("+", "-", "*", "//", "%"))


def iter_nodes(node: Node) -> Iterator[Node]:
    """Every node reachable from ``node`` (pre-order, shared subtrees visited once)."""
    seen = set()
    stack = [node]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        yield cur
        stack.extend(reversed(cur.children))


def substitute(node: Node, mapping: dict) -> Node:
    """Replace free variables (or any nodes) by expressions; does not enter nested scopes."""
    if not mapping:
        return node
    memo: dict = {}
    # when only iterators are replaced, a sub-tree using none of them is returned as it is
    # (free_vars is cached on the interned nodes): most of an index-heavy body is never walked
    only_vars = all(type(k) is Var for k in mapping)

    def go(cur: Node) -> Node:
        hit = mapping.get(cur)
        if hit is not None:
            return as_node(hit)
        if isinstance(cur, (Var, Const, Tensor, Scope, IterVar)):
            return cur
        if only_vars and mapping.keys().isdisjoint(free_vars(cur)):
            return cur
        done = memo.get(cur)
        if done is not None:
            return done
        if isinstance(cur, BinOp):
            out = BinOp(cur.op, go(cur.a), go(cur.b))
        elif isinstance(cur, Call):
            out = Call(cur.func, tuple(go(a) for a in cur.args))
        elif isinstance(cur, Access):
            out = Access(cur.source, tuple(go(i) for i in cur.indices))
        else:
            raise TypeError(f"cannot substitute in {type(cur).__name__}")
        memo[cur] = out
        return out

    out = go(node)
    del go  # the closure refers to itself: unbound, refcounting frees it (no cyclic garbage)
    return out


def fresh_var(taken: Iterable[str], prefix: str = "i") -> Var:
    """A variable named ``prefix<k>`` not among ``taken``."""
    taken = set(taken)
    k = 0
    while f"{prefix}{k}" in taken:
        k += 1
    return Var(f"{prefix}{k}")


def scope_var_names(node: Node) -> set:
    """Names of every iterator bound anywhere below ``node`` (to pick fresh names)."""
    names = set()
    for cur in iter_nodes(node):
        if isinstance(cur, Var):
            names.add(cur.name)
    return names


# --------------------------------------------------------------------------------------------
# Element types


def is_float_dtype(dtype: str) -> bool:
    """Floating element types (``bfloat16`` included)."""
    return dtype.startswith(("float", "bfloat"))


def is_cast(node: Node) -> bool:
    """Whether ``node`` is a cast (a :class:`Call` of a :data:`CAST_DTYPES` name)."""
    return isinstance(node, Call) and node.func in CAST_DTYPES


def dtype_bits(dtype: str) -> int:
    """Width of an element type in bits (``bool`` counts 1)."""
    if dtype == "bool":
        return 1
    digits = "".join(ch for ch in dtype if ch.isdigit())
    return int(digits) if digits else 32


def cast_const(const: Const, dtype: str) -> Const:
    """The constant ``dtype(const)``: rounded to a narrower float type, truncated to an int."""
    if dtype.startswith("int"):
        value = const.value if const.dtype.startswith("int") else int(math.trunc(const.value))
        return Const(int(value), dtype)
    value = float(const.value)
    if dtype == "float32" and math.isfinite(value):
        value = _round_to(value, dtype)
    return Const(value, dtype)


def _round_to(value: float, dtype: str) -> float:
    """``value`` rounded to the nearest value of the float type ``dtype``."""
    return float(np.asarray(value, dtype=np.float64).astype(numpy_dtype(dtype)))


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy type of an element type (``bfloat16`` from ``ml_dtypes``, a TVM dependency)."""
    if dtype == "bfloat16":
        # lazy: ml_dtypes is needed for bfloat16 only
        import ml_dtypes  # pylint: disable=import-outside-toplevel

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def value_dtype(node: Node) -> str:
    """The element type of a value expression.

    Tensors, scopes, accesses and casts carry theirs; arithmetic meets at the wider operand type
    (float over int over bool), where a literal adapts to the other operand (``x * 0.5`` keeps the
    type of ``x``); comparisons are ``bool``; ``/`` is float.
    """
    return _dtype_info(node)[0]


def has_weak_dtype(node: Node) -> bool:
    """Whether ``node``'s type is that of a literal or index arithmetic, which yields to the other
    operand's type in arithmetic."""
    return _dtype_info(node)[1]


def _dtype_info(node: Node) -> Tuple[str, bool]:
    """``(dtype, weak)``; weak types (of literals and index arithmetic) yield to the other
    operand's type in arithmetic."""
    cache = node._cache
    hit = cache.get("dtype_info")
    if hit is not None:
        return hit
    if isinstance(node, (Tensor, Scope)):
        out = (node.dtype, False)
    elif isinstance(node, Access):
        out = (node.source.dtype, False)
    elif isinstance(node, Const):
        out = (node.dtype, True)
    elif isinstance(node, Var):
        out = ("int32", True)
    elif isinstance(node, BinOp):
        if node.op in COMPARE_OPS:
            out = ("bool", True)
        else:
            out = _meet(_dtype_info(node.a), _dtype_info(node.b))
            if node.op == "/" and not is_float_dtype(out[0]):
                out = ("float32", out[1])
    elif isinstance(node, Call):
        if node.func in CAST_DTYPES:
            out = (node.func, False)
        else:
            args = node.args[1:] if node.func == "select" else node.args
            out = _dtype_info(args[0])
            for arg in args[1:]:
                out = _meet(out, _dtype_info(arg))
            if node.func not in ("relu", "abs", "neg", "max", "min", "select") \
                    and not is_float_dtype(out[0]):
                out = ("float32", out[1])
    else:
        out = ("float32", True)
    cache["dtype_info"] = out
    return out


def _meet(x: Tuple[str, bool], y: Tuple[str, bool]) -> Tuple[str, bool]:
    """The type two operands meet at (see :func:`value_dtype`)."""
    (dx, wx), (dy, wy) = x, y
    if dx == dy:
        return dx, wx and wy
    kx = 0 if dx == "bool" else (2 if is_float_dtype(dx) else 1)
    ky = 0 if dy == "bool" else (2 if is_float_dtype(dy) else 1)
    if kx != ky:
        return x if kx > ky else y
    if wx != wy:
        return y if wx else x
    if {dx, dy} == {"float16", "bfloat16"}:
        return "float32", wx
    return x if dtype_bits(dx) >= dtype_bits(dy) else y
