"""TVM's parallel loops on the native library's OpenMP pool (``native.set_parallel_runtime``):
the same numbers as on TVM's pool, the loops counted where they ran, barriers kept, the choice
bound when a virtual machine is made, and the default applied at import."""

import os

import numpy as np
import pytest

from native_util import require_native
from parallel_modules import N, Scaled
from tvm_ollie import native
from tvm_ollie.compat import relax, tvm
from tvm.script import relax as R
from tvm.script import tirx as T

AT_IMPORT = native.get_parallel_runtime()  # at collection, after conftest imported tvm_ollie


@pytest.fixture(autouse=True)
def _runtime_api():
    require_native()
    if not native.provides(native.SET_PARALLEL_RUNTIME):
        pytest.skip("the loaded native library has no parallel runtime (built before it)")
    before, threads = native.get_parallel_runtime(), native.get_num_threads()
    native.set_num_threads(2)  # a real team even on a one-core machine (correctness only)
    yield
    native.set_parallel_runtime(before)
    native.set_num_threads(threads)


# fmt: off
@tvm.script.ir_module
class Rotated:
    """Two parallel loops in one launch, a barrier between them: the second reads what other
    tasks of the first wrote (the launch point and the barrier pragmas of TVM's CPU codegen)."""

    @T.prim_func
    def rotate(a: T.Buffer((N,), "float32"), c: T.Buffer((N,), "float32")):
        buf = T.alloc_buffer((N,), "float32")
        with T.attr(0, "pragma_parallel_launch_point", 1):
            with T.attr(0, "pragma_parallel_barrier_when_finish", 1):
                for i in T.parallel(N):
                    buf[i] = a[i] * T.float32(2)
            for i in T.parallel(N):
                c[i] = buf[(i + N // 2) % N]

    @R.function
    def main(x: R.Tensor((N,), "float32")):
        cls = Rotated
        with R.dataflow():
            z = R.call_tir(cls.rotate, (x,), R.Tensor((N,), "float32"))
            R.output(z)
        return z
# fmt: on


def _vm(mod):
    return relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())


def _run(vm, *arrays):
    return vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()


@pytest.mark.parametrize("runtime", ["openmp", "tvm"])
def test_parallel_loop_same_numbers_counted_where_it_ran(runtime):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, N, 33)).astype("float32")
    native.set_parallel_runtime(runtime)
    assert native.get_parallel_runtime() == runtime
    vm = _vm(Scaled)
    before = native.parallel_stats()["launches"]
    np.testing.assert_array_equal(_run(vm, x, y), x * 2 + y)
    ran = native.parallel_stats()["launches"] - before
    assert ran == (1 if runtime == "openmp" else 0)


def test_barrier_between_parallel_loops():
    x = np.arange(N, dtype="float32")
    native.set_parallel_runtime("openmp")
    vm = _vm(Rotated)
    before = native.parallel_stats()
    for _ in range(20):
        np.testing.assert_array_equal(_run(vm, x), 2 * np.roll(x, -N // 2))
    after = native.parallel_stats()
    assert after["launches"] - before["launches"] == 20
    assert after["barriers"] - before["barriers"] == 20 * 2  # each of the two tasks, each call


def test_one_thread_runs_inline_without_barrier():
    x = np.arange(N, dtype="float32")
    native.set_parallel_runtime("openmp")
    native.set_num_threads(1)
    vm = _vm(Rotated)
    before = native.parallel_stats()
    np.testing.assert_array_equal(_run(vm, x), 2 * np.roll(x, -N // 2))
    after = native.parallel_stats()
    assert after["launches"] - before["launches"] == 1
    assert after["barriers"] == before["barriers"]  # one task: nothing to wait for


def test_choice_bound_when_the_vm_is_made():
    x = np.ones((N, 33), "float32")
    native.set_parallel_runtime("openmp")
    on_openmp = _vm(Scaled)
    with native.parallel_runtime("tvm"):
        assert native.get_parallel_runtime() == "tvm"
        on_tvm = _vm(Scaled)
        before = native.parallel_stats()["launches"]
        _run(on_openmp, x, x)
        assert native.parallel_stats()["launches"] == before + 1
    assert native.get_parallel_runtime() == "openmp"
    before = native.parallel_stats()["launches"]
    _run(on_tvm, x, x)
    assert native.parallel_stats()["launches"] == before


def test_invalid_name():
    with pytest.raises(ValueError, match="expected one of"):
        native.set_parallel_runtime("pthreads")


def test_default_applied_at_import():
    expected = os.environ.get("TVM_OLLIE_PARALLEL_RUNTIME", native.DEFAULT_PARALLEL_RUNTIME)
    assert AT_IMPORT == expected
