"""Library candidates of kernel orchestration: each heavy call's native kernel, with and
without its post-op epilogue, offered to the binary program next to TVM's kernels.

Korch profiles vendor kernels and generated ones alike and lets the program choose. Here, for
every static ``matmul`` (batched or not), ``conv2d`` and ``conv2d_transpose`` that the native
library computes exactly (:func:`tvm_ollie.codegen.library.call_form`, the Decider's own
eligibility, and a loaded library that registers the kernel), :func:`offer_library` emits the
library call after it as an alternative of the joint selection
(:mod:`tvm_ollie.orchestrate.joint`)::

    y = matmul(x, w)                      y = matmul(x, w)
    z = add(y, b)               ->        y__alt1 = K(x, w)                 # the library call
    r = relu(z)                           z = add(y, b); r = relu(z)
                                          y__alt2 = K(bias+relu; x, w, b)   # epilogue folded

and, through :func:`~tvm_ollie.pipeline.joint.offer_folded` (the guards of
:func:`~tvm_ollie.transform.epilogue.fold_chain`: bias, residual, activation in the kernel's
order, each consumer the only reader), the same call with its consumers folded as oneDNN
post-ops. The selection then weighs ``library call + its epilogue`` (one kernel; it makes the
call and the folded consumers unnecessary) against ``TVM kernel fusing the same operators``;
the chosen alternative is emitted as the library call (``call_dps_packed``), the others
vanish.

Costs: each library alternative carries the library's calibrated roofline
(:func:`tvm_ollie.tune.analytic.original_seconds` with ``impl="native"``, what the Decider's
analytic cost says) and ``profiled=True``: a profiled cost model builds and times the library
call like any candidate (:class:`~tvm_ollie.orchestrate.profiled.ProfiledCost`), an analytic
one uses the estimate. No Decider runs here (this is orchestration alone, ``tvm-orch``); the
original call is every group's sequential choice.
"""

from __future__ import annotations

from typing import Optional, Tuple

from .. import native
from ..codegen import library as lib
from ..compat import mutate_functions, relax, tvm
from ..lift import LiftError, lift_relax_call
from ..orchestrate.joint import ALT_RE, ALT_TAG, AltInfo, JointTable
from ..tune import analytic
from ..tune.calibrate import Calibration, calibrate
from .joint import offer_folded, static_call

__all__ = ["LIBRARY_OPS", "library_form", "library_offer", "offer_library"]

#: The Relax operators whose library kernel is offered (the eligibility is ``call_form``'s).
LIBRARY_OPS = ("relax.matmul", "relax.nn.conv2d", "relax.nn.conv2d_transpose")

#: Label of a library alternative (folded ones add ``+ bias+relu...``).
LABEL = "library"


def _estimate(call: "relax.Call", calib: Calibration) -> Optional[float]:
    """The library kernel's calibrated roofline seconds (None when the call does not lift)."""
    try:
        return analytic.original_seconds(lift_relax_call(call), call.op.name, calib, "native")
    except LiftError:
        return None


def library_form(call) -> Optional["lib.LibCall"]:
    """The native kernel of a static heavy call the loaded library provides, else None."""
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op) \
            or call.op.name not in LIBRARY_OPS or not static_call(call):
        return None
    form = lib.call_form(call)
    if form is None or not native.provides(form.func):
        return None
    return form


def offer_library(mod: "tvm.IRModule", target="llvm",
                  calibration: Optional[Calibration] = None
                  ) -> Tuple["tvm.IRModule", JointTable]:
    """``mod`` with every eligible heavy call's library kernel offered after it (plain and
    with its epilogue folded), and the table the orchestration reads (module docstring).
    Nothing is offered when the native library is not loaded or the target is not a CPU."""
    table = JointTable()
    if lib.device_of(target) != "cpu" or not native.available():
        table.notes.append("library candidates: native library not available here")
        return mod, table
    calib = calibration or calibrate(target)

    @relax.expr_functor.mutator
    class _Offer(relax.PyExprMutator):
        def visit_var_binding_(self, binding):  # pylint: disable=arguments-renamed
            super().visit_var_binding_(binding)
            name = binding.var.name
            form = library_form(binding.value)
            if form is None or ALT_RE.match(name) or name in table.alts \
                    or not self.builder_.current_block_is_dataflow():
                return
            estimate = _estimate(binding.value, calib)
            if estimate is None:
                return
            call = binding.value
            args = [self.visit_expr(a) for a in call.args[:2]]
            shape = [int(s) for s in call.ty.shape]
            # a block output: FoldConstant drops unused dataflow bindings
            self.builder_.emit_output(lib.emit_call(form, args, shape),
                                      name_hint=f"{name}{ALT_TAG}1")
            table.alts[name] = [AltInfo("original", 0.0, sequential=True),
                                AltInfo(LABEL, estimate, native=True, profiled=True)]

    return offer_folded(mutate_functions(_Offer(mod), mod), table), table


def library_offer(target="llvm", calibration: Optional[Calibration] = None):
    """``offer(mod) -> (mod, table)`` for :func:`tvm_ollie.orchestrate.orchestrate_pipeline`'s
    ``offer`` argument: :func:`offer_library` for ``target``."""

    def _offer(mod):
        return offer_library(mod, target, calibration)

    return _offer
