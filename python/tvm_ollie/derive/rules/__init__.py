"""Derivation rules, one module per family; each rule is a named :class:`Rule` object.

``ALL_RULES`` lists every intra-expression rule; ``EAGER_RULES`` those applied to a fixed point
after every step without costing depth (stage merging, and boundary tightening: the tightest
ranges are part of the canonical form of a state, so states that differ only in how far they were
tightened are one state; and guard solving: a summation under a stride guard is replaced by one
over the guard's solutions); ``SEARCH_RULES`` the explorative rules the search tries by default (boundary relaxing enters through ``split_sum_padded``, which relaxes
exactly as much as a split needs, so the standalone ``relax_sum`` is left out of the default);
``GUIDED_RULES`` those the search tries at every newly created scope and keeps only when the
result instantiates a target (no depth cost): guided iterator mapping and phase splitting.
"""

from .base import Rewrite, Rule, RuleContext  # noqa: F401
from .boundary import RELAX_SUM, TIGHTEN  # noqa: F401
from .guard import SOLVE_GUARD  # noqa: F401
from .guided import MAP_TO_TARGET  # noqa: F401
from .layout import SPLIT_DIM  # noqa: F401
from .merge import FUSE_ITERS, MAP_ITERS  # noqa: F401
from .phase import SPLIT_PHASE  # noqa: F401
from .split import SPLIT_LOOP, SPLIT_SUM, SPLIT_SUM_PADDED  # noqa: F401
from .stage import MERGE_STAGE, MERGE_STAGE_SUM, SPLIT_STAGE  # noqa: F401

from .plain import EAGER_RULES, PLAIN_RULES  # noqa: F401

ALL_RULES = PLAIN_RULES + (SPLIT_PHASE, MAP_TO_TARGET)
GUIDED_RULES = tuple(r for r in ALL_RULES if r.guided)
SEARCH_RULES = (
    SPLIT_STAGE, MAP_ITERS, SPLIT_SUM, SPLIT_SUM_PADDED, SPLIT_LOOP, FUSE_ITERS,
    SPLIT_DIM, MERGE_STAGE_SUM,
)
RULES_BY_NAME = {r.name: r for r in ALL_RULES}
