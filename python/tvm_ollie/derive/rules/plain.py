"""The rules that are not guided, in one tuple, and the eager ones among them.

The guided rules (:mod:`.guided`) test whether a stage reaches a target in its normal form, which
the eager rules define; listing those here, below the guided module, lets it import them.
"""

from .boundary import RELAX_SUM, TIGHTEN
from .guard import SOLVE_GUARD
from .layout import SPLIT_DIM
from .merge import FUSE_ITERS, MAP_ITERS
from .split import SPLIT_LOOP, SPLIT_SUM, SPLIT_SUM_PADDED
from .stage import MERGE_STAGE, MERGE_STAGE_SUM, SPLIT_STAGE

PLAIN_RULES = (
    SPLIT_SUM, SPLIT_LOOP, SPLIT_SUM_PADDED,
    MAP_ITERS, FUSE_ITERS,
    SPLIT_STAGE, MERGE_STAGE, MERGE_STAGE_SUM,
    TIGHTEN, RELAX_SUM,
    SPLIT_DIM,
    SOLVE_GUARD,
)
EAGER_RULES = tuple(r for r in PLAIN_RULES if not r.costs_depth)
