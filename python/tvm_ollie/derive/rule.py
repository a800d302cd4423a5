"""The interface of a derivation rule: :class:`Rule`, :class:`Rewrite`, :class:`RuleContext`.

A rule rewrites ONE scope (the focus) into an equivalent scope: same loop ranges, same padding,
same value at every point of the padded domain. New nested scopes may appear inside the result.
The driver in :mod:`tvm_ollie.derive.focus` picks the focus and rebuilds the expression around
it; the rules themselves live in :mod:`tvm_ollie.derive.rules`, above this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, List, NamedTuple, Optional, Tuple

from ..ir.nodes import Scope

__all__ = ["Rewrite", "RuleContext", "Rule"]


class Rewrite(NamedTuple):
    """One application of a rule: the equivalent replacement of the focus and what was done."""

    scope: Scope
    note: str


@dataclass(frozen=True)
class RuleContext:
    """What rules may consult besides the focus.

    Attributes
    ----------
    targets : tuple of str
        The operators the search is heading for (rules may use them to pick factors).
    small_factors : tuple of int
        Split factors always tried when they divide a range (besides the strides that the
        indices themselves show, see :func:`split_factors`).
    split_factors : tuple of int or None
        When given, exactly these factors are tried (overrides the automatic choice).
    max_relax : int
        Largest amount by which boundary relaxing may enlarge a summation range.
    guided_maps : int
        Longest chain of iterator mappings the guided rule ``map_to_target`` tries (0: off).
    """

    targets: Tuple[str, ...] = ()
    small_factors: Tuple[int, ...] = (2, 3)
    split_factors: Optional[Tuple[int, ...]] = None
    max_relax: int = 4
    guided_maps: int = 2


@dataclass(frozen=True)
class Rule:
    """A named derivation rule: ``apply(focus, ctx)`` yields equivalent rewrites of the focus.

    ``doc`` is the equation the rule implements; ``costs_depth`` is False for eager rules (stage
    merging), which the search applies to a fixed point after every step without counting depth.
    ``max_per_path`` bounds how often the search uses the rule on one derivation path (None: no
    bound); rules whose repeated use only re-nests what one use already did carry a bound.
    ``guided`` rules are neither explorative nor eager: the search tries them at each scope a
    state newly created and keeps a result only when it instantiates a target (no depth cost).
    """

    name: str
    family: str
    doc: str
    apply: Callable[[Scope, RuleContext], Iterator[Rewrite]] = field(repr=False)
    costs_depth: bool = True
    max_per_path: Optional[int] = None
    guided: bool = False

    def __call__(self, scope: Scope, ctx: Optional[RuleContext] = None) -> List[Rewrite]:
        """All rewrites of ``scope`` (a list; empty when the rule does not apply)."""
        return list(self.apply(scope, ctx or RuleContext()))
