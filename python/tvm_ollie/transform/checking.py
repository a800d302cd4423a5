"""The check stage of a decision: does an alternative compute what the unit computes?

One verification path with one tolerance policy (:class:`Checker`): the unit and the
alternative, each alone, built on llvm and compared on random inputs, with the error bound
``max|got - ref| <= tolerance(dtype) * max|ref|`` where ``tolerance`` is that of the narrowest
float type of the inputs and outputs (:func:`~tvm_ollie.verify.tolerance.tolerance`; :data:`RTOL`
for float32); then, for a small polynomial program, exactly over a finite field
(:func:`check_exact`): a float comparison cannot tell a wrong index from rounding noise when
the wrong term is small, the finite field can.

The verdicts are kept (:class:`VerdictCache`, in ``work_dir`` and the per-user cache beside
the derivation cache): a second compile of the same model checks nothing again. Only a PASS
stored under an identical key skips a check, and the key holds everything the verdict depends
on (:meth:`VerdictCache.key`): both isolated modules as TVM sees them (structural hashes, the
constants' values included), the program's text, the unit's signature, the target, the native
library's identity, the TVM version and the checker's own version (the source of this module,
of :mod:`tvm_ollie.verify`, of the random inputs' generator and of the ``derive`` and ``ir``
packages that evaluate the exact check). Nothing unverified is applied: a verdict reused is
the verdict of the very same comparison, run before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple, Union

import numpy as np
import tvm_ffi

from ..codegen import library as lib
from ..compat import relax, tvm
from ..compile_profile import stage
from ..derive.cache import EntryStore, rules_version, run_dirs
from ..derive.program import Program
from ..tune.machine import native_identity
from ..tune.measure import random_args
from ..verify.finite_field import check_program_mod_p
from ..verify.tolerance import narrowest_float, tolerance
from .alternatives import Alternative
from .batched import UnitBuild
from .emit import EmitError
from .units import unit_module, unit_signature

__all__ = ["EXACT_CHECK_MAX_WORK", "RTOL", "CheckFn", "Checker", "VerdictCache", "check_exact",
           "check_numerics", "checked", "checker_version", "native_identity"]

LOG = logging.getLogger("tvm_ollie.transform")

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
    ok, why, _ = numeric_evidence(ref_mod, cand_mod)
    return ok, why


def numeric_evidence(ref_mod: "tvm.IRModule", cand_mod: "tvm.IRModule",
                     build: Optional[UnitBuild] = None, ref_key: str = "",
                     cand_key: str = "") -> Tuple[bool, str, Dict[str, object]]:
    """:func:`check_numerics` with its evidence: the tolerance and, per result, the largest
    absolute error and the reference's largest magnitude. With ``build`` (a
    :class:`~.batched.UnitBuild` holding both modules under ``ref_key`` and ``cand_key``) both
    run from its one executable on the same inputs, the reference's results computed once per
    build; else each module is built alone."""
    args = random_args(ref_mod["main"], seed=1)
    ran = _run_built(build, ref_key, cand_key, args) if build is not None else None
    if ran is None:
        refs, dtypes = _run_llvm(ref_mod, args)
        gots, _ = _run_llvm(cand_mod, args)
    else:
        (refs, dtypes), (gots, _) = ran
    rtol = tolerance(narrowest_float(dtypes + [str(a.dtype) for a in args]))
    evidence: Dict[str, object] = {"rtol": rtol, "results": []}
    if isinstance(refs, list) or isinstance(gots, list):
        if not (isinstance(refs, list) and isinstance(gots, list)) or len(refs) != len(gots):
            return False, "the candidate returns another number of results", evidence
        for k, (ref, got) in enumerate(zip(refs, gots)):
            ok, why = _compare(ref, got, rtol, evidence["results"])
            if not ok:
                return False, f"result {k}: {why}", evidence
        return True, "", evidence
    ok, why = _compare(refs, gots, rtol, evidence["results"])
    return ok, why, evidence


def _compare(ref: np.ndarray, got: np.ndarray, rtol: float,
             log: Optional[list] = None) -> Tuple[bool, str]:
    if got.shape != ref.shape:
        return False, f"shape {got.shape} != {ref.shape}"
    err, scale = _max_error(ref, got)
    if log is not None:
        log.append({"max_abs_err": err, "scale": scale})
    if not np.isfinite(err) or err > rtol * max(scale, 1e-6):
        return False, f"numerics differ: max abs err {err:.3g} (scale {scale:.3g})"
    return True, ""


#: Elements compared per step by :func:`_max_error` (8 MiB of float64 per temporary).
COMPARE_CHUNK = 1 << 20


def _max_error(ref: np.ndarray, got: np.ndarray) -> Tuple[float, float]:
    """``(max|got - ref|, max|ref|)`` in float64, a chunk of :data:`COMPARE_CHUNK` elements at
    a time. Why chunks: the results of a unit at paper size are hundreds of MB (Longformer's
    attention at sequence 10000), and float64 copies of both plus their difference held
    several GB per check; now the temporaries are a few chunks. A NaN anywhere gives a NaN
    error (``np.max`` of the chunks' maxima propagates it)."""
    ref, got = ref.reshape(-1), got.reshape(-1)
    if not ref.size:
        return 0.0, 0.0
    errs, scales = [], []
    for lo in range(0, ref.size, COMPARE_CHUNK):
        r = ref[lo:lo + COMPARE_CHUNK].astype(np.float64)
        g = got[lo:lo + COMPARE_CHUNK].astype(np.float64)
        errs.append(np.max(np.abs(g - r)))
        scales.append(np.max(np.abs(r)))
    return float(np.max(errs)), float(np.max(scales))


_DEFAULT_NUMERIC = check_numerics  # (a comparison patched in its place is not cached)
#: The key of the original in a decision's merged build (:class:`~.batched.UnitBuild`).
_BASELINE = Alternative(None, "tvm").label


def _run_llvm(mod, args) -> Tuple[Union[np.ndarray, List[np.ndarray]], List[str]]:
    """The output of ``mod`` on llvm (a list for a tuple), and its element types."""
    ex = tvm.compile(mod, target="llvm")
    return _results(relax.VirtualMachine(ex, tvm.cpu())["main"], args)


def _run_built(build: UnitBuild, ref_key: str, cand_key: str, args):
    """The reference's and the candidate's results from ``build`` (None: the merged build
    failed, or does not hold both: build them alone)."""
    ref, cand = build.function(ref_key), build.function(cand_key)
    if ref is None or cand is None:
        return None
    memo = build.memo.get(("reference", ref_key))
    if memo is None:
        memo = build.memo[("reference", ref_key)] = _run_function(*ref, args)
    return memo, _run_function(*cand, args)


def _run_function(ex, name: str, args):
    """The output of function ``name`` of ``ex`` on the CPU, and its types."""
    return _results(relax.VirtualMachine(ex, tvm.cpu())[name], args)


def _results(func, args) -> Tuple[Union[np.ndarray, List[np.ndarray]], List[str]]:
    """``func(*args)`` as numpy arrays of their own element type (a list for a tuple; the
    comparison widens them to float64 a chunk at a time, :func:`_max_error`), and the types."""
    out = func(*[tvm.runtime.tensor(a) for a in args])
    if not hasattr(out, "numpy"):  # a tuple of results
        return [o.numpy() for o in out], [str(o.dtype) for o in out]
    return out.numpy(), [str(out.dtype)]


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


#: Layout of a verdict entry and meaning of a verdict; bump when either changes.
VERDICT_FORMAT = 1
_VERDICT_SUBDIR = "verdicts"


@functools.lru_cache(maxsize=1)
def checker_version() -> str:
    """A hash of what a verdict depends on besides its modules: :data:`VERDICT_FORMAT`, the
    source of this module, of :mod:`tvm_ollie.verify` and of the random inputs' generator
    (:mod:`tvm_ollie.tune.measure`), and :func:`~tvm_ollie.derive.cache.rules_version` (the
    ``derive`` and ``ir`` packages, which evaluate the exact check)."""
    digest = hashlib.sha256(f"{VERDICT_FORMAT}|{rules_version()}".encode())
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [os.path.abspath(__file__), os.path.join(pkg, "tune", "measure.py")]
    verify_dir = os.path.join(pkg, "verify")
    paths += [os.path.join(verify_dir, n) for n in sorted(os.listdir(verify_dir))
              if n.endswith(".py")]
    for path in paths:
        digest.update(os.path.relpath(path, pkg).encode())
        with open(path, "rb") as fh:
            digest.update(fh.read())
    return digest.hexdigest()[:16]


class VerdictCache:
    """The checker's verdicts by everything they depend on (module docstring), kept in
    ``<work_dir>/verdicts`` and the per-user cache (:func:`~tvm_ollie.derive.cache.run_dirs`;
    the storage is the derivation cache's :class:`~tvm_ollie.derive.cache.EntryStore`: atomic
    writes, size bound, a corrupt entry ignored with one warning, an unwritable directory
    skipped).

    Parameters
    ----------
    dirs : sequence of str
        Directories to read (first hit wins) and write (every one).
    target : str
        The compilation target (part of every key).
    version : str, optional
        The checker's version in every key (default :func:`checker_version`).
    library : str, optional
        The native library's identity in every key (default :func:`native_identity`).
    """

    def __init__(self, dirs, target: str, version: Optional[str] = None,
                 library: Optional[str] = None):
        self.store = EntryStore(dirs, what="verification cache")
        self.target = str(target)
        self.version = version if version is not None else checker_version()
        self.library = library if library is not None else native_identity()
        #: PASS verdicts reused / checks run and stored
        self.hits = self.stores = 0

    @classmethod
    def for_run(cls, work_dir: Optional[str], target) -> "VerdictCache":
        """The cache of a compile: ``<work_dir>/verdicts`` (if given) and the per-user one."""
        return cls(run_dirs(work_dir, _VERDICT_SUBDIR), target)

    def key(self, unit_sig: str, alt: Alternative, ref_mod, cand_mod,
            exact: bool) -> Tuple[str, str]:
        """``(digest, key text)`` of the check of ``alt`` (module ``cand_mod``) against the unit
        (signature ``unit_sig``, module ``ref_mod``)."""
        prog = alt.program
        material = json.dumps({
            "format": VERDICT_FORMAT, "checker": self.version, "tvm": tvm.__version__,
            "native": self.library, "target": self.target, "unit": unit_sig,
            "lifted": "" if prog is None else _digest(str(prog.original)),
            "program": "original" if prog is None else _program_text(prog),
            "impl": alt.impl, "exact": bool(exact),
            "reference": str(tvm_ffi.structural_hash(ref_mod)),
            "candidate": str(tvm_ffi.structural_hash(cand_mod))}, sort_keys=True)
        return hashlib.sha256(material.encode()).hexdigest(), material

    def passed(self, keyed: Tuple[str, str]) -> bool:
        """Whether a PASS verdict is stored under exactly this key (a FAIL never skips a
        check: it is checked again)."""
        with stage("verification cache"):
            found = self.store.load(*keyed, decode=_verdict)
        if found is True:
            self.hits += 1
            return True
        return False

    def put(self, keyed: Tuple[str, str], ok: bool, why: str,
            evidence: Dict[str, object]) -> None:
        """Store a verdict with its evidence."""
        digest, material = keyed
        with stage("verification cache"):
            wrote = self.store.store(digest, {"key": material, "ok": bool(ok), "why": why,
                                              "evidence": evidence})
        self.stores += wrote


def _verdict(entry: Dict[str, object]) -> Optional[bool]:
    """The verdict of an entry (a malformed one raises: the store drops it as corrupt)."""
    ok = entry["ok"]
    if not isinstance(ok, bool):
        raise ValueError(f"verdict {ok!r} is not a bool")
    return ok


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _program_text(prog: Program) -> str:
    """The program's stages as text (names, kinds, attributes and canonical expressions)."""
    return ";".join(f"{s.name}={s.kind}{sorted(dict(s.attrs).items())}:{s.expr}"
                    for s in prog.stages) + f"->{prog.output}"


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
    cache : VerdictCache, optional
        Where verdicts are kept and PASS verdicts reused; used only with the default
        comparison (another comparison's verdicts are its own).
    """

    def __init__(self, numeric: Optional[CheckFn] = None, exact: bool = True,
                 cache: Optional[VerdictCache] = None):
        self.numeric: CheckFn = numeric or check_numerics
        self.exact = bool(exact)
        self.cache = cache if self.numeric is _DEFAULT_NUMERIC else None

    def check(self, unit, alt: Alternative,
              build: Optional[UnitBuild] = None) -> Tuple[bool, str]:
        """``(ok, why)``: ``alt`` against ``unit``, each alone; may raise (see :func:`checked`).

        Both are built on llvm, so an alternative on library kernels is checked on the CPU
        library's: the CUDA kernels take the same attributes and compute the same function
        (their own tests compare them with numpy on a GPU). ``build``: the decision's merged
        build (:mod:`.batched`, built for a CPU target) holding the original under
        ``"original"`` and ``alt`` under its label; the default comparison then runs both
        from it (the same inputs, the same verdict) instead of building them alone."""
        with lib.kernel_device("cpu"):
            shared = build is not None and _BASELINE in build and alt.label in build
            ref_mod = build.modules[_BASELINE] if shared else unit_module(unit)
            cand_mod = build.modules[alt.label] if shared else \
                unit_module(unit, alt.program, None, alt.impl)
            keyed = self._key(unit, alt, ref_mod, cand_mod)
            if keyed is not None and self.cache.passed(keyed):
                return True, ""
            if keyed is not None or (shared and self.numeric is _DEFAULT_NUMERIC):
                ok, why, evidence = numeric_evidence(ref_mod, cand_mod, build, _BASELINE,
                                                     alt.label) if shared else \
                    numeric_evidence(ref_mod, cand_mod)
            else:
                (ok, why), evidence = self.numeric(ref_mod, cand_mod), {}
        if ok and self.exact and alt.program is not None and not alt.program.multi:
            ok, why = check_exact(alt.program)
            evidence["exact"] = why or "passed or not applicable"
        if keyed is not None:
            self.cache.put(keyed, ok, why, evidence)
        return ok, why

    def _key(self, unit, alt: Alternative, ref_mod, cand_mod) -> Optional[Tuple[str, str]]:
        """The verdict key of this check, or None (no cache, or no key: then it runs)."""
        if self.cache is None:
            return None
        try:
            return self.cache.key(unit_signature(unit), alt, ref_mod, cand_mod, self.exact)
        except Exception as err:  # pylint: disable=broad-except
            LOG.debug("ollie: no verdict key (%s: %s)", type(err).__name__, err)
            return None


def checked(checker: Checker, unit, alt: Alternative,
            build: Optional[UnitBuild] = None) -> Tuple[bool, str]:
    """``checker.check(unit, alt)`` with every failure a rejection: an alternative with no
    Relax form, or whose build or run raises, does not hold up (``build``: the decision's
    merged build, :meth:`Checker.check`)."""
    try:
        if build is not None and type(checker).check is Checker.check:
            return checker.check(unit, alt, build)  # (a checker of its own is asked as before)
        return checker.check(unit, alt)
    except EmitError as err:
        return False, f"no Relax form: {err}"
    except Exception as err:  # pylint: disable=broad-except
        return False, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
