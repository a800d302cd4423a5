"""A call timed on its library kernel, called directly: what a search can at most gain."""

import numpy as np
import pytest

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.codegen.builder import tensor_var
from tvm_ollie.compat import relax
from tvm_ollie.tune import library_timing as lt
from tvm_ollie.tune.library_timing import call_operands, library_seconds


@pytest.fixture(autouse=True)
def _library():
    if not native.load():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")


def _call(expr):
    return relax.BlockBuilder().normalize(expr)


def _conv():
    x, w = tensor_var("x", (1, 8, 8, 8)), tensor_var("w", (16, 8, 3, 3))
    return _call(relax.op.nn.conv2d(x, w, padding=1))


def test_a_convolution_is_timed_on_one_thread_and_the_threads_restored():
    before = native.get_num_threads()
    seconds = library_seconds(_conv())
    assert seconds is not None and 0 < seconds < 1.0
    assert native.get_num_threads() == before


def test_a_matmul_and_a_transposed_convolution_are_timed():
    a, b = tensor_var("a", (16, 32)), tensor_var("b", (32, 8))
    assert library_seconds(_call(relax.op.matmul(a, b))) > 0
    x, w = tensor_var("x", (1, 8, 4, 4)), tensor_var("w", (8, 4, 4, 4))
    deconv = _call(relax.op.nn.conv2d_transpose(x, w, strides=2, padding=1))
    if lib.call_form(deconv) is None:
        pytest.skip("this library build has no transposed convolution")
    assert library_seconds(deconv) > 0


def test_no_library_form_no_time():
    x, w = tensor_var("x", (1, 8, 8, 8), "float16"), tensor_var("w", (16, 8, 3, 3), "float16")
    call = _call(relax.op.nn.conv2d(x, w, padding=1))
    assert lib.call_form(call) is None and library_seconds(call) is None
    assert call_operands(call) is None  # (not float32)


def test_not_on_the_cpu_no_time():
    with lib.kernel_device("cuda"):
        assert library_seconds(_conv()) is None


def test_the_operands_and_result_shapes():
    assert call_operands(_conv()) == ([(1, 8, 8, 8), (16, 8, 3, 3)], (1, 16, 8, 8))


def test_the_fastest_call_is_read_on_the_given_clock():
    """``_fastest`` keeps the fastest call by its clock (by default the calling thread's CPU
    clock, whose seconds another process's slices do not enter); the first call untimed."""
    ticks = iter([0.0, 5.0, 10.0, 11.0, 20.0, 23.0] + [30.0, 34.0] * 200)
    calls = []
    best = lt._fastest(lambda text, *args: calls.append(text), "k", [(2, 2)], (2, 2),
                       repeat=3, window_s=0.0, rng=np.random.default_rng(0),
                       clock=lambda: next(ticks))
    assert best == 1.0 and len(calls) == 4  # one untimed, then three timed: 5, 1, 3
    assert lt._fastest.__defaults__[-1] is lt.time.thread_time
