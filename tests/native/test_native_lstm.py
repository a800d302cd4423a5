"""tvm_ollie.cpu.lstm against a float64 numpy LSTM (ONNX's equations): directions, initial
states, batch sizes, one and two threads, through tvm-ffi and through Relax; bad arguments."""

import numpy as np
import pytest
import tvm_ffi

from tvm_ollie import native
from tvm_ollie.frontend.onnx_native import LSTM_KERNEL

from native_util import call_direct, call_relax, require_native, two_threads_stall_on


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(LSTM_KERNEL):
        pytest.skip("native library built before lstm")


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference(x, w, r, b, h0, c0, direction):
    """ONNX LSTM (gates iofc, default activations) in float64: ``Y [T, D, N, H]``; ``w``, ``r``
    and ``b`` in ONNX's layout (``[D, 4H, I]``, ``[D, 4H, H]``, ``[D, 8H]``)."""
    steps, dirs, hidden = x.shape[0], w.shape[0], r.shape[2]
    y = np.zeros((steps, dirs, x.shape[1], hidden))
    for d in range(dirs):
        h, c = h0[d].astype(np.float64), c0[d].astype(np.float64)
        bias = b[d, :4 * hidden] + b[d, 4 * hidden:]
        backwards = direction == "reverse" or d == 1
        for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
            g = x[t] @ w[d].T.astype(np.float64) + h @ r[d].T + bias
            i, o, f, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cc)
            h = _sigmoid(o) * np.tanh(c)
            y[t, d] = h
    return y


def _case(direction, steps, batch, size, hidden, initial, seed=0):
    rng = np.random.default_rng(seed)
    dirs = 2 if direction == "bidirectional" else 1

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)

    x, w, r, b = rand(steps, batch, size), rand(dirs, 4 * hidden, size), \
        rand(dirs, 4 * hidden, hidden), rand(dirs, 8 * hidden)
    zeros = np.zeros((dirs, batch, hidden), np.float32)
    h0, c0 = (rand(dirs, batch, hidden), rand(dirs, batch, hidden)) if initial else (zeros, zeros)
    return x, w, r, b, h0, c0


def _packed(x, w, r, b, h0, c0):
    """The kernel's operands: W side by side transposed, R transposed, Wb + Rb."""
    hidden = r.shape[2]
    packed_w = np.concatenate([w[d].T for d in range(w.shape[0])], axis=1)
    return [x, packed_w, r.transpose(0, 2, 1), b[:, :4 * hidden] + b[:, 4 * hidden:], h0, c0]


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("threads", [1, 2])
def test_against_numpy(direction, initial, batch, threads):
    case = _case(direction, steps=5, batch=batch, size=7, hidden=9, initial=initial)
    dirs = case[1].shape[0]
    previous = native.get_num_threads()
    native.set_num_threads(threads)
    try:
        out = call_direct(LSTM_KERNEL, f"dir={direction}", _packed(*case), (5, dirs, batch, 9))
    finally:
        native.set_num_threads(previous)
    np.testing.assert_allclose(out, reference(*case, direction), rtol=1e-5, atol=1e-5)


def test_parallel_directions_wide_hidden():
    """Two threads, every call parallel (the projection's matmul), a hidden size whose rows are
    not a multiple of four (the step product's tail) and a wide gate row."""
    case = _case("bidirectional", steps=6, batch=2, size=5, hidden=37, initial=True, seed=3)
    with two_threads_stall_on():
        out = call_direct(LSTM_KERNEL, "dir=bidirectional", _packed(*case), (6, 2, 2, 37))
    np.testing.assert_allclose(out, reference(*case, "bidirectional"), rtol=1e-5, atol=1e-5)


def test_through_relax():
    case = _case("bidirectional", steps=3, batch=2, size=4, hidden=6, initial=True, seed=1)
    out = call_relax(LSTM_KERNEL, "dir=bidirectional", _packed(*case), (3, 2, 2, 6))
    np.testing.assert_allclose(out, reference(*case, "bidirectional"), rtol=1e-5, atol=1e-5)


def test_bad_shapes_and_attrs():
    case = _packed(*_case("forward", steps=2, batch=1, size=3, hidden=4, initial=False))
    with pytest.raises(ValueError, match="H0 has shape"):
        call_direct(LSTM_KERNEL, "dir=forward", case[:4] + [np.zeros((1, 2, 4), np.float32),
                                                            case[5]], (2, 1, 1, 4))
    with pytest.raises(ValueError, match="Y has shape"):
        call_direct(LSTM_KERNEL, "dir=forward", case, (2, 2, 1, 4))
    with pytest.raises(ValueError, match="R has shape"):  # one direction's R for two
        call_direct(LSTM_KERNEL, "dir=bidirectional", case, (2, 2, 1, 4))
    with pytest.raises(ValueError):
        call_direct(LSTM_KERNEL, "dir=sideways", case, (2, 1, 1, 4))
    with pytest.raises(TypeError, match="expected 8 arguments"):
        tvm_ffi.get_global_func(LSTM_KERNEL)("dir=forward")


def _quantize_centered(a):
    """ONNX Runtime's dynamic quantization of ``a`` (float32 arithmetic): ``(q - z, scale)``."""
    f32 = np.float32
    lo, hi = min(f32(a.min()), f32(0)), max(f32(a.max()), f32(0))
    scale = f32(1) if hi == lo else f32((hi - lo) / f32(255))
    zero = np.clip(np.rint(f32(0) - lo / scale), 0, 255).astype(f32)
    q = np.clip(np.rint(a / scale) + zero, 0, 255).astype(f32)
    return (q - zero).astype(np.int64), scale


def quantized_reference(x, w, r, b, h0, c0, ws, rs, direction):
    """DynamicQuantizeLSTM's arithmetic (``w`` ``[D, I, 4H]``, ``r`` ``[D, H, 4H]`` centered
    integers, ``ws``/``rs`` ``[D, 4H]``): integer sums, float32 scaling, gates in float64."""
    steps, dirs, hidden = x.shape[0], w.shape[0], r.shape[1]
    y = np.zeros((steps, dirs, x.shape[1], hidden))
    xq, xs = _quantize_centered(x)
    for d in range(dirs):
        xw = ((xq @ w[d].astype(np.int64)).astype(np.float32) * (xs * ws[d])).astype(np.float32)
        h, c = h0[d].astype(np.float32), c0[d].astype(np.float64)
        backwards = direction == "reverse" or d == 1
        for t in (range(steps - 1, -1, -1) if backwards else range(steps)):
            hq, hs = _quantize_centered(h)
            hr = (hq @ r[d].astype(np.int64)).astype(np.float32) * (hs * rs[d])
            g = ((xw[t] + hr) + b[d]).astype(np.float64)
            i, o, f, cc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
            c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(cc)
            h = (_sigmoid(o) * np.tanh(c)).astype(np.float32)
            y[t, d] = h
    return y


@pytest.mark.parametrize("direction,batch", [("forward", 1), ("reverse", 2),
                                             ("bidirectional", 3)])
def test_quantized_against_numpy(direction, batch):
    """quant=1, weights spanning [-255, 255] and K = 300 (two exact chunks of K)."""
    rng = np.random.default_rng(7)
    dirs, size, hidden, steps = (2 if direction == "bidirectional" else 1), 300, 5, 4
    x = rng.standard_normal((steps, batch, size)).astype(np.float32)
    w = rng.integers(-255, 256, (dirs, size, 4 * hidden)).astype(np.float32)
    r = rng.integers(-255, 256, (dirs, hidden, 4 * hidden)).astype(np.float32)
    ws = (rng.random((dirs, 4 * hidden)) * 1e-4).astype(np.float32)
    rs = (rng.random((dirs, 4 * hidden)) * 1e-2).astype(np.float32)
    b = rng.standard_normal((dirs, 4 * hidden)).astype(np.float32)
    h0 = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    c0 = rng.standard_normal((dirs, batch, hidden)).astype(np.float32)
    packed_w = np.concatenate(list(w), axis=1)
    out = call_direct(LSTM_KERNEL, f"dir={direction};quant=1",
                      [x, packed_w, r, b, h0, c0, ws, rs], (steps, dirs, batch, hidden))
    expected = quantized_reference(x, w, r, b, h0, c0, ws, rs, direction)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
