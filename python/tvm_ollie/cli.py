"""The ``tvm-ollie`` command line (the replacement for TVM's retired ``tvmc``).

* ``tvm-ollie compile MODEL -t TARGET -o OUT.so``: optimize and build a model into a library
  that ``tvm.runtime.load_module`` loads and the Relax VM runs (weights inside);
* ``tvm-ollie run OUT.so --input NAME=FILE.npy ...``: run a compiled library and time it;
* ``tvm-ollie explain MODEL -t TARGET``: what the optimizer chose for each operator, and why;
* ``tvm-ollie profile MODEL``: every call of one inference timed, by kind and by kernel, beside
  ONNX Runtime's own per-node profile for ONNX models (:mod:`tvm_ollie.profiler`);
* ``tvm-ollie demo``: optimize a small built-in model, check it against TVM, report the speedup;
* ``tvm-ollie roundtrip``: lift a conv2d to an expression, lower it back, build and check it;
* ``tvm-ollie lift MODEL``: print the expression of every liftable operator;
* ``tvm-ollie bench ...``: the benchmark (same options as ``python -m tvm_ollie.bench``);
* ``tvm-ollie bundle --target cuda --out DIR``: compiled zoo models, the TVM runtime and a
  runner in one folder, for a GPU machine without TVM (``sh DIR/run.sh`` there); with
  ``--candidates`` also the alternatives the pass weighs, timed there, and ``tvm-ollie
  bundle-results DIR --work-dir D`` reads them back for ``--systems measured``.

``compile`` and ``explain`` measure on remote devices with ``--rpc-tracker HOST:PORT --rpc-key
KEY [--rpc-workers N]`` (TVM's ``python -m tvm.exec.rpc_tracker`` and ``rpc_server``).

MODEL is an ONNX file, a Relax module saved with ``tvm.ir.save_json`` (.json), or
``file.py:function`` returning an IRModule (or an ``(IRModule, params)`` pair).

User errors (bad file, target, input, option) are one line on stderr and exit status 2; other
failures are one line and status 1; Ctrl-C prints "interrupted" and exits with 130. ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import types
import warnings
from typing import Iterator, List, NoReturn, Optional

import numpy as np

from . import transform
from .bench.__main__ import build_parser as bench_parser, run_from_args
from .bundle import BundleSizeError, build_bundle, case_names
from .bundle.results import import_results
from .bundle.sizes import MIB
from .compat import tvm
from .compile_profile import profile_scope, stage
from .config import ConfigError, DEFAULTS, OllieConfig
from .demo import print_lifted_ops, run_demo, run_roundtrip
from .frontend.errors import FrontendError, first_line
from .frontend.explain import (decision_details, decision_table, format_time, guard_line,
                               other_operators, region_lines, summary_line)
from .frontend.inputs import (arrange_inputs, load_signature, module_signature, read_input_files,
                              save_signature, signature_path)
from .frontend.loader import load_module
from .frontend.onnx_native import unrolled_layers
from .frontend.progress import Stages
from .frontend.runner import ModelRunner, load_library, pick_device
from .frontend.targets import is_gpu, parse_target
from .pipeline import build
from .profiler import profile_model
from .tune.machine import sleeping_pool
from .tune.rpc import RPCConfig
from .tune.workdir import prepare_work_dir, work_dir_lock

#: Exit status of user errors (bad input) and of other failures.
EXIT_USER_ERROR = 2
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """An error caused by the command's input (bad file, bad option): reported in one line."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (usage is left to ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def _compile(args: argparse.Namespace) -> int:
    sleeping_pool()  # this process times decisions and never runs the model it writes
    target = _target(args.target)
    config = _config(args, target, orchestrate=args.orchestrate, dtype=args.dtype,
                     model_guard=False if args.no_model_guard else None,
                     blocked_layout=not args.no_blocked_layout,
                     library_plan=not args.no_library_plan,
                     pack_weights=not args.no_pack_weights,
                     cached_alloc=args.cached_alloc)
    out = args.output or os.path.splitext(os.path.basename(args.model.split(":")[0]))[0] + ".so"
    with _Output(out) as tmp_out, profile_scope(), Stages(
            ["loading model", "optimizing and building", "exporting"]) as stages:
        mod = _load(args)
        stages.next()
        ex, report = build(mod, config=config)
        stages.next()
        ex.export_library(tmp_out.path)
        tmp_out.commit(save_signature(tmp_out.path, module_signature(mod)))
    size_kb = os.path.getsize(out) / 1024
    print(f"wrote {out} ({size_kb:.0f} KB) for {target.kind.name}: "
          f"{summary_line(list(report.decisions))}; search {_secs(report, 'search_s')}, "
          f"tuning {_secs(report, 'tuning_s')}{_trials(report)} "
          "(details: tvm-ollie explain)")  # fmt: skip
    guard = guard_line(report)
    if guard:
        print(guard)
    if args.explain:
        print(report.to_text())
    if is_gpu(target) and not tvm.cuda(0).exist:
        print("note: no GPU here; the library holds CUDA source, compiled when it is loaded on a "
              "machine with a GPU")  # fmt: skip
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.repeat < 0:
        raise UserError("--repeat must be >= 0")
    if args.output and not args.output.endswith((".npz", ".npy")):
        raise UserError(f"--output {args.output}: expected a .npz (or, for one output, .npy) file")
    if args.output:
        _check_writable(args.output)
    given = read_input_files(args.input)
    lib = load_library(args.library)
    runner = ModelRunner(lib, pick_device(lib, args.device))
    arrays, notes = arrange_inputs(
        runner.param_names(), given, load_signature(args.library), random=args.random_inputs,
        seed=args.seed,
    )
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    outputs = runner.run(arrays)
    for index, value in enumerate(outputs):
        print(f"output {index}: {_describe_array(value)}")
    if args.output:
        _save_outputs(args.output, outputs)
        print(f"wrote {args.output}")
    if args.repeat:
        latency_s = runner.median_latency_ms(arrays, args.repeat) / 1e3
        print(f"latency: {format_time(latency_s)} (median of {args.repeat}, {runner.dev})")
    return 0


def _explain(args: argparse.Namespace) -> int:
    target = _target(args.target)
    config = _config(args, target)
    with profile_scope() as prof, Stages(["loading model", "optimizing"]) as stages:
        mod = _load(args)
        stages.next()
        with work_dir_lock(args.work_dir):
            prepare_work_dir(args.work_dir)
            _, report = _transform().optimize_module(mod, config=config)
    decisions = list(report.decisions)
    print(f"{args.model} for {target.kind.name}: {summary_line(decisions)}; search "
          f"{_secs(report, 'search_s')}, tuning {_secs(report, 'tuning_s')}"
          f"{_trials(report)}")  # fmt: skip
    budget = getattr(report, "budget", None)
    if budget is not None and budget.total:
        print(budget.to_text())
    if decisions:
        print()
        print(decision_table(decisions))
    others = other_operators(mod, decisions)
    if others:
        print(f"\nnot derivable, kept as they are: {others}")
    if decisions:
        print()
        print(decision_details(decisions))
    regions = list(getattr(report, "regions", []))
    if regions:
        done = sum(1 for r in regions if r.rewritten)
        print(f"\nregions: {len(regions)}, {done} rewritten")
        print(region_lines(regions))
    print(f"\nderivations: {report.derivations_text()}")
    print(prof.to_text())
    return 0


def _profile(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UserError("--runs must be >= 1")
    if args.trace:
        _check_writable(args.trace)
    target = _target(args.target)
    # a zoo model is exported by the profiler; a file is loaded here, with one-line errors
    module = None if args.model.startswith("zoo:") else _load(args)
    result = profile_model(args.model, module=module, shapes=args.shape, target=target,
                           runs=args.runs, baseline=args.baseline,
                           onnxruntime=False if args.no_ort else None, seed=args.seed,
                           stat=args.stat, config=_config(args, target))
    print(result.to_text(names=None if args.names == 0 else args.names), end="")
    if args.trace:
        result.write_chrome_trace(args.trace)
        print(f"wrote {args.trace} (chrome://tracing or https://ui.perfetto.dev)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    parse_target(args.target)  # fail on a bad target before building anything
    if args.channels < 1 or args.size < 2:
        raise UserError("--channels must be >= 1 and --size >= 2")
    ok = run_demo(
        channels=args.channels, size=args.size, target=args.target,
        repeat=max(1, args.repeat), explain=args.explain, out=sys.stdout,
        config=_config(args, None),
    )
    return 0 if ok else EXIT_FAILURE


def _roundtrip(args: argparse.Namespace) -> int:
    ok = run_roundtrip(
        batch=args.batch, channels=args.channels, size=args.size, filters=args.filters,
        out=sys.stdout,
    )
    return 0 if ok else EXIT_FAILURE


def _lift(args: argparse.Namespace) -> int:
    print_lifted_ops(_load(args), out=sys.stdout)
    return 0


def _bench(args: argparse.Namespace) -> int:
    return run_from_args(args, restart_argv=args.restart_argv)


def _bundle(args: argparse.Namespace) -> int:
    if args.list_models:
        print("\n".join(case_names()))
        return 0
    if not args.out:
        raise UserError("--out DIR is required")
    known = case_names()
    unknown = [m for m in args.models or () if m not in known]
    if unknown:
        raise UserError(f"unknown models {unknown} (see tvm-ollie bundle --list-models)")
    if args.trials > 0 and not args.work_dir:
        raise UserError("--trials needs --work-dir (the records of an earlier GPU run)")
    opts = {"library": False} if args.no_library else {}
    try:
        res = build_bundle(args.out, args.target, args.models or None, trials=args.trials,
                           work_dir=args.work_dir, limit=int(args.max_mib * MIB),
                           carry=args.carry_lib, ollie_options=opts,
                           systems=tuple(args.systems.split(",")), candidates=args.candidates,
                           cuda_library=args.cuda_library)
    except BundleSizeError as err:
        print(f"tvm-ollie: error: {err}", file=sys.stderr)
        return EXIT_FAILURE
    print(f"{res.out}: {res.total_bytes / MIB:.1f} MiB, {len(res.build_s)} models; run it "
          f"with: sh {os.path.join(res.out, 'run.sh')}")
    for case, system, why in res.failures:
        print(f"not built: {case} {system}: {why}", file=sys.stderr)
    return EXIT_FAILURE if res.failures else 0


def _bundle_results(args: argparse.Namespace) -> int:
    if not os.path.isfile(os.path.join(args.bundle, "results.txt")):
        raise UserError(f"{args.bundle} holds no results.txt (run sh run.sh there first)")
    res = import_results(args.bundle, args.work_dir, args.device, args.arch, args.calibration,
                         not args.no_calibration, args.record)
    for case, n in sorted(res.records.items()):
        print(f"{case}: {n} candidate timings -> {args.work_dir}")
    if res.calibration is not None:
        eff = ", ".join(f"{k} {v:.3g}" for k, v in sorted(res.calibration.efficiency.items()))
        print(f"calibration ({res.calibration.bandwidth * 1e-9:.0f} GB/s, "
              f"{res.calibration.launch_s * 1e6:.1f} us a kernel): {eff}"
              + (f" -> {res.calibration_path}" if res.calibration_path else ""))
    for what in res.mismatches:
        print(f"failed or differed on the device: {what}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


class _Output:
    """The library that ``compile`` writes, written under a temporary name beside it and renamed
    at the end: an error or Ctrl-C never leaves a partial library behind.

    :attr:`path` is the temporary path to export to (same extension, so that
    ``export_library`` picks the same format); :meth:`commit` renames it (and its signature).
    """

    def __init__(self, out: str):
        self.out = out
        folder = os.path.dirname(os.path.abspath(out))
        if not os.path.isdir(folder):
            raise UserError(f"output directory does not exist: {folder}")
        if os.path.isdir(out):
            raise UserError(f"cannot write {out}: it is a directory")
        self.path = _temp_beside(out)

        self._temps = [self.path, signature_path(self.path)]
        self._final = [out, signature_path(out)]

    def __enter__(self) -> "_Output":
        _CLEANUP.extend(self._temps)
        try:  # fail now, not after minutes of tuning, when the folder is not writable
            with open(self.path, "wb"):
                pass
        except OSError as err:
            self.__exit__()
            raise UserError(f"cannot write {self.out}: {err.strerror or err}") from err
        return self

    def commit(self, signature_tmp: str) -> None:
        """Move the exported library and its signature file (written to ``signature_tmp``, the
        signature path of :attr:`path`) into place."""
        assert signature_tmp == self._temps[1]
        os.replace(signature_tmp, self._final[1])
        os.replace(self.path, self.out)

    def __exit__(self, *exc) -> None:
        for path in self._temps:
            if path in _CLEANUP:
                _CLEANUP.remove(path)
            if os.path.exists(path):
                os.unlink(path)


#: Temporary files to delete if Ctrl-C ends the process at once (see :class:`_SigintFlag`).
_CLEANUP: List[str] = []


def _target(text: str):
    target, note = parse_target(text)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return target


def _load(args: argparse.Namespace):
    # The native whole-layer kernels (an LSTM in one call) are CPU code: a model built for a
    # GPU keeps its recurrent layers unrolled into operators the GPU kernels serve.
    gpu = bool(getattr(args, "target", None)) and is_gpu(parse_target(args.target)[0])
    with stage("import"), (unrolled_layers() if gpu else contextlib.nullcontext()):
        mod = load_module(args.model, shapes=args.shape)
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UserError(f"{args.model}: the module has no 'main' function")
    return mod


def _transform():
    """``tvm_ollie.transform``, imported when a command needs it (it imports MetaSchedule)."""

    return transform


def _config(args: argparse.Namespace, target, **fields):
    """The one :class:`~tvm_ollie.config.OllieConfig` of the command's flags."""

    if args.trials < 0 or args.max_depth < 0 or args.search_time <= 0:
        raise UserError("--trials and --max-depth must be >= 0 and --search-time > 0")
    if args.max_states is not None and args.max_states < 1:
        raise UserError("--max-states must be >= 1")
    try:
        return OllieConfig(
            target=target, trials=args.trials, work_dir=args.work_dir,
            max_depth=args.max_depth, search_time_s=args.search_time,
            max_states=args.max_states if args.max_states is not None else
            DEFAULTS.max_states, library=False if args.no_library else None,
            derive=not args.no_derive, rpc=_rpc_config(args),
            derivation_cache=not getattr(args, "no_derivation_cache", False), **fields)
    except ConfigError as err:
        raise UserError(str(err)) from None


def _trials(report) -> str:
    """``, trials S/N`` when the command had a trial budget."""
    budget = getattr(report, "budget", None)
    if budget is None or not budget.total:
        return ""
    return f", trials {budget.spent}/{budget.total}"


def _rpc_config(args: argparse.Namespace):
    """The :class:`~tvm_ollie.tune.rpc.RPCConfig` of ``--rpc-*`` (None without a tracker)."""
    tracker = getattr(args, "rpc_tracker", None)
    key = getattr(args, "rpc_key", None)
    workers = getattr(args, "rpc_workers", None)
    if tracker is None:
        if key is not None or workers is not None:
            raise UserError("--rpc-key and --rpc-workers need --rpc-tracker HOST:PORT")
        return None
    if not key:
        raise UserError("--rpc-tracker needs --rpc-key KEY (the key the RPC servers registered)")
    if workers is not None and workers < 1:
        raise UserError("--rpc-workers must be >= 1")

    try:
        config = RPCConfig.from_address(tracker, key, workers=workers or 1)
    except ValueError as err:
        raise UserError(str(err)) from None
    config.check()  # an unreachable tracker or unknown key: one line before any loading
    return config


def _secs(report, field: str) -> str:
    value = getattr(report, field, None)
    return "-" if value is None else f"{value:.1f} s"


def _temp_beside(path: str) -> str:
    """A temporary name beside ``path`` with the same extension."""
    base, ext = os.path.splitext(os.path.basename(path))
    return os.path.join(os.path.dirname(os.path.abspath(path)), f".{base}.{os.getpid()}.tmp{ext}")


def _check_writable(path: str) -> None:
    """Fail now, not after the work, when ``path`` cannot be written."""
    if os.path.isdir(path):
        raise UserError(f"cannot write {path}: it is a directory")
    tmp = _temp_beside(path)
    try:
        with open(tmp, "wb"):
            pass
        os.unlink(tmp)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}") from err


def _save_outputs(path: str, outputs) -> None:
    """``.npz`` with ``output_0``, ``output_1``...; ``.npy`` for a single output."""

    if path.endswith(".npy") and len(outputs) != 1:
        raise UserError(f"main has {len(outputs)} outputs: save them with --output FILE.npz")
    tmp = _temp_beside(path)
    ext = os.path.splitext(path)[1]
    _CLEANUP.append(tmp)
    try:
        if ext == ".npy":
            np.save(tmp, outputs[0])
        else:
            np.savez(tmp, **{f"output_{i}": v for i, v in enumerate(outputs)})
        os.replace(tmp, path)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}") from err
    finally:
        _CLEANUP.remove(tmp)
        if os.path.exists(tmp):
            os.unlink(tmp)


def _describe_array(value) -> str:
    text = f"{value.dtype}{list(value.shape)}"
    if value.size and np.issubdtype(value.dtype, np.number):
        data = value.astype("float64")
        text += (f" min {data.min():.6g} max {data.max():.6g} mean {data.mean():.6g} "
                 f"std {data.std():.6g}")  # fmt: skip
    return text


# ---------------------------------------------------------------------------------------------
# Parser
# ---------------------------------------------------------------------------------------------


def _add_model_options(parser: argparse.ArgumentParser, target: bool = True) -> None:
    parser.add_argument("model", help="an ONNX file, a saved Relax module (.json) or file.py:func")
    parser.add_argument(
        "--shape", action="append", default=[], metavar="NAME=D1,D2,...",
        help="input shape for ONNX models with dynamic dimensions (repeatable); shape "
        "computations are then folded to constants before import",
    )
    if target:
        parser.add_argument(
            "-t", "--target", default="llvm",
            help="llvm, cuda, a tag such as nvidia/nvidia-h100, or a JSON dict such as "
            '\'{"kind": "llvm", "num-cores": 4}\' (default: llvm)',
        )


class _DeprecatedFlag(argparse.Action):
    """A flag's former name: stores into the new flag's destination and says it is
    deprecated (on stderr, and as a :class:`DeprecationWarning`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        new = "--" + self.dest.replace("_", "-")
        message = f"{option_string} is deprecated; use {new}"
        print(f"warning: {message}", file=sys.stderr)
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        setattr(namespace, self.dest, values)


def _add_search_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trials", type=int, default=DEFAULTS.trials,
                        help="MetaSchedule trials for the whole model, shared by its kernels "
                        "by expected gain (0: no tuning, the cost model decides)")
    parser.add_argument("--work-dir", help="tuning database directory (reused across runs)")
    parser.add_argument("--max-depth", type=int, default=DEFAULTS.max_depth,
                        help=f"derivation search depth (default: {DEFAULTS.max_depth})")
    parser.add_argument("--search-time", type=float, default=DEFAULTS.search_time_s,
                        metavar="SECONDS",
                        help="derivation search time for the whole model, shared by its "
                        f"operators (default: {DEFAULTS.search_time_s:g})")
    # the flag's former name, kept for one release (hidden; warns)
    parser.add_argument("--time-budget", type=float, dest="search_time", metavar="SECONDS",
                        action=_DeprecatedFlag, help=argparse.SUPPRESS)
    parser.add_argument("--max-states", type=int, metavar="N",
                        help="derivation states visited per operator signature (default: "
                        f"{DEFAULTS.max_states})")
    parser.add_argument("--no-library", action="store_true",
                        help="TVM-built kernels only (no native library kernels)")
    parser.add_argument("--no-derive", action="store_true",
                        help="no derived programs (only the operators' implementations compete)")
    parser.add_argument("--no-derivation-cache", action="store_true",
                        help="search, check and time every operator signature again "
                             "(default: reuse the derivations and verdicts cached in "
                             "--work-dir and in $TVM_OLLIE_CACHE_DIR, ~/.cache/tvm_ollie, and "
                             "this machine's calibration, timings and decisions kept there; "
                             "TVM_OLLIE_REMEASURE=1 measures and decides again)")


def _add_rpc_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "remote measurement", "measure on devices behind TVM's RPC tracker (builds stay here)")
    group.add_argument("--rpc-tracker", metavar="HOST:PORT",
                       help="address of python -m tvm.exec.rpc_tracker")
    group.add_argument("--rpc-key", metavar="KEY",
                       help="device key the RPC servers registered with (rpc_server --key)")
    group.add_argument("--rpc-workers", type=int, metavar="N",
                       help="measurements at once, each on its own device (default: 1)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``tvm-ollie`` (exposed for tests and documentation)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks of errors")  # fmt: skip
    parser = _Parser(
        prog="tvm-ollie",
        description="Derivation-based tensor-program optimizer for Apache TVM (Relax).",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cmd = sub.add_parser("compile", parents=[common], help="optimize and build a model into a .so")
    _add_model_options(cmd)
    _add_search_options(cmd)
    _add_rpc_options(cmd)
    cmd.add_argument("-o", "--output", metavar="OUT.so",
                     help="library to write (default: MODEL's name with .so, here)")
    cmd.add_argument("--orchestrate", action="store_true",
                     help="fission composite operators and choose the kernels by binary linear "
                          "programming instead of TVM's greedy fusion (with --trials, the "
                          "chosen kernels are tuned)")
    cmd.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                     help="float16: convert the model with TVM's ToMixedPrecision (float16 "
                          "operators, convolutions and matmuls accumulating in float32) before "
                          "optimizing; the library still takes and returns the model's own "
                          "types, so `run` is called with the same inputs (default: float32)")
    cmd.add_argument("--no-model-guard", action="store_true",
                     help="do not build the model as given too and time it against the "
                          "rewritten one (the whole-model guard keeps the rewrite only when it "
                          "is measurably faster; on by default where the target runs here)")
    cmd.add_argument("--no-blocked-layout", action="store_true",
                     help="every native convolution takes and returns NCHW (default: chains of "
                          "them keep the activation format oneDNN prefers, docs/layouts.md)")
    cmd.add_argument("--no-pack-weights", action="store_true",
                     help="keep the constant weights of those chains as given (default: packed "
                          "into oneDNN's format at compile time, docs/layouts.md)")
    cmd.add_argument("--no-library-plan", action="store_true",
                     help="the whole-model guard does not also time the library plan (every "
                          "operator the library has on its kernel, blocked layouts)")
    cmd.add_argument("--cached-alloc", dest="cached_alloc", action="store_true", default=True,
                     help="CPU: allocate the intermediate tensors once per loaded model and "
                          "reuse them at every call (the default; docs/per-call.md)")
    cmd.add_argument("--no-cached-alloc", dest="cached_alloc", action="store_false",
                     help="CPU: allocate and free the intermediate tensors at every call, as "
                          "TVM's VM does (--no-library implies it: the cache is a builtin of "
                          "the native library)")
    cmd.add_argument("--explain", action="store_true",
                     help="also print the optimizer's report: each decision, the derivations "
                          "cached or searched and the compile time per stage")
    cmd.set_defaults(func=_compile)

    cmd = sub.add_parser("run", parents=[common], help="run a compiled library")
    cmd.add_argument("library", help="a library written by tvm-ollie compile")
    cmd.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input of main (repeatable)")
    cmd.add_argument("--random-inputs", action="store_true",
                     help="seeded random values for the inputs not given")
    cmd.add_argument("--seed", type=int, default=0, help="seed of --random-inputs")
    cmd.add_argument("--output", metavar="OUT.npz", help="save the outputs (.npz, or .npy)")
    cmd.add_argument("--repeat", type=int, default=10,
                     help="timed runs for the median latency (0: no timing)")
    cmd.add_argument("--device", choices=("cpu", "cuda"),
                     help="device (default: the one the library's kernels are for)")
    cmd.set_defaults(func=_run)

    cmd = sub.add_parser("explain", parents=[common],
                         help="show what the optimizer chose for each operator, and why")
    _add_model_options(cmd)
    _add_search_options(cmd)
    _add_rpc_options(cmd)
    cmd.set_defaults(func=_explain)

    cmd = sub.add_parser("profile", parents=[common],
                         help="time every kernel call of a model, beside ONNX Runtime's nodes")
    _add_model_options(cmd)
    _add_search_options(cmd)
    cmd.add_argument("--runs", type=int, default=10,
                     help="profiled runs, and as many timed without the profiler (default: 10)")
    cmd.add_argument("--baseline", action="store_true",
                     help="also profile TVM alone (its default pipeline, untuned)")
    cmd.add_argument("--no-ort", action="store_true",
                     help="skip ONNX Runtime's profile of an ONNX model")
    cmd.add_argument("--trace", metavar="OUT.json",
                     help="write a Chrome trace of one run (chrome://tracing, Perfetto)")
    cmd.add_argument("--names", type=int, default=25, metavar="N",
                     help="rows of the by-name tables (0: all; default: 25)")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    cmd.add_argument("--stat", choices=("median", "min"), default="median",
                     help="each call's time over the runs: median, or min (the undisturbed "
                          "cost on a machine shared with other work) (default: median)")
    cmd.set_defaults(func=_profile)

    cmd = sub.add_parser("demo", parents=[common],
                         help="optimize a small built-in model, check it, report the speedup")
    cmd.add_argument("--channels", type=int, default=16)
    cmd.add_argument("--size", type=int, default=32, help="input height and width")
    cmd.add_argument("-t", "--target", default="llvm", help="target (default: llvm)")
    cmd.add_argument("--repeat", type=int, default=20, help="timed runs per build")
    cmd.add_argument("--explain", action="store_true",
                     help="also print each operator's rule path (as tvm-ollie explain does)")
    _add_search_options(cmd)
    cmd.set_defaults(func=_demo)

    cmd = sub.add_parser("roundtrip", parents=[common],
                         help="lift a conv2d, lower it back, build and check it")
    cmd.add_argument("--batch", type=int, default=1)
    cmd.add_argument("--channels", type=int, default=64)
    cmd.add_argument("--size", type=int, default=14, help="input height and width")
    cmd.add_argument("--filters", type=int, default=64)
    cmd.set_defaults(func=_roundtrip)

    cmd = sub.add_parser("lift", parents=[common],
                         help="print the expression of every liftable operator")
    _add_model_options(cmd, target=False)
    cmd.set_defaults(func=_lift)

    cmd = sub.add_parser("bench", parents=[common],
                         help="benchmark against other systems (see tvm-ollie bench --help)")

    bench_parser(cmd)
    cmd.set_defaults(func=_bench)

    cmd = sub.add_parser("bundle", parents=[common],
                         help="compiled models + TVM runtime + runner, for a device without TVM")
    cmd.add_argument("--target", choices=("cuda", "llvm"), default="cuda",
                     help="cuda (sm_90, the H200) or llvm (this CPU: a local check) "
                          "(default: cuda)")
    cmd.add_argument("--out", metavar="DIR", help="the bundle folder (replaced if a bundle)")
    cmd.add_argument("--models", nargs="+", metavar="NAME",
                     help="zoo models (quick sizes), conv3x3_512, convtranspose (default: all)")
    cmd.add_argument("--list-models", action="store_true", help="print the model names")
    cmd.add_argument("--systems", default="tvm,ollie",
                     help="comma-separated: tvm (TVM alone), ollie, measured (ollie deciding by "
                          "the device timings under --work-dir), library (ollie with the CUDA "
                          "library's kernels, cuda only) (default: tvm,ollie)")
    cmd.add_argument("--trials", type=int, default=0,
                     help="MetaSchedule budget per model whose records --work-dir holds")
    cmd.add_argument("--work-dir", help="tuning records (WORK_DIR/<kind>/<system>/<model>, the "
                                        "benchmark's layout); applied even with --trials 0")
    cmd.add_argument("--no-library", action="store_true",
                     help="ollie builds on TVM kernels only (no native library to carry)")
    cmd.add_argument("--carry-lib", action="append", default=[], metavar="PATH",
                     help="an extra shared library to carry and load first (repeatable)")
    cmd.add_argument("--max-mib", type=float, default=60.0,
                     help="size limit of the folder in MiB (default: 60)")
    cmd.add_argument("--candidates", action="store_true",
                     help="also carry the alternatives the pass weighs per unit (and on cuda the "
                          "calibration kernels), timed on the device for a 'measured' build")
    cmd.add_argument("--cuda-library", action="store_true",
                     help="cuda: the candidates include the CUDA library's cuBLAS/cuDNN kernels "
                          "(as the 'library' system's build; the device provides the vendor "
                          "libraries)")
    cmd.set_defaults(func=_bundle)

    cmd = sub.add_parser("bundle-results", parents=[common],
                         help="a device run's results.txt -> candidate records + calibration")
    cmd.add_argument("bundle", help="the bundle folder holding results.txt from the device")
    cmd.add_argument("--work-dir", required=True,
                     help="where the candidate timings go (WORK_DIR/cuda/ollie/<model>)")
    cmd.add_argument("--device", default="NVIDIA H200", help="the device's name (records)")
    cmd.add_argument("--arch", default="sm_90", help="its CUDA architecture (calibration key)")
    cmd.add_argument("--calibration", metavar="PATH",
                     help="where the fitted calibration goes (default: "
                          "WORK_DIR/cuda/calibration_<arch>.json)")
    cmd.add_argument("--record", action="store_true",
                     help="write the calibration as the package's recording of the "
                          "architecture (tune/recorded/), used by every build without a GPU")
    cmd.add_argument("--no-calibration", action="store_true",
                     help="do not write the calibration")
    cmd.set_defaults(func=_bundle_results)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``tvm-ollie`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    # How to rerun this very command in a new process (only for a real command line).
    args.restart_argv = ["-m", "tvm_ollie.cli", *sys.argv[1:]] if argv is None else None
    if not args.debug:
        # Frontend warnings (e.g. the ONNX checker's) repeat what the one-line error says.
        warnings.filterwarnings("ignore", module=r"tvm\.relax\.frontend")
    # A real command line leaves at once on Ctrl-C: inside MetaSchedule's C++ tuning loop a
    # KeyboardInterrupt is swallowed or turned into an FFI error with a traceback.
    sigint = _SigintFlag(exit_at_once=argv is None)
    try:
        with sigint, _workers_in_own_process_group(argv is None and args.command in _TUNING):
            return args.func(args)
    except KeyboardInterrupt:
        print("tvm-ollie: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:  # pylint: disable=broad-except
        if sigint.received:
            # Ctrl-C inside a Python callback of TVM's C++ (a pass, a TE function) reaches us
            # as the FFI's RuntimeError, not as KeyboardInterrupt.
            print("tvm-ollie: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        if args.debug:
            raise
        return _report_error(err)


class _SigintFlag:
    """Records that Ctrl-C was pressed, then raises KeyboardInterrupt as Python would, or (with
    ``exit_at_once``) prints "interrupted", removes the temporary outputs and exits with 130.

    Leaving at once is safe for the work dir: its lock is released with the process, and a
    database line cut short is dropped by the next run (:mod:`tvm_ollie.tune.workdir`).
    """

    def __init__(self, exit_at_once: bool = False):
        self.received = False
        self.exit_at_once = exit_at_once
        self._previous = None

    def _handle(self, _signum, _frame) -> None:
        self.received = True
        if not self.exit_at_once:
            raise KeyboardInterrupt
        for path in list(_CLEANUP):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        try:
            print("tvm-ollie: interrupted", file=sys.stderr, flush=True)
        finally:
            os._exit(EXIT_INTERRUPTED)  # pylint: disable=protected-access

    def __enter__(self) -> "_SigintFlag":
        try:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave signals alone
            self._previous = None
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


#: Commands that may run MetaSchedule (and so TVM's PopenPool worker processes).
_TUNING = ("compile", "explain", "demo", "bench", "bundle", "profile")


@contextlib.contextmanager
def _workers_in_own_process_group(enabled: bool) -> Iterator[None]:
    """Start TVM's PopenPool workers (MetaSchedule's builders and runners) in a process group
    of their own meanwhile.

    Ctrl-C in a terminal signals the whole foreground process group: the workers, often busy
    importing TVM, would print KeyboardInterrupt tracebacks over the one "interrupted" line. In
    their own group they are not signalled; they exit when this process's pipes to them close.
    """
    if not enabled:
        yield
        return
    try:
        # lazy: tvm.support.popen_pool is optional (absent from some TVM builds)
        from tvm.support import popen_pool  # pylint: disable=import-outside-toplevel
    except ImportError:
        yield
        return
    real = popen_pool.subprocess
    if not hasattr(real, "Popen"):
        yield
        return
    proxy = types.ModuleType("subprocess")
    proxy.__dict__.update(real.__dict__)
    proxy.Popen = functools.partial(real.Popen, process_group=0)
    popen_pool.subprocess = proxy
    try:
        yield
    finally:
        popen_pool.subprocess = real


def _report_error(err: Exception) -> int:
    """One line on stderr: the message of a user error, or the type and gist of a failure."""

    if isinstance(err, (UserError, FrontendError)):
        print(f"tvm-ollie: error: {first_line(err)}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(f"tvm-ollie: error: {type(err).__name__}: {first_line(err)} "
          "(run with --debug for the traceback)", file=sys.stderr)  # fmt: skip
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
