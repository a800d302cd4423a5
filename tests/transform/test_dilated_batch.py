"""Rule dilated-to-batch (tvm_ollie.transform.dilated_batch): dilated convolutions as dense ones
over the interleaved sub-grids, and the chain of operators that commute with it; every
rewritten module against TVM's build of the original, tiny shapes."""

import numpy as np
import pytest

from tvm_ollie.compat import relax, tvm
from tvm_ollie.transform.dilated_batch import batch_to_space, dilated_to_batch, space_to_batch

RNG = np.random.default_rng(0)


def _const(shape):
    return relax.const(RNG.standard_normal(shape).astype("float32"))


def _conv(bb, x, o, k, pad, dil, groups=1):
    c = int(x.ty.shape[1])
    return bb.emit(relax.op.nn.conv2d(x, _const((o, c // groups, k, k)), padding=pad,
                                      dilation=dil, groups=groups))


def _module(shape, body):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, x):
    ex = tvm.compile(mod, target="llvm")
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _calls(mod, name):
    return mod.script().count(name)


def _check(shape, body, expect):
    mod = _module(shape, body)
    new, count = dilated_to_batch(mod)
    assert count == expect
    x = RNG.standard_normal(shape).astype("float32")
    np.testing.assert_allclose(_run(new, x), _run(mod, x), rtol=1e-4, atol=1e-4)
    return new


def test_chain_runs_on_subgrids():
    """CSRNet's pattern (dilated conv, per-channel bias, ReLU, twice, then a 1x1 conv), batch 2,
    non-square: one space-to-batch, one batch-to-space, no dilation left."""
    def body(bb, x):
        for o in (6, 4):
            y = _conv(bb, x, o, 3, (2, 2, 2, 2), (2, 2))
            y = bb.emit(relax.op.add(y, _const((1, o, 1, 1))))
            x = bb.emit(relax.op.nn.relu(y))
        return _conv(bb, x, 1, 1, (0, 0, 0, 0), (1, 1))

    new = _check((2, 5, 8, 6), body, 3)
    assert "dilation=[2, 2]" not in new.script()
    assert _calls(new, "R.permute_dims") == 2


def test_other_dilations_and_groups():
    """Dilation (3, 1) with paddings (3, 1), grouped; then dilation 2 on the result: the grids
    differ, so the second convolution starts from the first's batch-to-space."""
    def body(bb, x):
        y = _conv(bb, x, 4, 3, (3, 1, 3, 1), (3, 1), groups=2)
        return _conv(bb, y, 2, 3, (2, 2, 2, 2), (2, 2))

    _check((1, 4, 12, 4), body, 2)


def test_mixing_consumer_reads_the_restored_tensor():
    """A residual add of two sub-grid values stays on the grid; a consumer that mixes
    positions (a 3x3 undilated conv) and an operand per position read the batch-to-space."""
    def body(bb, x):
        y = _conv(bb, x, 3, 3, (2, 2, 2, 2), (2, 2))
        z = _conv(bb, y, 3, 3, (2, 2, 2, 2), (2, 2))
        s = bb.emit(relax.op.add(y, z))
        t = bb.emit(relax.op.multiply(s, _const((1, 1, 4, 4))))
        return _conv(bb, t, 2, 3, (1, 1, 1, 1), (1, 1))

    new = _check((1, 3, 4, 4), body, 2)
    assert _calls(new, "R.permute_dims") == 2


@pytest.mark.parametrize("shape, pad, stride", [
    ((1, 3, 7, 8), (2, 2, 2, 2), 1),   # H not a multiple of the dilation
    ((1, 3, 8, 8), (1, 1, 1, 1), 1),   # padding not a multiple
    ((1, 3, 8, 8), (2, 2, 2, 2), 2),   # strided
])
def test_unaligned_left_alone(shape, pad, stride):
    """Where the sub-grid form would need padding or strides of its own the rule declines."""
    mod = _module(shape, lambda bb, x: bb.emit(relax.op.nn.conv2d(
        x, _const((2, 3, 3, 3)), strides=stride, padding=pad, dilation=2)))
    new, count = dilated_to_batch(mod)
    assert count == 0 and new is mod


def test_space_to_batch_round_trip():
    """batch_to_space inverts space_to_batch, and sub-grid (r, s) holds X[.., dh*i+r, dw*j+s]."""
    x = RNG.standard_normal((2, 3, 6, 4)).astype("float32")
    mod = _module(x.shape, lambda bb, v: bb.emit(space_to_batch(v, (3, 2))))
    grids = _run(mod, x)
    assert grids.shape == (12, 3, 2, 2)
    r, s, n = 2, 1, 1
    np.testing.assert_array_equal(grids[(r * 2 + s) * 2 + n], x[n, :, r::3, s::2])
    back = _module(grids.shape, lambda bb, v: bb.emit(batch_to_space(v, (3, 2), 2)))
    np.testing.assert_array_equal(_run(back, grids), x)
