"""Read the canonical text of :mod:`.printer` back into nodes.

The grammar is exactly what :func:`.printer.to_text` writes (one line, whitespace free-form)::

    text      := (scope | iterator | expr) ["where" decl (";" decl)*]
    decl      := NAME ":" DTYPE "[" [INT ("," INT)*] "]"
    scope     := "L" "<" iters ">" [("Σ" | "Sum" | "Max") "<" iters ">"] ["pad" "=" pads]
                 "{" expr "}"
    iters     := [NAME ":" SINT ":" SINT ("," NAME ":" SINT ":" SINT)*]
    pads      := "[" [pad ("," pad)*] "]"          pad := INT | INT ":" INT   (lo:hi)
    expr      := binary expression over printer.PRECEDENCE (all left-associative)
    unary     := "-" unary | primary                (binds tighter than "*")
    primary   := NUMBER | "inf" | "nan" | NAME | FUNC "(" args ")" | tensor ["[" args "]"]
                 | "(" expr ")" | "(" scope ")" ["[" args "]"]
    tensor    := NAME ["<" attr ("," attr)* ">"]    attr := "pad" "=" pads | "value" "=" NUMBER

Why it is a hand-written recursive-descent parser: the language is tiny, error positions matter
for hand-written test expressions, and the project takes no parser dependency.

Resolution rules that make ``parse(to_text(e)) is e`` hold (nodes are hash-consed):

* A number with ``.``, an exponent, or ``inf``/``nan`` is a float32 :class:`Const`; otherwise an
  int32 one. ``-`` directly before a literal folds into a negative constant, which is how the
  printer writes negative constants; before anything else it applies ``Node.__neg__``.
* Inside a scope body a bare name is one of that scope's iterators (scopes are closed, so a
  nested scope does not see the outer iterators); any other name is an error, except a declared
  tensor name, which denotes the :class:`Tensor` itself. Outside any scope, a bare name is a
  declared tensor if there is one of that name and a free :class:`Var` otherwise.
* Tensor shapes and dtypes come from the ``where`` clause or the ``tensors=`` argument; padding
  and pad value are written at each reference, so one name may be read with several paddings.
"""

from __future__ import annotations

import math
import re
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from .nodes import (
    SCALAR_FUNCS,
    Access,
    BinOp,
    Call,
    Const,
    IterVar,
    Node,
    Scope,
    Tensor,
    Var,
)
from .printer import PRECEDENCE

__all__ = ["ParseError", "parse"]

_REDUCERS = {"Σ": "sum", "Sum": "sum", "Max": "max"}

_TOKEN_RE = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<num>(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[^\W\d][\w.]*)
  | (?P<op>//|<=|>=|==|!=|[-+*/%<>()\[\]{},:;=])
    """,
    re.VERBOSE,
)

TensorSpec = Union[Tensor, Tuple[Sequence[int], str], Sequence[int]]


class ParseError(ValueError):
    """A syntax or resolution error in expression text.

    Attributes
    ----------
    pos : int
        0-based character offset of the offending token in the text.
    line, col : int
        1-based line and column of that offset.
    """

    def __init__(self, message: str, text: str, pos: int):
        self.msg = message
        self.text = text
        self.pos = pos
        self.line = text.count("\n", 0, pos) + 1
        self.col = pos - (text.rfind("\n", 0, pos) + 1) + 1
        start = max(0, pos - 20)
        near = text[start:pos + 20].replace("\n", " ")
        caret = " " * (pos - start) + "^"
        super().__init__(f"{message} (line {self.line}, column {self.col})\n  {near}\n  {caret}")


class _Token:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int):
        self.kind = kind  # "num", "name", "op" or "eof"
        self.text = text
        self.pos = pos

    def __repr__(self) -> str:
        return f"{self.kind}:{self.text!r}@{self.pos}"


def _tokenize(text: str) -> List[_Token]:
    tokens = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r}", text, pos)
        if m.lastgroup != "ws":
            tokens.append(_Token(m.lastgroup, m.group(), pos))
        pos = m.end()
    tokens.append(_Token("eof", "", len(text)))
    return tokens


def parse(text: str, tensors: Optional[Mapping[str, TensorSpec]] = None) -> Node:
    """Parse canonical expression text into a node.

    Parameters
    ----------
    text : str
        What :func:`.printer.to_text` prints: a scope, a bare expression, a tensor, or an
        iterator ``name:begin:end``, optionally followed by a ``where`` clause.
    tensors : Mapping[str, Tensor | (shape, dtype) | shape], optional
        Shapes and dtypes of tensors not declared in the text (a bare shape means float32).
        A declaration in both places must agree. Only shape and dtype are taken from a
        :class:`Tensor`; padding is read at each reference.

    Returns
    -------
    node : Node
        The (hash-consed) node; for printer output, the very node that was printed.

    Raises
    ------
    ParseError
        On a syntax error, an unbound iterator, an undeclared tensor, or text that builds an
        invalid node (e.g. a wrong number of indices); the message gives the position.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse() takes a str, not {type(text).__name__}")
    tokens = _tokenize(text)
    split = next((k for k, t in enumerate(tokens) if t.kind == "name" and t.text == "where"),
                 len(tokens) - 1)
    declared = {}
    if tokens[split].kind != "eof":
        declared = _Parser(text, tokens[split + 1:], {}).declarations()
    specs = _merge_specs(text, declared, tensors)
    body_tokens = tokens[:split] + [_Token("eof", "", tokens[split].pos)]
    return _Parser(text, body_tokens, specs).top()


def _merge_specs(
    text: str,
    declared: Dict[str, Tuple[Tuple[int, ...], str, int]],
    tensors: Optional[Mapping[str, TensorSpec]],
) -> Dict[str, Tuple[Tuple[int, ...], str]]:
    specs = {name: (shape, dtype) for name, (shape, dtype, _) in declared.items()}
    for name, spec in (tensors or {}).items():
        if isinstance(spec, Tensor):
            shape, dtype = spec.shape, spec.dtype
        elif (isinstance(spec, (tuple, list)) and len(spec) == 2 and isinstance(spec[1], str)):
            shape, dtype = tuple(int(s) for s in spec[0]), spec[1]
        elif isinstance(spec, (tuple, list)) and all(isinstance(s, int) for s in spec):
            shape, dtype = tuple(spec), "float32"
        else:
            raise TypeError(f"tensors[{name!r}] must be a Tensor, (shape, dtype) or a shape")
        if name in specs and specs[name] != (shape, dtype):
            raise ParseError(
                f"tensor {name!r} is declared as {specs[name]} in the text but "
                f"{(shape, dtype)} in tensors=", text, declared[name][2])
        specs[name] = (shape, dtype)
    return specs


class _Parser:
    """Recursive descent over a token list; ``bound`` is None outside any scope."""

    def __init__(self, text: str, tokens: List[_Token],
                 specs: Dict[str, Tuple[Tuple[int, ...], str]]):
        self.text = text
        self.tokens = tokens
        self.k = 0
        self.specs = specs
        self.bound: Optional[Set[str]] = None

    # -- token helpers -------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.k + ahead, len(self.tokens) - 1)]

    def at(self, text: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.kind != "eof" and tok.text == text

    def next(self) -> _Token:
        tok = self.peek()
        self.k = min(self.k + 1, len(self.tokens) - 1)
        return tok

    def expect(self, text: str) -> _Token:
        if not self.at(text):
            self.fail(f"expected {text!r}")
        return self.next()

    def fail(self, message: str, tok: Optional[_Token] = None):
        """Raise at ``tok``; without one, at the current token, naming what was found."""
        if tok is None:
            tok = self.peek()
            message += ", found " + ("end of input" if tok.kind == "eof" else repr(tok.text))
        raise ParseError(message, self.text, tok.pos)

    def build(self, tok: _Token, make, *args):
        """Construct a node, reporting the constructor's complaint at ``tok``."""
        try:
            return make(*args)
        except (ValueError, TypeError) as err:
            raise ParseError(str(err), self.text, tok.pos) from None

    def name(self, what: str) -> _Token:
        if self.peek().kind != "name":
            self.fail(f"expected {what}")
        return self.next()

    def integer(self, signed: bool = False) -> int:
        neg = signed and self.at("-")
        if neg:
            self.next()
        tok = self.peek()
        if tok.kind != "num" or not tok.text.isdigit():
            self.fail("expected an integer")
        self.next()
        return -int(tok.text) if neg else int(tok.text)

    def number(self) -> Union[int, float]:
        """A possibly negative literal: int, float, ``inf`` or ``nan``."""
        neg = self.at("-")
        if neg:
            self.next()
        value = self.literal()
        if value is None:
            self.fail("expected a number")
        return -value if neg else value

    def literal(self) -> Optional[Union[int, float]]:
        tok = self.peek()
        if tok.kind == "num":
            self.next()
            if tok.text.isdigit():
                return int(tok.text)
            return float(tok.text)
        if tok.kind == "name" and tok.text in ("inf", "nan"):
            self.next()
            return math.inf if tok.text == "inf" else math.nan
        return None

    def comma_list(self, close: str, item) -> list:
        """``item ("," item)*`` up to and including ``close`` (possibly empty)."""
        out = []
        if self.at(close):
            self.next()
            return out
        while True:
            out.append(item())
            if self.at(close):
                self.next()
                return out
            self.expect(",")

    # -- declarations --------------------------------------------------------------------------
    def declarations(self) -> Dict[str, Tuple[Tuple[int, ...], str, int]]:
        out: Dict[str, Tuple[Tuple[int, ...], str, int]] = {}
        while True:
            tok = self.name("a tensor name")
            if tok.text in out:
                self.fail(f"tensor {tok.text!r} declared twice", tok)
            self.expect(":")
            dtype = self.name("a dtype").text
            self.expect("[")
            shape = tuple(self.comma_list("]", self.integer))
            out[tok.text] = (shape, dtype, tok.pos)
            if self.peek().kind == "eof":
                return out
            self.expect(";")
            if self.peek().kind == "eof":  # tolerate a trailing ';'
                return out

    # -- top level -----------------------------------------------------------------------------
    def top(self) -> Node:
        if self.scope_ahead():
            node = self.scope()
        elif self.peek().kind == "name" and self.at(":", 1):
            node = self.iterator()
        else:
            node = self.expr(0)
        if self.peek().kind != "eof":
            self.fail("expected an operator or the end of the expression")
        return node

    def scope_ahead(self) -> bool:
        """``L<>`` or ``L<name:``; anything else starting with ``L`` is a name."""
        if not (self.peek().kind == "name" and self.peek().text == "L" and self.at("<", 1)):
            return False
        return self.at(">", 2) or (self.peek(2).kind == "name" and self.at(":", 3))

    def iterator(self) -> IterVar:
        tok = self.name("an iterator name")
        self.expect(":")
        begin = self.integer(signed=True)
        self.expect(":")
        end = self.integer(signed=True)
        return self.build(tok, IterVar, tok.text, begin, end)

    def pads(self) -> List[Tuple[int, int]]:
        self.expect("[")

        def entry() -> Tuple[int, int]:
            lo = self.integer()
            if self.at(":"):
                self.next()
                return (lo, self.integer())
            return (lo, lo)

        return self.comma_list("]", entry)

    def scope(self) -> Scope:
        start = self.expect("L")
        self.expect("<")
        loops = self.comma_list(">", self.iterator)
        reduce, reducer = [], "sum"
        if self.peek().text in _REDUCERS and self.peek().kind == "name" and self.at("<", 1):
            reducer = _REDUCERS[self.next().text]
            self.next()
            reduce = self.comma_list(">", self.iterator)
        pad = None
        if self.peek().kind == "name" and self.peek().text == "pad" and self.at("=", 1):
            self.next()
            self.next()
            pad = self.pads()
        self.expect("{")
        outer = self.bound
        self.bound = {iv.var.name for iv in loops + reduce}
        try:
            body = self.expr(0)
        finally:
            self.bound = outer
        self.expect("}")
        return self.build(start, Scope, loops, reduce, body, pad, reducer)

    # -- expressions ---------------------------------------------------------------------------
    def expr(self, min_prec: int) -> Node:
        left = self.unary()
        while True:
            tok = self.peek()
            prec = PRECEDENCE.get(tok.text) if tok.kind in ("op", "name") else None
            if prec is None or prec < min_prec:
                return left
            self.next()
            right = self.expr(prec + 1)  # left-associative
            left = self.build(tok, BinOp, tok.text, left, right)

    def unary(self) -> Node:
        if not self.at("-"):
            return self.primary()
        tok = self.next()
        value = self.literal()
        if value is not None:
            return Const(-value)
        operand = self.unary()
        return self.build(tok, lambda x: -x, operand)

    def primary(self) -> Node:
        tok = self.peek()
        value = self.literal()
        if value is not None:
            return Const(value)
        if tok.kind == "op" and tok.text == "(":
            return self.parenthesized()
        if tok.kind != "name":
            self.fail("expected an expression")
        if self.scope_ahead():
            self.fail("a nested scope must be parenthesized")
        if self.at("(", 1):
            return self.call()
        if self.at("[", 1) or self.tensor_attrs_ahead():
            return self.tensor_ref()
        self.next()
        if self.bound is not None and tok.text in self.bound:
            return Var(tok.text)
        if tok.text in self.specs:
            return self.tensor(tok, None, 0.0)
        if self.bound is None:
            return self.build(tok, Var, tok.text)
        return self.fail(f"iterator {tok.text!r} is not bound by the enclosing scope", tok)

    def parenthesized(self) -> Node:
        self.expect("(")
        if self.scope_ahead():
            scope = self.scope()
            self.expect(")")
            if self.at("["):
                return self.subscript(scope)
            return scope
        node = self.expr(0)
        self.expect(")")
        return node

    def call(self) -> Call:
        tok = self.next()
        if tok.text not in SCALAR_FUNCS:
            self.fail(f"unknown function {tok.text!r}", tok)
        self.expect("(")
        args = self.comma_list(")", lambda: self.expr(0))
        return self.build(tok, Call, tok.text, args)

    def tensor_attrs_ahead(self) -> bool:
        return (self.at("<", 1) and self.peek(2).kind == "name"
                and self.peek(2).text in ("pad", "value") and self.at("=", 3))

    def tensor_ref(self) -> Node:
        tok = self.next()
        pad, value, seen = None, 0.0, set()
        if self.at("<"):
            self.next()

            def attr() -> None:
                nonlocal pad, value
                key = self.name("'pad' or 'value'")
                if key.text not in ("pad", "value") or key.text in seen:
                    self.fail("expected 'pad' or 'value' (each at most once)", key)
                seen.add(key.text)
                self.expect("=")
                if key.text == "pad":
                    pad = self.pads()
                else:
                    value = float(self.number())

            self.comma_list(">", attr)
        tensor = self.tensor(tok, pad, value)
        if self.at("["):
            return self.subscript(tensor)
        return tensor

    def tensor(self, tok: _Token, pad, value: float) -> Tensor:
        spec = self.specs.get(tok.text)
        if spec is None:
            self.fail(f"tensor {tok.text!r} has no shape (declare it in a 'where' clause or "
                      "pass tensors=)", tok)
        return self.build(tok, Tensor, tok.text, spec[0], spec[1], pad, value)

    def subscript(self, source: Union[Tensor, Scope]) -> Access:
        tok = self.expect("[")
        indices = self.comma_list("]", lambda: self.expr(0))
        return self.build(tok, Access, source, indices)
