"""Fission over the model zoo: composite-op counts before/after, optionally a numeric check.

``python -m tvm_ollie.orchestrate.fission_zoo [--full] [--check] [--attention] [MODEL ...]``
imports each zoo model into Relax exactly as the benchmark does (``models.to_relax``), runs
:func:`fission`, and prints one line per model: the composite calls before, what is left after
(only ops whose guard kept them as one primitive may remain), and with ``--check`` the largest
relative difference between the compiled original and the compiled fissioned model.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..compat import relax, tvm
from ..models import get_model, list_models, to_relax
from .fission import FissionReport, count_ops, fission, non_primitive_ops
from .fission_rules import FISSION_RULES


@dataclasses.dataclass
class ZooFission:
    """Fission of one zoo model."""

    model: str
    composite_before: Dict[str, int]
    composite_after: Dict[str, int]
    non_primitive_after: Dict[str, int]
    report: FissionReport
    seconds: float
    max_rel_diff: Optional[float] = None

    def line(self) -> str:
        """One summary line."""
        def fmt(counts):
            return ", ".join(f"{k.replace('relax.', '')}={v}" for k, v in sorted(counts.items()))

        check = "" if self.max_rel_diff is None else f"  max_rel_diff={self.max_rel_diff:.1e}"
        return (f"{self.model}: before [{fmt(self.composite_before) or '-'}] -> after "
                f"[{fmt(self.composite_after) or '-'}] non-primitive after "
                f"[{fmt(self.non_primitive_after) or '-'}] ({self.seconds:.1f}s){check}")


def _composites(mod: "tvm.IRModule") -> Dict[str, int]:
    return {k: v for k, v in count_ops(mod).items() if k in FISSION_RULES}


def fission_model(name: str, quick: bool = True, check: bool = False,
                  attention: bool = False) -> ZooFission:
    """Import zoo model ``name`` as the benchmark does, fission it, optionally compare outputs."""

    start = time.perf_counter()
    spec = get_model(name, quick=quick)
    mod, params = to_relax(spec)
    new_mod, report = fission(mod, attention=attention)
    result = ZooFission(name, _composites(mod), _composites(new_mod), non_primitive_ops(new_mod),
                        report, 0.0)
    if check:
        inputs = [tvm.runtime.tensor(x.detach().numpy()) for x in spec.example_inputs]
        want = _run(mod, inputs + params)
        got = _run(new_mod, inputs + params)
        result.max_rel_diff = max(
            float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30))
            for g, w in zip(got, want))
    result.seconds = time.perf_counter() - start
    return result


def _run(mod: "tvm.IRModule", args: List[object]) -> List[np.ndarray]:
    ex = tvm.compile(mod, "llvm")
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args)
    flat: List[np.ndarray] = []

    def walk(value):
        if hasattr(value, "numpy"):
            flat.append(value.numpy())
        else:
            for item in value:
                walk(item)

    walk(out)
    return flat


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry: print one line per model; exit 1 if a composite op is left over."""

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="zoo models (default: all)")
    parser.add_argument("--full", action="store_true", help="paper sizes instead of quick")
    parser.add_argument("--check", action="store_true", help="compile both and compare outputs")
    parser.add_argument("--attention", action="store_true", help="also the attention rewrite")
    args = parser.parse_args(argv)
    status = 0
    for name in args.models or list_models():
        res = fission_model(name, quick=not args.full, check=args.check,
                            attention=args.attention)
        print(res.line(), flush=True)
        print(f"    split {dict(sorted(res.report.split.items()))}")
        for op_name, reasons in sorted(res.report.untouched.items()):
            print(f"    untouched {op_name}: {reasons}")
        leftover = {k: v for k, v in res.composite_after.items()
                    if not _kept_as_primitive(res.report, k)}
        if leftover or res.non_primitive_after:
            status = 1
    return status


def _kept_as_primitive(report: FissionReport, op_name: str) -> bool:
    """Whether every remaining call of ``op_name`` was kept on purpose as one primitive."""
    reasons = report.untouched.get(op_name, {})
    return bool(reasons) and all("kept as one" in r for r in reasons)


if __name__ == "__main__":
    raise SystemExit(main())
