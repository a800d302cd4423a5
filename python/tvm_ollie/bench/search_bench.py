"""Benchmark of the derivation search on the EinNet operator cases.

Run ``python -m tvm_ollie.bench.search_bench [--depth 7] [--cases conv3x3 g2bmm ...] [--quick]``.
For each case it prints whether the expected derived form was found (and verified against the
original with the reference interpreter), the time (and depth) at which it was first found, the
states visited and pruned, the total search time to the depth limit (or the per-case time budget),
why the search stopped, and the cheapest program of the expected form. ``--quick`` uses small
shapes of the same structure; ``--phases`` adds where the search time went.

Reference (EinNet C++, depth 7, from the OSDI'23 artifact): conv3x3 158K states 7 s, found at
depth 4 (96 ms); conv-transpose 0.9M / 53 s, depth 6 (11.3 s); conv5x5 2.2M / 99 s, depth 7
(101 s); G2BMM 18K / 0.7 s, depth 4 (24 ms).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Callable, Dict, NamedTuple, Optional, Sequence

from ..derive.search import derive, verify_candidate
from ..ir.nodes import BinOp, Call, Const, IterVar, Scope, Tensor, Var


class Case(NamedTuple):
    """A benchmark case: expression builder, targets, and the derived form that counts as found."""

    build: Callable[[bool], Scope]
    targets: tuple
    expected: str  # regular expression matched against repr(program)
    note: str


def _conv_nhwc(n, h, c, f, r, pad) -> Scope:
    vn, vh, vw, vf, vc, vr, vs = (Var(x) for x in "nhwfcrs")
    a = Tensor("A", (n, h, h, c), pad=((0, 0), (pad, pad), (pad, pad), (0, 0)))
    k = Tensor("K", (r, r, f, c))
    return Scope([IterVar(vn, 0, n), IterVar(vh, 0, h), IterVar(vw, 0, h), IterVar(vf, 0, f)],
                 [IterVar(vc, 0, c), IterVar(vr, 0, r), IterVar(vs, 0, r)],
                 a[vn, vh + vr - pad, vw + vs - pad, vc] * k[vr, vs, vf, vc])


def _conv_nchw(n, c, h, f, r, pad) -> Scope:
    vn, vh, vw, vf, vc, vr, vs = (Var(x) for x in "nhwfcrs")
    a = Tensor("A", (n, c, h, h), pad=((0, 0), (0, 0), (pad, pad), (pad, pad)))
    k = Tensor("K", (f, c, r, r))
    return Scope([IterVar(vn, 0, n), IterVar(vf, 0, f), IterVar(vh, 0, h), IterVar(vw, 0, h)],
                 [IterVar(vc, 0, c), IterVar(vr, 0, r), IterVar(vs, 0, r)],
                 a[vn, vc, vh + vr - pad, vw + vs - pad] * k[vf, vc, vr, vs])


def conv3x3(quick: bool) -> Scope:
    """NHWC 1x7x7x512, 512 filters, pad 1 (quick: 1x4x4x8, 8 filters)."""
    return _conv_nhwc(1, 4, 8, 8, 3, 1) if quick else _conv_nhwc(1, 7, 512, 512, 3, 1)


def conv5x5(quick: bool) -> Scope:
    """NCHW 16x32x224x224, 1 filter, pad 2 (quick: 1x2x6x6)."""
    return _conv_nchw(1, 2, 6, 1, 5, 2) if quick else _conv_nchw(16, 32, 224, 1, 5, 2)


def conv_transpose(quick: bool) -> Scope:
    """4x4 stride 2 pad 1, NHWC 16x2x2x448 -> 256 (quick: 2x2x2x3 -> 4).

    ``Out[n, h, w, c] = Σ_{f,i,j} A[n, i, j, f] * K[h + 1 - 2i, w + 1 - 2j, f, c]`` with ``K``
    zero-padded: the scatter form of a transposed convolution, without the zero-stuffed input.
    """
    n, h, f, c = (2, 2, 3, 4) if quick else (16, 2, 448, 256)
    vn, vh, vw, vc, vf, vi, vj = (Var(x) for x in "nhwcfij")
    a = Tensor("A", (n, h, h, f))
    k = Tensor("K", (4, 4, f, c), pad=((2, 2), (2, 2), (0, 0), (0, 0)))
    return Scope([IterVar(vn, 0, n), IterVar(vh, 0, 2 * h), IterVar(vw, 0, 2 * h),
                  IterVar(vc, 0, c)],
                 [IterVar(vf, 0, f), IterVar(vi, 0, h), IterVar(vj, 0, h)],
                 a[vn, vi, vj, vf] * k[vh + 1 - 2 * vi, vw + 1 - 2 * vj, vf, vc])


def conv_transpose_lifted(quick: bool) -> Scope:
    """The same transposed convolution in the form the lifter emits for Relax's NCHW/IOHW
    ``conv2d_transpose`` (stride 2, padding 1): a gather guarded by the stride condition::

        Out[n, o, h, w] = Σ_{c,r,s} select((h + 1 - r) % 2 == 0 and (w + 1 - s) % 2 == 0,
                                           X[n, c, (h + 1 - r) // 2, (w + 1 - s) // 2], 0)
                                    * K[c, o, r, s]
    """
    n, h, c, f = (2, 2, 3, 4) if quick else (16, 2, 448, 256)
    vn, vo, vh, vw, vc, vr, vs = (Var(x) for x in "nohwcrs")
    x = Tensor("X", (n, c, h, h), pad=((0, 0), (0, 0), (1, 1), (1, 1)))
    k = Tensor("K", (c, f, 4, 4))
    guards, idx = [], []
    for out, tap in ((vh, vr), (vw, vs)):
        pos = out + 1 - tap
        guards.append(BinOp("==", BinOp("%", pos, Const(2)), Const(0)))
        idx.append(BinOp("//", pos, Const(2)))
    read = Call("select", (BinOp("and", *guards), x[(vn, vc, *idx)], Const(0.0, "float32")))
    return Scope([IterVar(vn, 0, n), IterVar(vo, 0, f), IterVar(vh, 0, 2 * h),
                  IterVar(vw, 0, 2 * h)],
                 [IterVar(vc, 0, c), IterVar(vr, 0, 4), IterVar(vs, 0, 4)], read * k[vc, vo, vr, vs])


def g2bmm(quick: bool) -> Scope:
    """Dilated G2BMM, dilation 4: batch 8, length 10000, width 2*500+1, dim 64 (quick: 1x16)."""
    bs, m, w, d, k = (1, 16, 1, 4, 4) if quick else (8, 10000, 500, 4, 64)
    b, vm, vw, vk = (Var(x) for x in "bmwk")
    a = Tensor("A", (bs, m, k))
    bt = Tensor("B", (bs, m, k), pad=((0, 0), (d * w, d * w), (0, 0)))
    return Scope([IterVar(b, 0, bs), IterVar(vm, 0, m), IterVar(vw, 0, 2 * w + 1)],
                 [IterVar(vk, 0, k)], a[b, vm, vk] * bt[b, vm + d * (vw - w), vk])


CASES: Dict[str, Case] = {
    "conv3x3": Case(conv3x3, ("matmul",), r"^matmul\[[^\]]*\] -> eop\[offset-add",
                    "matmul + offset-add"),
    "convtranspose": Case(conv_transpose, ("matmul",), r"matmul\[.*offset-add",
                          "matmul + eOps"),
    "convtranspose-lifted": Case(conv_transpose_lifted, ("matmul",),
                                 r"^(eop\[gather[^\]]*\] -> )*matmul\[.*offset-add",
                                 "matmul + eOps, from the lifted (guarded gather) form"),
    "conv5x5": Case(conv5x5, ("conv2d",), r"conv2d\[\S+ \* \d+x\d+x3x3[ \]]", "conv3x3 + eOps"),
    "g2bmm": Case(g2bmm, ("g2bmm",), r"g2bmm\[[^\]]*d=1\]", "G2BMM d=1 + layout eOps"),
}


def run_case(name: str, depth: int, quick: bool, budget: Optional[float]) -> Dict[str, object]:
    """Search one case; returns the row printed by :func:`main`.

    The search runs without its own verification (a benchmark of the search); the best program
    of the expected form is then verified here, so "found" always means found AND verified.
    """

    case = CASES[name]
    expr = case.build(quick)
    cpu0 = time.process_time()
    res = derive(expr, targets=case.targets, max_depth=depth, search_time_s=budget,
                 verify=False, max_candidates=None)
    cpu = time.process_time() - cpu0
    st = res.stats
    pattern = re.compile(case.expected)
    hit = next(((t, d, r) for t, d, r in st.found_log if pattern.search(r)), None)
    best = next((p for p in res.candidates if pattern.search(repr(p))), None)
    ok, why = (False, "not found") if best is None else verify_candidate(expr, best)
    return {
        "case": name, "found": hit is not None and ok, "verified": ok, "why": why,
        "first_s": None if hit is None else hit[0], "first_depth": None if hit is None else hit[1],
        "program": "" if best is None else repr(best),
        "states": st.states_visited, "pruned": st.states_pruned,
        "generated": st.states_generated, "search_s": st.search_time_s, "cpu_s": cpu,
        "ms_per_state": 1e3 * st.search_time_s / max(st.states_visited, 1),
        "stop": st.stop_reason.value, "candidates": st.candidates_found,
        "depth_reached": st.max_depth_reached, "phase": dict(st.phase_s),
        "guided_steps": st.guided_steps,
    }


EINNET = {  # EinNet C++ at depth 7 (OSDI'23 artifact): states, seconds, found depth, found time
    "conv3x3": ("158K", "7 s", 4, "96 ms"),
    "convtranspose": ("0.9M", "53 s", 6, "11.3 s"),
    "convtranspose-lifted": ("0.9M", "53 s", 6, "11.3 s"),
    "conv5x5": ("2.2M", "99 s", 7, "101 s"),
    "g2bmm": ("18K", "0.7 s", 4, "24 ms"),
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=7)
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument("--budget", type=float, default=120.0,
                        help="time budget per case in seconds (0: none)")
    parser.add_argument("--phases", action="store_true", help="print where the time went")
    args = parser.parse_args(argv)
    budget = args.budget or None
    print(f"# depth {args.depth}, {'quick' if args.quick else 'full'} shapes, "
          f"budget {budget or 'none'} s/case; first = time (depth) to the first candidate of "
          f"the expected form; states = visited (pruned as repeats); search = wall time of the "
          f"whole search; ms/state = its wall time per visited state; stop = why it ended")
    print(f"{'case':<14} {'found':<6} {'first':>13} {'states':>8} {'pruned':>8} "
          f"{'search':>8} {'cpu':>8} {'ms/state':>8} {'stop':<12} "
          f"{'EinNet d7: states/time/first':<30} best program")
    for name in args.cases:
        row = run_case(name, args.depth, args.quick, budget)
        first = "-" if row["first_s"] is None else (
            f"{_ms(row['first_s'])} (d{row['first_depth']})")
        ref = EINNET[name]
        einnet = f"{ref[0]}/{ref[1]}/{ref[3]} (d{ref[2]})"
        found = str(row["found"]) if row["verified"] or row["first_s"] is None else "UNVERIFIED"
        print(f"{name:<14} {found:<6} {first:>13} {row['states']:>8} {row['pruned']:>8} "
              f"{row['search_s']:>7.2f}s {row['cpu_s']:>7.2f}s {row['ms_per_state']:>8.2f} "
              f"{row['stop']:<12} {einnet:<30} {row['program']}")
        if args.phases:
            phases = ", ".join(f"{k} {v:.2f}s" for k, v in row["phase"].items())
            print(f"{'':<14} phases: {phases}; generated {row['generated']}, "
                  f"{row['candidates']} candidates ({row['guided_steps']} guided steps), "
                  f"depth reached {row['depth_reached']}")
        sys.stdout.flush()
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}ms" if seconds < 10 else f"{seconds:.1f}s"


if __name__ == "__main__":
    sys.exit(main())
