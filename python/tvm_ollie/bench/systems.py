"""The systems a benchmark compares, in a registry keyed by name.

A system is one function ``prepare(spec, ctx) -> Prepared``: it builds whatever it needs for the
model (compiling, exporting, tuning) and returns a callable that runs one inference on the
model's example inputs. Adding a system (the ``ollie`` column, for instance) is one decorated
function::

    def _prepare_ollie(spec, ctx: BenchContext, system: str, **opts) -> Prepared:
    """The ollie build of ``spec`` with pass options ``opts``, tuning records in work_dir."""
    from ..transform import build as ollie_build  # pylint: disable=import-outside-toplevel

    mod, params, import_s = ctx.relax_module(spec)
    work_dir = ctx.model_dir(spec, system)
    start = time.perf_counter()
    ex, report = ollie_build(mod, target=ctx.target, trials=ctx.trials,
                             work_dir=work_dir if ctx.trials > 0 else None, **opts)
    total_s = time.perf_counter() - start
    tune_s = report.tuning_s if ctx.trials > 0 else None
    info = {"trials_per_impl": ctx.trials, "import_s": import_s, "search_s": report.search_s,
            "rewritten": [d.var_name for d in report.decisions if d.chosen != "original"],
            "decisions": [f"{d.op_name} {d.var_name}: {d.chosen}" for d in report.decisions],
            "epilogues": dict(report.epilogues)}
    return prepare_tvm_executable(ex, params, spec, ctx, total_s - (tune_s or 0.0), tune_s, info)


@register_system("ollie", tvm_based=True)
def prepare_ollie(spec, ctx: BenchContext) -> Prepared:
    """tvm-ollie: derivation + native library kernels + TVM's pipeline."""
    return _prepare_ollie(spec, ctx, "ollie")


@register_system("ollie-lib", tvm_based=True)
def prepare_ollie_lib(spec, ctx: BenchContext) -> Prepared:
    """Ablation: native library kernels for the original operators, no derivation."""
    return _prepare_ollie(spec, ctx, "ollie-lib", derive=False)


@register_system("ollie-derive", tvm_based=True)
def prepare_ollie_derive(spec, ctx: BenchContext) -> Prepared:
    """Ablation: derivation with TVM-built kernels only (no native library)."""
    return _prepare_ollie(spec, ctx, "ollie-derive", library=False)


def _torch_device(ctx: BenchContext):
    try:
        import torch  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise SystemUnavailable("torch is not installed") from err
    if ctx.target_kind == "cuda":
        if not torch.cuda.is_available():
            raise SystemUnavailable("torch has no CUDA device")
        return torch, torch.device("cuda")
    torch.set_num_threads(ctx.threads)
    return torch, torch.device("cpu")


def _module_on(spec, device):
    """The model on ``device``; a copy when that is not the CPU (the spec stays on the CPU)."""
    return spec.module if device.type == "cpu" else copy.deepcopy(spec.module).to(device)


def _torch_runner(torch, module, inputs, device):
    def run():
        with torch.inference_mode():
            out = module(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    return run


@register_system("torch")
def prepare_torch(spec, ctx: BenchContext) -> Prepared:
    """PyTorch eager (the correctness reference)."""
    torch, device = _torch_device(ctx)
    module = _module_on(spec, device)
    inputs = [x.to(device) for x in spec.example_inputs]
    return Prepared(_torch_runner(torch, module, inputs, device), 0.0)


@register_system("torch_compile")
def prepare_torch_compile(spec, ctx: BenchContext) -> Prepared:
    """torch.compile with the default (inductor) backend; compile time is the first call."""
    torch, device = _torch_device(ctx)
    module = _module_on(spec, device)
    inputs = [x.to(device) for x in spec.example_inputs]
    torch._dynamo.reset()  # pylint: disable=protected-access
    compiled = torch.compile(module)
    run = _torch_runner(torch, compiled, inputs, device)
    start = time.perf_counter()
    run()
    return Prepared(run, time.perf_counter() - start)


@register_system("onnxruntime")
def prepare_onnxruntime(spec, ctx: BenchContext) -> Prepared:
    """ONNX Runtime on the model exported by ``torch.onnx`` (CPU, or CUDA provider)."""
    try:
        import onnxruntime as ort  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise SystemUnavailable("onnxruntime is not installed") from err
    from ..models import to_onnx  # pylint: disable=import-outside-toplevel

    provider = "CUDAExecutionProvider" if ctx.target_kind == "cuda" else "CPUExecutionProvider"
    if provider not in ort.get_available_providers():
        raise SystemUnavailable(f"onnxruntime has no {provider}")
    start = time.perf_counter()
    path = to_onnx(spec, os.path.join(ctx.model_dir(spec, "onnxruntime"), "model.onnx"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx.threads
    # ORT's intra-op workers spin for a long time after ``run`` returns (tens of ms measured
    # here); in an interleaved run that spinning steals the cores from the next system (torch
    # eager went from 1 ms to 28 ms right after ORT). Spinning only helps back-to-back ORT calls,
    # so it is the one ORT default changed.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(path, options, providers=[provider])
    compile_s = time.perf_counter() - start
    run = ort_runner(session, spec.example_inputs, "cuda" if ctx.target_kind == "cuda" else "cpu")
    return Prepared(run, compile_s, info={"provider": provider})


def ort_runner(session, inputs, device: str = "cpu") -> Callable[[], object]:
    """One ONNX Runtime inference with inputs bound once on ``device`` (``"cpu"``/``"cuda"``).

    IO binding keeps host-to-device copies of the inputs out of the timed call on GPUs, as for
    the other systems; outputs are allocated on ``device`` by each run.
    """
    import onnxruntime as ort  # pylint: disable=import-outside-toplevel

    binding = session.io_binding()
    # On the CPU an OrtValue wraps the numpy buffer without copying: keep arrays and values alive.
    arrays = [np.ascontiguousarray(x.numpy()) for x in inputs]
    values = [ort.OrtValue.ortvalue_from_numpy(a, device, 0) for a in arrays]
    for meta, value in zip(session.get_inputs(), values):
        binding.bind_ortvalue_input(meta.name, value)
    for meta in session.get_outputs():
        binding.bind_output(meta.name, device)

    def run(_keep=(arrays, values)):
        session.run_with_iobinding(binding)
        return list(binding.get_outputs())  # OrtValues; converted outside the timed call

    return run
