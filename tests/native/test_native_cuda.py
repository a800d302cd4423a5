"""The CUDA kernel library (libtvm_ollie_cuda): build, loader, argument checks, and numerics of
every exported kernel against numpy on a GPU.

The numeric tests are marked ``gpu`` and skip with the reason (no CUDA library, cuBLAS/cuDNN not
found, no CUDA device); the argument checks run on the CPU wherever the library loads; the
build test (``slow``) compiles it with CMake/nvcc into a temporary directory.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from native_util import ACTS, act_ref
from tvm_ollie import native_cuda

ROOT = Path(__file__).resolve().parents[2]


def _require_library():
    if not native_cuda.available():
        pytest.skip(f"CUDA library unavailable: {native_cuda.unavailable_reason()}")


def _require_kernel(func):
    _require_library()
    why = native_cuda.kernel_error(func)
    if why:
        pytest.skip(f"{func} cannot run here: {why}")


# -- build -----------------------------------------------------------------------------------

def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not found")
    return path


@pytest.mark.slow
def test_cuda_library_builds(tmp_path):
    """Configure the repository with CMake and build only libtvm_ollie_cuda, for one GPU
    architecture (the default list takes longer); it must link neither oneDNN/OpenBLAS nor
    cuBLAS/cuDNN (those are opened at run time)."""
    cmake, _ = _tool("cmake"), _tool("ninja")
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("nvcc not found (no CUDA toolkit)")
    build = tmp_path / "build"
    cfg = subprocess.run([cmake, "-G", "Ninja", str(ROOT), "-B", str(build),
                          f"-DPython_EXECUTABLE={sys.executable}",
                          "-DCMAKE_CUDA_ARCHITECTURES=90-real"],
                         capture_output=True, text=True, check=False)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    if "building the CUDA library" not in cfg.stdout:
        pytest.skip("CMake did not find the CUDA toolkit: " + cfg.stdout[-500:])
    out = subprocess.run(["ninja", "-C", str(build), "tvm_ollie_cuda"], capture_output=True,
                         text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    lib = build / native_cuda.LIBRARY_NAME
    assert lib.is_file()
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                            check=False).stdout
    for name in ("dnnl", "openblas", "cublas", "cudnn"):
        assert name not in needed, needed
    assert "libcudart" in needed


# -- loader and argument checks (no GPU needed) ------------------------------------------------

def test_loader_reports_why_not():
    """load() never raises; without the library, a vendor library or a device the kernels say
    why they cannot run."""
    ok = native_cuda.load()
    assert ok == native_cuda.available()
    assert (native_cuda.unavailable_reason() == "") == ok
    for func in native_cuda.KERNELS:
        why = native_cuda.kernel_error(func)
        assert isinstance(why, str)
        if not ok:
            assert why == native_cuda.unavailable_reason()
    with pytest.raises(ValueError, match="unknown CUDA kernel"):
        native_cuda.kernel_error("tvm_ollie.cuda.nothing")


def test_info_and_vendor_errors():
    _require_library()
    text = native_cuda.info()
    assert "cuda runtime" in text and "cublas:" in text and "cudnn:" in text
    for vendor in ("cublas", "cudnn"):
        why = native_cuda.vendor_error(vendor)
        assert why == "" or "not found" in why or "symbol" in why
    assert native_cuda.device_count() >= 0


def _cpu(shape):
    import tvm_ffi

    return tvm_ffi.from_dlpack(np.zeros(shape, dtype="float32"))


@pytest.mark.parametrize("func, attrs, shapes, match", [
    (native_cuda.MATMUL, "ta=0;foo=1", [(2, 3), (3, 2), (2, 2)], "unknown attribute"),
    (native_cuda.MATMUL, "math=fp16", [(2, 3), (3, 2), (2, 2)], "math"),
    (native_cuda.MATMUL, "", [(2, 3), (3, 2), (2, 2)], "must be on a CUDA device"),
    (native_cuda.BATCH_MATMUL, "act=clip_1_0", [(1, 2, 3), (1, 3, 2), (1, 2, 2)], "clip"),
    (native_cuda.CONV2D, "layout=NHWC;klayout=HWIO", [(1, 4, 4, 2), (3, 3, 2, 2), (1, 2, 2, 2)],
     "HWIO"),
    (native_cuda.CONV2D, "pad=1,1,0,0", [(1, 2, 4, 4), (2, 2, 3, 3), (1, 2, 3, 3)],
     "asymmetric"),
    (native_cuda.CONV2D, "algo=9", [(1, 2, 4, 4), (2, 2, 3, 3), (1, 2, 2, 2)], "algo"),
    (native_cuda.CONV2D, "", [(1, 2, 4, 4), (2, 2, 3, 3), (1, 2, 2, 2)],
     "must be on a CUDA device"),
])
def test_bad_arguments_raise(func, attrs, shapes, match):
    """Attributes are parsed strictly and tensors checked before anything touches a device."""
    _require_library()
    import tvm_ffi

    with pytest.raises((ValueError, TypeError), match=match):
        tvm_ffi.get_global_func(func)(attrs, *[_cpu(s) for s in shapes])


def test_wrong_argument_count_raises():
    _require_library()
    import tvm_ffi

    with pytest.raises(TypeError, match="expected 5 arguments"):
        tvm_ffi.get_global_func(native_cuda.MATMUL)("bias=1", _cpu((2, 3)), _cpu((3, 2)),
                                                    _cpu((2, 2)))


# -- numerics on a GPU -----------------------------------------------------------------------

def _gpu_call(func, attrs, arrays, out_shape, out_init=None):
    """Call ``func(attrs, *arrays, out)`` on cuda:0; ``out_init`` (an index into ``arrays``)
    makes Out that very tensor (a residual that is Out itself)."""
    import tvm
    import tvm_ffi

    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in arrays]
    if out_init is None:
        out = tvm.runtime.tensor(np.full(out_shape, np.nan, dtype="float32"), dev)
    else:
        out = args[out_init]
    tvm_ffi.get_global_func(func)(attrs, *args, out)
    dev.sync()
    return out.numpy()


def _mm_ref(a, b, ta, tb):
    a = np.swapaxes(a, -1, -2) if ta else a
    b = np.swapaxes(b, -1, -2) if tb else b
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


def _close(got, ref, tol=2e-5):
    scale = max(1.0, float(np.abs(ref).max()) if ref.size else 1.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=tol * scale)


@pytest.mark.gpu
@pytest.mark.parametrize("ta", [0, 1])
@pytest.mark.parametrize("tb", [0, 1])
@pytest.mark.parametrize("a_batch, b_batch", [
    ((), ()), ((3,), ()), ((2, 3), (3,)), ((1,), (4,)), ((2, 1), (1, 3)), ((4,), (4,))])
def test_matmul_matches_numpy(ta, tb, a_batch, b_batch):
    """Every batching path: one GEMM (batch folded into M), strided-batched (stride 0 for a
    shared operand), one GEMM per element (mixed broadcasting)."""
    _require_kernel(native_cuda.MATMUL)
    rng = np.random.default_rng(0)
    m, k, n = 5, 7, 3
    a = rng.standard_normal(a_batch + ((k, m) if ta else (m, k)), dtype=np.float32)
    b = rng.standard_normal(b_batch + ((n, k) if tb else (k, n)), dtype=np.float32)
    ref = _mm_ref(a, b, ta, tb)
    got = _gpu_call(native_cuda.MATMUL, f"ta={ta};tb={tb}", [a, b], ref.shape)
    _close(got, ref)


@pytest.mark.gpu
@pytest.mark.parametrize("act", ACTS)
def test_matmul_epilogues(act):
    _require_kernel(native_cuda.MATMUL)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 9, 16), dtype=np.float32)
    b = rng.standard_normal((16, 11), dtype=np.float32)
    bias = rng.standard_normal(11, dtype=np.float32)
    res = rng.standard_normal((2, 9, 11), dtype=np.float32)
    ref = act_ref(_mm_ref(a, b, 0, 0) + bias + res, act)
    got = _gpu_call(native_cuda.MATMUL, f"bias=1;res=1;act={act}", [a, b, bias, res], ref.shape)
    _close(got, ref, 1e-4)


@pytest.mark.gpu
def test_matmul_residual_is_out_and_empty_reduction():
    """A residual that is Out itself accumulates (beta = 1); K = 0 leaves the epilogue only."""
    _require_kernel(native_cuda.MATMUL)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((6, 4), dtype=np.float32)
    b = rng.standard_normal((4, 5), dtype=np.float32)
    res = rng.standard_normal((6, 5), dtype=np.float32)
    got = _gpu_call(native_cuda.MATMUL, "res=1;act=relu", [a, b, res], res.shape, out_init=2)
    _close(got, act_ref(_mm_ref(a, b, 0, 0) + res, "relu"))
    bias = rng.standard_normal(5, dtype=np.float32)
    got = _gpu_call(native_cuda.MATMUL, "bias=1", [np.zeros((6, 0), np.float32),
                                                  np.zeros((0, 5), np.float32), bias], (6, 5))
    _close(got, np.broadcast_to(bias, (6, 5)))


@pytest.mark.gpu
def test_matmul_tf32_close():
    _require_kernel(native_cuda.MATMUL)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 128), dtype=np.float32)
    b = rng.standard_normal((128, 32), dtype=np.float32)
    _close(_gpu_call(native_cuda.MATMUL, "math=tf32", [a, b], (64, 32)), _mm_ref(a, b, 0, 0),
           5e-3)


@pytest.mark.gpu
def test_batch_matmul_matches_numpy_and_rejects_2d():
    _require_kernel(native_cuda.BATCH_MATMUL)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 8, 16), dtype=np.float32)
    b = rng.standard_normal((3, 12, 16), dtype=np.float32)
    ref = _mm_ref(a, b, 0, 1)
    _close(_gpu_call(native_cuda.BATCH_MATMUL, "tb=1", [a, b], ref.shape), ref)
    with pytest.raises(ValueError, match="rank >= 3"):
        _gpu_call(native_cuda.BATCH_MATMUL, "", [a[0], b[0].T.copy()], (8, 12))


def _conv_ref(x, w, stride, pad, dil, groups):
    """float64 direct convolution, NCHW data and OIHW weight."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og].astype(np.float64)
        for r in range(kh):
            for s in range(kw):
                patch = xs[:, :, r * dil[0]:r * dil[0] + stride[0] * (oh - 1) + 1:stride[0],
                           s * dil[1]:s * dil[1] + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, r, s])
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride, pad, dil, groups", [
    ((1, 1), (1, 1), (1, 1), 1), ((2, 2), (1, 1), (1, 1), 1), ((1, 2), (0, 2), (2, 1), 1),
    ((1, 1), (1, 1), (1, 1), 4), ((2, 1), (1, 0), (1, 1), 8)])
def test_conv2d_matches_numpy(layout, stride, pad, dil, groups):
    _require_kernel(native_cuda.CONV2D)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 9, 7), dtype=np.float32)
    w = rng.standard_normal((8, 8 // groups, 3, 3), dtype=np.float32)
    ref = _conv_ref(x, w, stride, pad, dil, groups)
    attrs = (f"layout={layout};klayout={'OIHW' if layout == 'NCHW' else 'OHWI'};"
             f"stride={stride[0]},{stride[1]};pad={pad[0]},{pad[1]},{pad[0]},{pad[1]};"
             f"dil={dil[0]},{dil[1]};groups={groups}")
    if layout == "NHWC":
        x, w, ref = x.transpose(0, 2, 3, 1), w.transpose(0, 2, 3, 1), ref.transpose(0, 2, 3, 1)
    _close(_gpu_call(native_cuda.CONV2D, attrs, [x, w], ref.shape), ref, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("act", ["relu", "clip_0_6", "gelu", "silu"])
def test_conv2d_epilogues(layout, act):
    """The bias is per output channel in either layout; the residual is added before the
    activation."""
    _require_kernel(native_cuda.CONV2D)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 6, 8, 8), dtype=np.float32)
    w = rng.standard_normal((5, 6, 3, 3), dtype=np.float32)
    bias = rng.standard_normal(5, dtype=np.float32)
    conv = _conv_ref(x, w, (1, 1), (1, 1), (1, 1), 1)
    res = rng.standard_normal(conv.shape, dtype=np.float32)
    ref = act_ref(conv + bias[None, :, None, None] + res, act)
    klayout = "OIHW"
    if layout == "NHWC":
        x, w, res, ref = (t.transpose(0, 2, 3, 1) for t in (x, w, res, ref))
        klayout = "OHWI"
    attrs = f"layout={layout};klayout={klayout};pad=1,1,1,1;bias=1;res=1;act={act}"
    got = _gpu_call(native_cuda.CONV2D, attrs, [x, w, bias, np.ascontiguousarray(res)],
                    ref.shape)
    _close(got, ref, 1e-4)


@pytest.mark.gpu
def test_kernels_through_relax_on_cuda():
    """call_dps_packed of the CUDA kernels in a module built for CUDA, run by the VM on the
    device (TVM's stream)."""
    _require_kernel(native_cuda.MATMUL)
    _require_kernel(native_cuda.CONV2D)
    import tvm
    from tvm import relax

    from tvm_ollie.codegen import library as lib
    from tvm_ollie.codegen.builder import single_function_module, tensor_var

    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 4, 6, 6), dtype=np.float32)
    w = rng.standard_normal((4, 4, 3, 3), dtype=np.float32)
    conv = lib.LibCall(lib.CUDA_CONV2D, lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW",
                                                        "OIHW").attrs)
    mm = lib.LibCall(lib.CUDA_MATMUL, (("ta", "0"), ("tb", "1")))

    def body(bb, xv, wv):
        y = bb.emit(lib.emit_call(conv, [xv, wv], (1, 4, 6, 6)))
        y2 = bb.emit(relax.op.reshape(y, (4, 36)))
        return lib.emit_call(mm, [y2, y2], (4, 4))

    mod = single_function_module([tensor_var("x", x.shape), tensor_var("w", w.shape)], body)
    ex = tvm.compile(mod, target="cuda")
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    got = vm["main"](tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev)).numpy()
    y = _conv_ref(x, w, (1, 1), (1, 1), (1, 1), 1).reshape(4, 36)
    _close(got, y @ y.T, 1e-4)


def test_environment_paths_are_respected(tmp_path, monkeypatch):
    """The loader looks at $TVM_OLLIE_CUDA_LIB first (a missing file is skipped)."""
    from tvm_ollie.library_loader import candidate_paths

    fake = tmp_path / "lib.so"
    monkeypatch.setenv("TVM_OLLIE_CUDA_LIB", str(fake))
    paths = candidate_paths(native_cuda.LIBRARY_NAME, "TVM_OLLIE_CUDA_LIB")
    assert paths[0] == fake and all(p.name == native_cuda.LIBRARY_NAME for p in paths[1:])
