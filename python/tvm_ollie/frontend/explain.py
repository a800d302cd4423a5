"""Readable text of an optimization report: what was chosen for each operator, and why.

Used by ``tvm-ollie explain``, ``compile`` and ``demo``. Reads only the documented fields of
``tvm_ollie.transform.Decision`` (function, var_name, op_name, signature, chosen, reason,
explain, before_s, after_s, measured, candidates; contents and expression of a region) and of
the guards' reports (``tvm_ollie.pipeline.guard.GuardReport``: winner, times(), notes).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from .loader import iter_op_calls


def format_time(seconds: Optional[float]) -> str:
    """``0.00123`` -> ``"1.230 ms"``; ``None`` -> ``"-"``."""
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.1f} us"
    return f"{seconds * 1e9:.1f} ns"


def speedup(before_s: Optional[float], after_s: Optional[float]) -> Optional[float]:
    """``before / after``, or ``None`` when either is unknown or zero."""
    if not before_s or not after_s:
        return None
    return before_s / after_s


def decision_table(decisions: Sequence[Any]) -> str:
    """One row per operator: binding, op, times before/after, speedup, chosen program."""
    header = ["#", "binding", "operator", "before", "after", "speedup", "chosen"]
    rows = [header]
    estimated = False
    for index, dec in enumerate(decisions, 1):
        measured = bool(getattr(dec, "measured", False))
        mark = "" if measured else "*"
        before, after = getattr(dec, "before_s", None), getattr(dec, "after_s", None)
        estimated |= not measured and (before is not None or after is not None)
        ratio = speedup(before, after)
        rows.append([
            str(index),
            f"{getattr(dec, 'function', '?')}/{getattr(dec, 'var_name', '?')}",
            str(getattr(dec, "op_name", "?")),
            format_time(before) + (mark if before is not None else ""),
            format_time(after) + (mark if after is not None else ""),
            "-" if ratio is None else f"{ratio:.2f}x",
            _short(str(getattr(dec, "chosen", "original")), 60),
        ])  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)] + [row[-1]]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * len(header[-1]))
    if estimated:
        lines.append("* estimated by the cost model (not measured)")
    return "\n".join(lines)


def decision_details(decisions: Sequence[Any]) -> str:
    """Per operator: its signature, the chosen program in full, the rule path and the reason."""
    blocks: List[str] = []
    for index, dec in enumerate(decisions, 1):
        lines = [
            f"[{index}] {getattr(dec, 'function', '?')}/{getattr(dec, 'var_name', '?')} = "
            f"{getattr(dec, 'op_name', '?')}"
        ]
        signature = getattr(dec, "signature", None)
        if signature:
            lines.append(f"    signature:  {signature}")
        lines.append(f"    chosen:     {getattr(dec, 'chosen', 'original')}")
        explain = str(getattr(dec, "explain", "") or "").strip()
        if explain:
            rule_lines = explain.splitlines()
            lines.append(f"    rule path:  {rule_lines[0]}")
            lines.extend(f"                {line}" for line in rule_lines[1:])
        else:
            lines.append("    rule path:  (none: the original operator is kept)")
        candidates = getattr(dec, "candidates", None)
        if candidates is not None:
            count = candidates if isinstance(candidates, int) else len(candidates)
            lines.append(f"    candidates: {count}")
        before, after = getattr(dec, "before_s", None), getattr(dec, "after_s", None)
        how = "measured" if getattr(dec, "measured", False) else "estimated"
        if before is not None or after is not None:
            lines.append(f"    time:       {format_time(before)} -> {format_time(after)} ({how})")
        reason = getattr(dec, "reason", "")
        if reason:
            lines.append(f"    reason:     {reason}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def region_lines(regions: Sequence[Any]) -> str:
    """Per region (several calls decided as a whole): what it contained, the expression it
    lifted into, and what it became (fields of ``tvm_ollie.transform.Decision``)."""
    blocks: List[str] = []
    for index, reg in enumerate(regions, 1):
        chosen = str(getattr(reg, "chosen", "original"))
        kept = chosen == "original"
        before, after = getattr(reg, "before_s", None), getattr(reg, "after_s", None)
        how = "measured" if getattr(reg, "measured", False) else "estimated"
        lines = [
            f"[R{index}] {getattr(reg, 'function', '?')}/{getattr(reg, 'var_name', '?')}: "
            f"{getattr(reg, 'contents', '')}",
            f"    lifted:     {getattr(reg, 'expression', '')}",
            f"    became:     {'original (kept)' if kept else chosen}",
            f"    time:       {format_time(before)} -> {format_time(after)} ({how})",
        ]
        reason = getattr(reg, "reason", "")
        if reason:
            lines.append(f"    reason:     {reason}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def summary_line(decisions: Sequence[Any]) -> str:
    """``"3 derivable operators, 2 rewritten"``."""
    rewritten = sum(1 for d in decisions if str(getattr(d, "chosen", "original")) != "original")
    plural = "s" if len(decisions) != 1 else ""
    return f"{len(decisions)} derivable operator{plural}, {rewritten} rewritten"


def guard_line(report: Any) -> str:
    """What the never-worse guard of the build kept, with its timings: ``"whole-model guard:
    kept rewritten (rewritten 0.812 ms, original 1.020 ms)"``, with ``"; verdict read back
    from work_dir/ollie_decisions.json"`` when an earlier build's verdict was reused (nothing
    timed); ``""`` when no guard ran.

    The whole-model guard (``report.model_guard``) times the rewritten module against TVM's
    build of the original, the joint build's guard (``report.plans``) its plans; either way
    the compile summary says which build the library holds, since the decisions alone (each
    unit timed apart) do not."""
    for name, guard in (("whole-model guard", getattr(report, "model_guard", None)),
                        ("never-worse guard", getattr(report, "plans", None))):
        if guard is None or not getattr(guard, "winner", ""):
            continue
        times = ", ".join(f"{plan} {format_time(sec)}" for plan, sec in guard.times().items())
        notes = list(getattr(guard, "notes", []))
        dropped = [f"{p.name} {p.dropped}" for p in getattr(guard, "plans", []) or []
                   if getattr(p, "dropped", "")]  # (e.g. the original not built: hopeless)
        detail = times or (dropped or notes or ["not timed"])[0]
        read = next((n for n in notes if n.startswith("verdict read back from ")), None)
        if read is not None:  # (where from: the work dir or the per-machine cache)
            detail += "; " + read.split(" (", 1)[0]
        return f"{name}: kept {guard.winner} ({detail})"
    return ""


def chosen_lines(decisions: Sequence[Any]) -> str:
    """One line per operator with the full chosen program (the table shortens it)."""
    return "\n".join(
        f"[{i}] {getattr(d, 'op_name', '?')}: {getattr(d, 'chosen', 'original')}"
        for i, d in enumerate(decisions, 1)
    )


def other_operators(mod: Any, decisions: Sequence[Any]) -> str:
    """The operators of ``mod`` that have no decision, with counts: ``"relax.add x2, ..."``."""

    decided = {(getattr(d, "function", ""), getattr(d, "var_name", "")) for d in decisions}
    counts: dict = {}
    for func, var, call in iter_op_calls(mod):
        if (func, str(var.name)) not in decided:
            counts[call.op.name] = counts.get(call.op.name, 0) + 1
    return ", ".join(f"{name} x{count}" for name, count in sorted(counts.items()))


def _short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."
