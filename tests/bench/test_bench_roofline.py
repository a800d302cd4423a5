"""Roofline arithmetic on single layers with hand-computed FLOPs and bytes."""

import pytest
import tvm
from tvm import relax

from tvm_ollie.bench.roofline import MachinePeaks, count_module, measure_cpu_peaks


def _module(build):
    """A one-function module: ``build(bb, params) -> output`` inside a dataflow block."""
    bb = relax.BlockBuilder()
    params = []

    def param(name, shape):
        var = relax.Var(name, relax.TensorType(shape, "float32"))
        params.append(var)
        return var

    body = build(param)
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb))
        bb.emit_func_output(out)
    return bb.get()


def test_conv2d():
    # x [1,2,5,5], w [4,2,3,3], pad 1 -> y [1,4,5,5]: 100 outputs x 18 MACs x 2.
    def build(param):
        x, w = param("x", (1, 2, 5, 5)), param("w", (4, 2, 3, 3))
        return lambda bb: relax.op.nn.conv2d(x, w, padding=1)

    counts = count_module(_module(build))
    assert counts.flops == 2 * 100 * 18
    assert counts.bytes == 4 * (50 + 72 + 100)
    assert counts.bytes_min == counts.bytes
    assert counts.per_op["relax.nn.conv2d"].calls == 1


def test_grouped_conv_and_conv_transpose():
    def build(param):
        x, w = param("x", (1, 4, 6, 6), ), param("w", (4, 1, 3, 3))
        return lambda bb: relax.op.nn.conv2d(x, w, padding=1, groups=4)

    assert count_module(_module(build)).flops == 2 * (4 * 36) * 9

    # conv2d_transpose x [1,3,2,2], w [3,5,4,4] (IOHW), stride 2 -> [1,5,4,4].
    # Useful work: every input element scatters into 5 x 4 x 4 outputs: 12 * 80 MACs.
    def build_t(param):
        x, w = param("x", (1, 3, 2, 2)), param("w", (3, 5, 4, 4))
        return lambda bb: relax.op.nn.conv2d_transpose(x, w, strides=2, padding=1)

    counts = count_module(_module(build_t))
    assert counts.flops == 2 * 12 * 80
    assert counts.bytes == 4 * (12 + 240 + 80)


def test_matmul_and_batched_matmul():
    def build(param):
        a, b = param("a", (3, 4)), param("b", (4, 5))
        return lambda bb: relax.op.matmul(a, b)

    counts = count_module(_module(build))
    assert counts.flops == 2 * 15 * 4
    assert counts.bytes == 4 * (12 + 20 + 15)

    def build_b(param):
        a, b = param("a", (2, 3, 4)), param("b", (2, 4, 5))
        return lambda bb: relax.op.matmul(a, b)

    assert count_module(_module(build_b)).flops == 2 * 30 * 4


def test_elementwise_chain_views_and_movement():
    # add: 6 FLOPs, reads 2 x 6 floats, writes 6. relu on the sum: 6 FLOPs, 12 floats.
    # reshape: a view, 0 bytes. transpose: data movement, 0 FLOPs but 12 floats moved.
    def build(param):
        a, b = param("a", (2, 3)), param("b", (2, 3))

        def body(bb):
            s = bb.emit(relax.op.add(a, b))
            r = bb.emit(relax.op.nn.relu(s))
            v = bb.emit(relax.op.reshape(r, (3, 2)))
            return relax.op.permute_dims(v)

        return body

    counts = count_module(_module(build))
    assert counts.per_op["relax.add"].flops == 6
    assert counts.per_op["relax.add"].bytes == 4 * 18
    assert counts.per_op["relax.nn.relu"].flops == 6
    assert counts.per_op["relax.nn.relu"].bytes == 4 * 12
    assert counts.per_op["relax.reshape"].bytes == 0
    assert counts.per_op["relax.permute_dims"].flops == 0
    assert counts.per_op["relax.permute_dims"].bytes == 4 * 12
    assert counts.flops == 12
    assert counts.bytes == 4 * (18 + 12 + 12)
    assert counts.bytes_min == 4 * (6 + 6 + 6)


def test_same_tensor_read_twice_counts_once():
    def build(param):
        a = param("a", (4, 4))
        return lambda bb: relax.op.multiply(a, a)

    counts = count_module(_module(build))
    assert counts.flops == 16
    assert counts.bytes == 4 * 32


def test_einsum_and_pooling():
    def build(param):
        a, b = param("a", (2, 3, 4)), param("b", (2, 4, 5))
        return lambda bb: relax.op.einsum((a, b), "bik,bkj->bij")

    assert count_module(_module(build)).flops == 2 * (2 * 3 * 4 * 5)

    def build_p(param):
        x = param("x", (1, 2, 8, 8))
        pool = relax.op.nn.max_pool2d
        return lambda bb: pool(x, pool_size=(3, 3), strides=(1, 1), padding=(1, 1))

    assert count_module(_module(build_p)).flops == 2 * 64 * 9


def test_bounds_use_the_slower_roof():
    def build(param):
        a, b = param("a", (3, 4)), param("b", (4, 5))
        return lambda bb: relax.op.matmul(a, b)

    counts = count_module(_module(build))  # 120 FLOPs, 188 bytes
    compute_bound = MachinePeaks(flops_per_s=1.0, bytes_per_s=1e9, how="")
    memory_bound = MachinePeaks(flops_per_s=1e9, bytes_per_s=1.0, how="")
    assert counts.bound_s(compute_bound) == pytest.approx(120.0)
    assert counts.bound_s(memory_bound) == pytest.approx(188.0)
    assert counts.intensity() == pytest.approx(120 / 188)


def test_measured_peaks_are_plausible():
    peaks = measure_cpu_peaks(matmul_size=256, copy_mib=8, repeats=2)
    assert 1e8 < peaks.flops_per_s < 1e14
    assert 1e8 < peaks.bytes_per_s < 1e13
