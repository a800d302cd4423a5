"""Library call forms on CUDA targets: the CUDA kernels where they run and take the case, none
otherwise; the pass offers them only with a GPU."""

import pytest
from tvm import relax

from tvm_ollie import native_cuda
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform import decide


def _call(op, shapes, **attrs):
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(op(*params, **attrs))
        bb.emit_func_output(out)
    return bb.get()["main"].body.blocks[0].bindings[0].value


@pytest.fixture
def cuda_runs(monkeypatch):
    """The CUDA kernels run here (as with the library, cuBLAS/cuDNN and a GPU)."""
    monkeypatch.setattr("tvm_ollie.native_cuda.kernel_error", lambda func: "")


def test_cuda_forms_name_the_cuda_kernels(cuda_runs):
    mm = _call(relax.op.matmul, [(4, 8), (8, 3)])
    conv = _call(relax.op.nn.conv2d, [(1, 4, 8, 8), (6, 4, 3, 3)], padding=1)
    with lib.kernel_device("cuda"):
        assert lib.current_device() == "cuda"
        assert lib.call_form(mm).func == lib.CUDA_MATMUL
        form = lib.call_form(conv)
        assert form.func == lib.CUDA_CONV2D and form.get("pad") == "1,1,1,1"
    assert lib.current_device() == "cpu"
    assert lib.call_form(mm).func == lib.MATMUL and lib.call_form(conv).func == lib.CONV2D
    assert lib.CUDA_MATMUL in lib.EPILOGUE_KERNELS and lib.CUDA_CONV2D in lib.KERNELS


def test_cuda_forms_only_where_cudnn_takes_the_case(cuda_runs):
    hwio = _call(relax.op.nn.conv2d, [(1, 8, 8, 4), (3, 3, 4, 6)], data_layout="NHWC",
                 kernel_layout="HWIO", padding=1)
    ohwi = _call(relax.op.nn.conv2d, [(1, 8, 8, 4), (6, 3, 3, 4)], data_layout="NHWC",
                 kernel_layout="OHWI", padding=1)
    asym = _call(relax.op.nn.conv2d, [(1, 4, 8, 8), (6, 4, 3, 3)], padding=(1, 1, 0, 0))
    deconv = _call(relax.op.nn.conv2d_transpose, [(1, 4, 8, 8), (4, 2, 4, 4)], strides=2,
                   padding=1)
    with lib.kernel_device("cuda"):
        assert lib.call_form(hwio) is None and lib.call_form(asym) is None
        assert lib.call_form(deconv) is None
        assert lib.call_form(ohwi).func == lib.CUDA_CONV2D
    assert lib.call_form(hwio).func == lib.CONV2D and lib.call_form(asym).func == lib.CONV2D


def test_no_cuda_form_where_the_kernel_cannot_run(monkeypatch):
    monkeypatch.setattr("tvm_ollie.native_cuda.kernel_error", lambda func: "no CUDA device")
    mm = _call(relax.op.matmul, [(4, 8), (8, 3)])
    with lib.kernel_device("cuda"):
        assert lib.call_form(mm) is None
    with pytest.raises(ValueError):
        with lib.kernel_device("rocm"):
            pass


def test_library_on_cuda_needs_a_gpu(monkeypatch, cuda_runs):
    monkeypatch.setattr(decide, "gpu_available", lambda target: False)
    assert not decide._library_enabled(None, "cuda")
    assert not decide._library_enabled(True, "cuda")
    monkeypatch.setattr(decide, "gpu_available", lambda target: True)
    assert decide._library_enabled(None, "cuda")
    assert not decide._library_enabled(False, "cuda")
    assert lib.device_of("cuda") == "cuda" and lib.device_of("llvm") == "cpu"


def test_assumed_kernels_are_offered_without_a_gpu(monkeypatch):
    """``TVM_OLLIE_CUDA_KERNELS=assume`` (a device bundle's ``library`` build): the kernels are
    offered when the library loads here, with no cuBLAS/cuDNN or GPU here."""
    monkeypatch.setattr(native_cuda, "load", lambda: True)
    monkeypatch.setattr(native_cuda, "vendor_error", lambda name: "cuBLAS not found")
    monkeypatch.setattr(native_cuda, "device_count", lambda: 0)
    monkeypatch.setattr(decide, "gpu_available", lambda target: False)
    monkeypatch.delenv(native_cuda.ASSUME_ENV, raising=False)
    assert native_cuda.kernel_error(lib.CUDA_MATMUL) == "cuBLAS not found"
    assert not decide._library_enabled(None, "cuda")
    monkeypatch.setenv(native_cuda.ASSUME_ENV, "assume")
    assert native_cuda.assumed() and native_cuda.kernel_error(lib.CUDA_MATMUL) == ""
    assert decide._library_enabled(None, "cuda")
    with lib.kernel_device("cuda"):
        assert lib.call_form(_call(relax.op.matmul, [(4, 8), (8, 3)])).func == lib.CUDA_MATMUL
    monkeypatch.setattr(native_cuda, "load", lambda: False)
    monkeypatch.setattr(native_cuda, "unavailable_reason", lambda: "no library")
    assert native_cuda.kernel_error(lib.CUDA_MATMUL) == "no library"
