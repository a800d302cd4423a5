"""Kernel orchestration (Korch): fission -> primitives -> candidate kernels -> cost -> BLP -> emit.

See :mod:`.pipeline` for the pass and the pipeline; each step is a module of its own. This
package never imports :mod:`tvm_ollie.transform` (they sit side by side); what needs both, the
joint build with derivation alternatives, is :mod:`tvm_ollie.pipeline`.
"""

from ..config import OrchestrateConfig  # noqa: F401  (its home is tvm_ollie.config)
from .blp import BLPProblem, BLPResult, brute_force, solve_blp
from .candidates import Candidate, Enumeration, enumerate_candidates, is_convex
from .cost import AnalyticCost, CostModel, MeasuredCost
from .fission import FISSION_RULES, Fission, FissionReport, fission
from .graph import Node, PrimitiveGraph, build_graph
from .pipeline import (Orchestrate, build_check, default_check, fuse_check,
                       orchestrate_legalized, orchestrate_module, orchestrate_pipeline,
                       schedule_check)
from .primitives import KINDS, OP_KIND, kind_of
from .profiled import ProfiledCost
from .report import KernelReport, OrchestrationReport, PartitionReport, ProfileReport

__all__ = ["AnalyticCost", "BLPProblem", "BLPResult", "Candidate", "CostModel", "Enumeration",
           "FISSION_RULES", "Fission", "FissionReport", "KINDS", "KernelReport", "MeasuredCost",
           "Node", "OP_KIND", "Orchestrate", "OrchestrateConfig", "OrchestrationReport",
           "PartitionReport", "PrimitiveGraph", "ProfileReport", "ProfiledCost", "brute_force",
           "build_check", "build_graph", "default_check", "enumerate_candidates", "fission",
           "fuse_check", "is_convex",
           "kind_of", "orchestrate_legalized", "orchestrate_module", "orchestrate_pipeline",
           "schedule_check", "solve_blp"]
