"""Composing the passes (floor 7 of DESIGN.md's layout): :func:`build`, the registered
``"ollie"`` Relax pipeline, the joint build and its never-worse guard.

::

    from tvm_ollie.pipeline import build, cuda_source
    ex, report = build(mod, target="llvm", trials=0)     # rewrite + compile (+ tuning records)
    ex = tvm.compile(mod, "llvm", relax_pipeline="ollie")  # registered on import

:mod:`tvm_ollie.transform` (the derivation pass) and :mod:`tvm_ollie.orchestrate` (kernel
orchestration) sit side by side one floor below and never import each other; everything that
needs both is here: :mod:`.build` (``build``, its whole-model guard against TVM's build of
the original, and the ``"ollie"`` pipeline), :mod:`.compile`
(TVM's fusion or orchestration, tuned or not), :mod:`.joint` (offering derivation alternatives
to the orchestration), :mod:`.joint_plans` (the joint build) and :mod:`.guard` (its
never-worse guard). Importing this package registers the ``"ollie"`` Relax pipeline.
"""

from .build import PIPELINE_NAME, build, cuda_source, ollie_pipeline
from .compile import compile_module, default_pipeline
from .guard import GuardError, GuardReport, PlanSkipped, guard_plans
from .joint import make_decider, offer_alternatives, offer_folded
from .joint_plans import GUARD_REFERENCE, PLANS, PlanBuilder, joint_build

__all__ = ["GUARD_REFERENCE", "GuardError", "GuardReport", "PIPELINE_NAME", "PLANS",
           "PlanBuilder", "PlanSkipped", "build", "compile_module", "cuda_source",
           "default_pipeline", "guard_plans", "joint_build", "make_decider", "offer_alternatives",
           "offer_folded", "ollie_pipeline"]
