"""The check stage of a decision: does an alternative compute what the unit computes?

One verification path with one tolerance policy (:class:`Checker`): the unit and the
alternative, each alone, built on llvm and compared on random inputs, with the error bound
``max|got - ref| <= tolerance(dtype) * max|ref|`` where ``tolerance`` is that of the narrowest
float type of the inputs and outputs (:func:`~tvm_ollie.verify.tolerance.tolerance`; :data:`RTOL`
for float32); then, for a small polynomial program, exactly over a finite field
(:func:`check_exact`): a float comparison cannot tell a wrong index from rounding noise when
the wrong term is small, the finite field can.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple, Union

import numpy as np

from ..codegen import library as lib
from ..compat import relax, tvm
from ..derive.program import Program
from ..tune.measure import random_args
from ..verify.finite_field import check_program_mod_p
from ..verify.tolerance import narrowest_float, tolerance
from .alternatives import Alternative
from .emit import EmitError
from .units import unit_module

__all__ = ["EXACT_CHECK_MAX_WORK", "RTOL", "CheckFn", "Checker", "check_exact",
           "check_numerics", "checked"]

#: Numerical tolerance of the acceptance check (relative to the largest output magnitude).
RTOL = tolerance("float32")
#: Multiply-adds up to which a polynomial candidate is also checked exactly over Z_p.
EXACT_CHECK_MAX_WORK = 1 << 22

#: ``check(reference, candidate) -> (ok, why)``: both modules compute the unit alone.
CheckFn = Callable[["tvm.IRModule", "tvm.IRModule"], Tuple[bool, str]]


def check_numerics(ref_mod: "tvm.IRModule", cand_mod: "tvm.IRModule") -> Tuple[bool, str]:
    """Both modules built on llvm, compared on random inputs (the
    :func:`~tvm_ollie.verify.tolerance.tolerance` of the narrowest float type of the inputs and
    outputs, :data:`RTOL` for float32, of the reference's largest magnitude); every result of a
    tuple-valued ``main``."""
    args = random_args(ref_mod["main"], seed=1)
    refs, dtypes = _run_llvm(ref_mod, args)
    gots, _ = _run_llvm(cand_mod, args)
    rtol = tolerance(narrowest_float(dtypes + [str(a.dtype) for a in args]))
    if isinstance(refs, list) or isinstance(gots, list):
        if not (isinstance(refs, list) and isinstance(gots, list)) or len(refs) != len(gots):
            return False, "the candidate returns another number of results"
        for k, (ref, got) in enumerate(zip(refs, gots)):
            ok, why = _compare(ref, got, rtol)
            if not ok:
                return False, f"result {k}: {why}"
        return True, ""
    return _compare(refs, gots, rtol)


def _compare(ref: np.ndarray, got: np.ndarray, rtol: float) -> Tuple[bool, str]:
    if got.shape != ref.shape:
        return False, f"shape {got.shape} != {ref.shape}"
    err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if not np.isfinite(err) or err > rtol * max(scale, 1e-6):
        return False, f"numerics differ: max abs err {err:.3g} (scale {scale:.3g})"
    return True, ""


def _run_llvm(mod, args) -> Tuple[Union[np.ndarray, List[np.ndarray]], List[str]]:
    """The output of ``mod`` on llvm as float64 (a list for a tuple), and its element types."""
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    if not hasattr(out, "numpy"):  # a tuple of results
        return [o.numpy().astype(np.float64) for o in out], [str(o.dtype) for o in out]
    return out.numpy().astype(np.float64), [str(out.dtype)]


def check_exact(prog: Program) -> Tuple[bool, str]:
    """The finite-field check of a small polynomial program (``(True, "")`` when it does not
    apply): exact where floats compare with a tolerance (:mod:`tvm_ollie.verify.finite_field`)."""

    orig = prog.original
    if int(np.prod([iv.extent for iv in orig.loops + orig.reduce], dtype=np.int64)) > \
            EXACT_CHECK_MAX_WORK:
        return True, ""
    res = check_program_mod_p(prog, trials=2)
    if res.applicable and not res.ok:
        return False, f"differs over Z_{res.p}: {res.reason}"
    return True, ""


class Checker:
    """Whether an alternative computes what its unit computes (see the module docstring).

    Parameters
    ----------
    numeric : CheckFn, optional
        Compares the unit's module with the alternative's (default :func:`check_numerics`);
        a tool's or test's own comparison replaces it here.
    exact : bool
        Also check a derived single-output program exactly (:func:`check_exact`) once the
        numeric check passed (a multi-output program's results were all compared numerically).
    """

    def __init__(self, numeric: Optional[CheckFn] = None, exact: bool = True):
        self.numeric: CheckFn = numeric or check_numerics
        self.exact = bool(exact)

    def check(self, unit, alt: Alternative) -> Tuple[bool, str]:
        """``(ok, why)``: ``alt`` against ``unit``, each alone; may raise (see :func:`checked`).

        Both are built on llvm, so an alternative on library kernels is checked on the CPU
        library's: the CUDA kernels take the same attributes and compute the same function
        (their own tests compare them with numpy on a GPU)."""
        with lib.kernel_device("cpu"):
            ok, why = self.numeric(unit_module(unit),
                                   unit_module(unit, alt.program, None, alt.impl))
        if ok and self.exact and alt.program is not None and not alt.program.multi:
            ok, why = check_exact(alt.program)
        return ok, why


def checked(checker: Checker, unit, alt: Alternative) -> Tuple[bool, str]:
    """``checker.check(unit, alt)`` with every failure a rejection: an alternative with no
    Relax form, or whose build or run raises, does not hold up."""
    try:
        return checker.check(unit, alt)
    except EmitError as err:
        return False, f"no Relax form: {err}"
    except Exception as err:  # pylint: disable=broad-except
        return False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
