"""``profile_model``: build a model with the ollie pipeline (and TVM alone), time every call.

The steps: load the model (:func:`~tvm_ollie.frontend.loader.load_module`, as ``tvm-ollie
compile`` does; ``zoo:NAME`` exports a zoo model's quick size to ONNX first), make seeded random
inputs from ``main``'s signature, build, time the model without the profiler, then run it under
the VM instrument (:mod:`.vm_trace`); for an ONNX model, ONNX Runtime's own profile of the same
file on the same inputs (:mod:`.ort`).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..compat import relax, tvm
from ..config import OllieConfig
from ..frontend.inputs import arrange_inputs, module_signature
from ..frontend.loader import ModelLoadError, load_module
from ..frontend.targets import parse_target
from ..bench.timing import warm_samples
from ..models import get_model, to_onnx
from ..pipeline import build
from .ort import profile_onnxruntime
from .result import STATS, ProfileResult, SystemProfile
from .vm_trace import record_runs, vm_calls

#: ``zoo:NAME`` (quick size) or ``zoo:NAME@full``: a model of :mod:`tvm_ollie.models`.
ZOO_PREFIX = "zoo:"


def zoo_onnx(model: str, folder: str) -> Tuple[str, dict]:
    """Export the zoo model ``zoo:NAME[@full]`` to ``folder/NAME.onnx``; returns the path and
    its input shapes (``input0``, ...)."""

    name, _, size = model[len(ZOO_PREFIX):].partition("@")
    try:
        spec = get_model(name, quick=size != "full")
    except KeyError as err:
        raise ModelLoadError(str(err.args[0])) from None
    path = to_onnx(spec, os.path.join(folder, f"{spec.key}.onnx"))
    shapes = {f"input{i}": tuple(x.shape) for i, x in enumerate(spec.example_inputs)}
    return path, shapes


def _threads() -> int:
    env = os.environ.get("TVM_NUM_THREADS")
    return int(env) if env and env.isdigit() else int(tvm.runtime.num_threads())


def _inputs(mod, given: Optional[Mapping[str, np.ndarray]], seed: int):
    signature = module_signature(mod)
    arrays, _notes = arrange_inputs([p.name for p in signature], dict(given or {}), signature,
                                    random=True, seed=seed)
    return arrays


def _build_ollie(mod, target, config):
    ex, _report = build(mod, target=target, config=config)
    return ex


def _build_tvm(mod, target):
    return tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))


def profile_executable(ex, args: Sequence, device, runs: int = 10, system: str = "ollie",
                       build_s: float = 0.0, stat: str = "median") -> SystemProfile:  # fmt: skip
    """Profile ``runs`` calls of ``main`` of a built executable on ``args`` (numpy arrays or
    TVM tensors), each beside a run without the instrument; then the model's time without the
    profiler: ``runs`` warm samples of a VM without the instrument, as the benchmark takes them
    (:func:`~tvm_ollie.bench.timing.warm_samples`: untimed warm-up calls, then at least 20 ms
    of back-to-back calls per sample)."""

    sync = None if device.dlpack_device_type() == tvm.cpu().dlpack_device_type() else device.sync
    tensors = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.tensor(a, device)
               for a in args]  # fmt: skip
    plain_vm = relax.VirtualMachine(ex, device)
    events, _, traced = record_runs(plain_vm, relax.VirtualMachine(ex, device), "main", tensors,
                                    runs, sync)  # fmt: skip
    main = plain_vm["main"]

    def call():
        main(*tensors)
        if sync is not None:
            sync()

    plain = warm_samples(call, runs).seconds
    return SystemProfile(system, events, runs, plain, traced, len(vm_calls(ex)), build_s, stat)


def profile_model(
    model: Union[str, "tvm.IRModule"],
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    target="llvm",
    runs: int = 10,
    baseline: bool = False,
    onnxruntime: Optional[bool] = None,
    inputs: Optional[Mapping[str, np.ndarray]] = None,
    seed: int = 0,
    config=None,
    module=None,
    stat: str = "median",
    **options,
) -> ProfileResult:
    """Build ``model`` with the ollie pipeline and time every call of one inference.

    Parameters
    ----------
    model : str or IRModule
        An ONNX file, a saved Relax module (.json), ``file.py:function`` (what ``tvm-ollie
        compile`` accepts), ``zoo:NAME`` / ``zoo:NAME@full`` (a model of
        :mod:`tvm_ollie.models`, exported to ONNX), or a Relax module.
    shapes : mapping, optional
        Input shapes of an ONNX model with dynamic dimensions.
    target : str or Target
        The build target (``"llvm"``; ``"cuda"`` profiles on the GPU, synchronizing per call).
    runs : int
        Profiled runs (and as many timed without the profiler), after one warm-up each.
    baseline : bool
        Also profile TVM alone (its default pipeline, untuned) as the system ``tvm``.
    onnxruntime : bool, optional
        Profile the ONNX file with ONNX Runtime too (default: for ONNX models).
    inputs : mapping, optional
        Input arrays by ``main``'s parameter names; the others are seeded random values.
    seed : int
        Seed of the random inputs.
    config : OllieConfig, optional
        The ollie build's options; ``options`` override its fields (``trials``, ``work_dir``...).
    module : IRModule, optional
        ``model`` already loaded (the command line loads it first, for its one-line errors).
    stat : str
        ``"median"`` (default) or ``"min"``: each call's time in the tables is its median over
        the runs, or its fastest (the undisturbed cost, on a machine shared with other work).

    Returns
    -------
    ProfileResult
        ``.to_text()`` for the tables, ``.to_chrome_trace()`` for the trace.
    """
    if runs < 1:
        raise ValueError("runs must be >= 1")
    if stat not in STATS:
        raise ValueError(f"stat must be one of {sorted(STATS)}, not {stat!r}")
    tgt = parse_target(target)[0] if isinstance(target, str) else target
    with tempfile.TemporaryDirectory(prefix="ollie_profile_") as tmp:
        name = model if isinstance(model, str) else "<IRModule>"
        if isinstance(model, str) and model.startswith(ZOO_PREFIX):
            model, zoo_shapes = zoo_onnx(model, tmp)
            shapes = dict(zoo_shapes, **(shapes or {}))
        mod = module if module is not None else (
            load_module(model, shapes=shapes or {}) if isinstance(model, str) else model)
        args = _inputs(mod, inputs, seed)
        gpu = tgt.kind.name != "llvm"
        device = tvm.cuda(0) if gpu else tvm.cpu(0)
        if not device.exist:
            raise RuntimeError(f"no {tgt.kind.name} device here to profile on")
        systems = []
        start = time.perf_counter()
        ex = _build_ollie(mod, tgt, config.replace(**options) if config is not None
                          else _config(tgt, options))  # fmt: skip
        systems.append(profile_executable(ex, args, device, runs, "ollie",
                                          time.perf_counter() - start, stat))  # fmt: skip
        if baseline:
            start = time.perf_counter()
            ex = _build_tvm(mod, tgt)
            systems.append(profile_executable(ex, args, device, runs, "tvm",
                                              time.perf_counter() - start, stat))  # fmt: skip
        is_onnx = isinstance(model, str) and model.endswith(".onnx")
        ort = None
        if (onnxruntime if onnxruntime is not None else is_onnx) and not gpu:
            if not is_onnx:
                raise ValueError("onnxruntime=True needs an ONNX model")
            ort = profile_onnxruntime(model, args, runs, _threads())
    return ProfileResult(name, tgt.kind.name, _threads(), systems, ort, stat)


def _config(target, options: dict):
    return OllieConfig(target=target, **options)
