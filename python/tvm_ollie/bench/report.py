"""Benchmark results as JSON, a Markdown report and a matplotlib plot of the ratios."""

from __future__ import annotations

import json
import os
from typing import List, Optional

from .timing import Protocol


_MODES = {
    "isolated": "isolated mode (each system in its own process, one at a time)",
    "interleaved": "interleaved mode (all systems in one process)",
}


def _protocol(protocol: Optional[dict]) -> str:
    """The timing protocol of a run's config (runs before 2026-12-03 recorded none: they took
    samples of about 2 ms with no warm-up, mostly one cold call)."""
    if not protocol:
        return "samples of about 2 ms, no warm-up (the protocol before 2026-12-03)"
    return Protocol(**protocol).describe()


def _load(models: dict) -> str:
    """`` Load average ...`` over the models' starts and ends (runs before 2026-12-03 recorded
    none): a loaded machine's numbers are not a quiet machine's."""
    loads = [v for e in models.values() for v in e.get("load", [])]
    if not loads:
        return ""
    return f" Load average (1 minute) {min(loads):.2f}-{max(loads):.2f}."


def describe_peaks(peaks) -> str:
    """One line: measured peak GFLOP/s and GB/s."""
    if peaks is None:
        return "not measured (no device for the target)"
    flops, bandwidth = peaks.flops_per_s / 1e9, peaks.bytes_per_s / 1e9
    return f"{flops:.1f} GFLOP/s, {bandwidth:.1f} GB/s ({peaks.how})"


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _cell(result: dict) -> str:
    """Latency cell: the median in ms, or why there is none."""
    status = result.get("status")
    if status == "ok" and "median_s" in result:
        return _ms(result["median_s"]) + (" (once)" if result.get("timed_once") else "")
    if status == "built":
        return "built"
    return status or "-"


def model_line(name: str, entry: dict, reference: str) -> str:
    """One progress line for a finished model."""
    parts = []
    for system, result in entry["systems"].items():
        text = f"{system} {_cell(result)}"
        if result.get("ratio_to_ref") is not None and system != reference:
            text += f" ({result['ratio_to_ref']:.2f}x {reference})"
        parts.append(text)
    return f"{name}: " + ", ".join(parts) + f"  [{entry.get('wall_s', 0):.0f} s]"


def markdown(results: dict) -> str:
    """The report: latency, ratios, roofline and build-time tables, then failures."""
    cfg, models = results["config"], results["models"]
    systems, ref = cfg["systems"], cfg["reference"]
    lines = [
        "# Benchmark results",
        "",
        f"target `{cfg['target']}`, {'quick' if cfg['quick'] else 'paper'} sizes, batch "
        f"{cfg['batch']}, {cfg['threads']} threads, MetaSchedule trials per model "
        f"{cfg['trials']}, weights as {cfg.get('weights', 'params')}, "
        f"{_MODES.get(cfg.get('mode', 'interleaved'), cfg.get('mode'))}, "
        f"{_protocol(cfg.get('protocol'))}; started {cfg['started']}.",
        f"Peaks: {describe_peaks(_Peaks.of(results.get('peaks')))}.{_load(models)}",
        "",
        "## Median latency (ms)",
        "",
    ]
    lines += _table(["model"] + systems,
                    [[m] + [_cell(e["systems"].get(s, {})) for s in systems]
                     for m, e in models.items()])  # fmt: skip
    if any(r.get("timed_once") for e in models.values() for r in e["systems"].values()):
        lines += ["", f"(once): one call of at least {cfg.get('slow_call_s') or 0:g} s, timed "
                  "once after an untimed one instead of in the rounds; its ratio is the ratio "
                  "of medians, with no spread."]  # fmt: skip
    lines += ["", f"## Time relative to `{ref}`", "",
              f"Median of per-round ratios; above 1: `{ref}` is faster.", ""]  # fmt: skip
    lines += _table(["model"] + systems, [[m] + [_ratio(e["systems"].get(s, {})) for s in systems]
                                          for m, e in models.items()])  # fmt: skip
    lines += ["", "Spread: first and third quartiles of the per-round ratios (ranges that "
              "contain 1: a tie at this machine's noise).", ""]  # fmt: skip
    lines += _table(["model"] + systems, [[m] + [_spread(e["systems"].get(s, {})) for s in systems]
                                          for m, e in models.items()])  # fmt: skip
    lines += ["", "## Roofline", "",
              "GFLOP and MB from the Relax module (MB: unfused per-op traffic; min: inputs, "
              "weights and outputs once); bound = max(FLOP/peak, bytes/bandwidth); "
              "fraction = bound / median.", ""]  # fmt: skip
    rows = []
    for m, e in models.items():
        row = [m, _num(e.get("flops"), 1e9, 3), _num(e.get("bytes"), 1e6, 2),
               _num(e.get("bytes_min"), 1e6, 2), _ms(e.get("bound_s"))]  # fmt: skip
        row += [_num(e["systems"].get(s, {}).get("roofline_fraction"), 1, 3) for s in systems]
        rows.append(row)
    header = ["model", "GFLOP", "MB", "MB min", "bound ms"] + [f"{s} frac" for s in systems]
    lines += _table(header, rows)
    lines += ["", "## Build and tuning time (s)", ""]
    rows = []
    for m, e in models.items():
        row = [m]
        for s in systems:
            r = e["systems"].get(s, {})
            text = _num(r.get("compile_s"), 1, 1)
            if r.get("tune_s") is not None:
                text += f" + tune {r['tune_s']:.1f}"
                text += " (db reused)" if r.get("reused_db") else ""
            row.append(text)
        rows.append(row)
    lines += _table(["model"] + systems, rows)
    lines += _guard_lines(models)
    problems = [f"- `{m}` / `{s}`: {r.get('status')}: {r.get('reason', '')}"
                for m, e in models.items() for s, r in e["systems"].items()
                if r.get("status") not in ("ok", "built")]  # fmt: skip
    if problems:
        lines += ["", "## Not measured", ""] + problems
    return "\n".join(lines) + "\n"


def _guard_lines(models: dict) -> List[str]:
    """The never-worse guards' choices and their timing of the kept plan beside the fresh one
    (``guard_vs_fresh``, :func:`tvm_ollie.bench.harness.guard_agreement`); none: no lines."""
    rows = []
    for m, e in models.items():
        for s, r in e["systems"].items():
            for key in ("model_guard", "plans"):
                guard = r.get(key)
                if isinstance(guard, dict):
                    ratio = (r.get("guard_vs_fresh") or {}).get(key)
                    rows.append([m, s, "whole model" if key == "model_guard" else "joint",
                                 str(guard.get("winner") or "-"), _ms(guard.get("kept_s")),
                                 _ms(r.get("median_s")),
                                 "-" if ratio is None else f"{ratio:.2f}"])
    if not rows:
        return []
    return ["", "## Never-worse guards", "",
            "The plan each guard kept, its timing by the guard (ms) and the benchmark's fresh "
            "timing of the finished executable; a ratio far from 1: the guard decided on other "
            "conditions.", ""] + _table(["model", "system", "guard", "kept", "guard ms",
                                        "fresh ms", "guard/fresh"], rows)


class _Peaks:  # pylint: disable=too-few-public-methods
    """Adapter so :func:`describe_peaks` also reads the JSON dict form."""

    def __init__(self, d):
        self.flops_per_s, self.bytes_per_s, self.how = d["flops_per_s"], d["bytes_per_s"], d["how"]

    @classmethod
    def of(cls, d):
        return None if d is None else cls(d)


def _ratio(result: dict) -> str:
    value = result.get("ratio_to_ref")
    return "-" if value is None else f"{value:.2f}"


def _spread(result: dict) -> str:
    value = result.get("ratio_quartiles")
    return "-" if not value else f"{value[0]:.2f}-{value[1]:.2f}"


def _num(value, unit: float, digits: int) -> str:
    return "-" if value is None else f"{value / unit:.{digits}f}"


def _table(header: List[str], rows: List[List[str]]) -> List[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return out


def write_results(results: dict, out_dir: str) -> None:
    """Write ``results.json`` and ``results.md`` into ``out_dir``."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, default=str)
    with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
        f.write(markdown(results))


def plot_ratios(results: dict, path: str) -> Optional[str]:
    """Grouped bars of each system's time relative to the reference, per model (log scale).

    Returns a note instead of plotting when matplotlib is missing or nothing was measured.
    """
    try:
        # lazy: matplotlib is a heavy, optional dependency
        import matplotlib  # pylint: disable=import-outside-toplevel

        matplotlib.use("Agg")
        # lazy: matplotlib is a heavy, optional dependency
        from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
    except ImportError:
        return "matplotlib is not installed: no plot"
    cfg, models = results["config"], results["models"]
    systems = [s for s in cfg["systems"] if s != cfg["reference"]]  # the reference is the 1.0 line
    names = [m for m, e in models.items()
             if any(r.get("ratio_to_ref") for r in e["systems"].values())]  # fmt: skip
    if not names:
        return "no ratios measured: no plot"
    width = 0.8 / max(1, len(systems))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(names) + 2), 4.5))
    for i, system in enumerate(systems):
        values = [models[m]["systems"].get(system, {}).get("ratio_to_ref") or 0.0 for m in names]
        xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, values, width, label=system)
    ax.axhline(1.0, color="black", linewidth=0.8, label=cfg["reference"])
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel(f"time / time of {cfg['reference']} (lower is better)")
    size = "quick" if cfg["quick"] else "paper"
    ax.set_title(f"{cfg['target']}, {size} sizes, batch {cfg['batch']}, trials {cfg['trials']}")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
