"""Every registered Relax lift against TVM's own legalization, run in the Relax VM.

All cases are built into one IRModule (one function per case) and compiled once, so the file
pays for a single ``tvm.compile``. Each lifted expression is evaluated by the reference
interpreter and compared with the VM's output; simple ops are also compared with numpy. The same
module, legalized, is used to check the ``call_tir`` path (PrimFuncs made by TOPI): those lifts
must be exact or raise ``LiftError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax, tirx  # noqa: E402

from tvm_ollie.ir.interp import evaluate  # noqa: E402
from tvm_ollie.ir.nodes import Scope  # noqa: E402
from tvm_ollie.lift import (  # noqa: E402
    LiftError,
    constant_arrays,
    lift,
    lift_via_legalize,
    registered_ops,
)

R = relax.op
F32 = "float32"


@dataclass
class Case:
    """One Relax call: named inputs, how to build the call, how to draw inputs."""

    cid: str
    inputs: Dict[str, Tuple[int, ...]]
    make: Callable
    positive: object = False  # True: inputs in [0.5, 2); "wide": in [-8, 8)
    numpy_ref: Optional[Callable] = None
    fallback: bool = False  # lift through TVM's legalization (op without a registered lift)


CASES = []


def case(cid, inputs, make, positive=False, numpy_ref=None, fallback=False):
    CASES.append(Case(cid, inputs, make, positive, numpy_ref, fallback))


# ---- convolutions ---------------------------------------------------------------------------
X = {"x": (1, 3, 6, 6), "w": (4, 3, 3, 3)}
case("conv2d-basic", X, lambda x, w: R.nn.conv2d(x, w, padding=1))
case("conv2d-out-dtype-f64", X, lambda x, w: R.nn.conv2d(x, w, padding=1, out_dtype="float64"))
case("astype-f16", {"x": (2, 5)}, lambda x: R.astype(x, "float16"))
case("conv2d-stride2-asym-dil2", {"x": (2, 3, 9, 8), "w": (4, 3, 3, 3)},
     lambda x, w: R.nn.conv2d(x, w, strides=2, padding=(1, 0, 2, 1), dilation=2))
case("conv2d-stride-hw", {"x": (1, 2, 7, 9), "w": (3, 2, 2, 3)},
     lambda x, w: R.nn.conv2d(x, w, strides=(2, 3), padding=(0, 1)))
case("conv2d-groups2", {"x": (1, 4, 6, 6), "w": (6, 2, 3, 3)},
     lambda x, w: R.nn.conv2d(x, w, padding=1, groups=2))
case("conv2d-depthwise", {"x": (1, 4, 7, 7), "w": (4, 1, 3, 3)},
     lambda x, w: R.nn.conv2d(x, w, padding=1, groups=4))
case("conv2d-depthwise-mult2", {"x": (1, 3, 5, 5), "w": (6, 1, 3, 3)},
     lambda x, w: R.nn.conv2d(x, w, strides=2, padding=1, groups=3))
case("conv2d-1x1-stride2", {"x": (2, 3, 5, 5), "w": (4, 3, 1, 1)},
     lambda x, w: R.nn.conv2d(x, w, strides=2))
case("conv2d-nhwc-hwio", {"x": (1, 6, 6, 3), "w": (3, 3, 3, 4)},
     lambda x, w: R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="HWIO"))
case("conv2d-nhwc-ohwi-groups", {"x": (1, 5, 5, 4), "w": (6, 3, 3, 2)},
     lambda x, w: R.nn.conv2d(x, w, padding=(1, 0, 0, 1), groups=2, data_layout="NHWC",
                              kernel_layout="OHWI"))
case("conv2d-nchw-hwio", {"x": (1, 3, 5, 5), "w": (3, 3, 3, 2)},
     lambda x, w: R.nn.conv2d(x, w, strides=2, padding=1, kernel_layout="HWIO"))
case("conv1d-basic", {"x": (2, 3, 10), "w": (4, 3, 3)}, lambda x, w: R.nn.conv1d(x, w))
case("conv1d-stride-dil-pad", {"x": (1, 4, 11), "w": (2, 2, 3)},
     lambda x, w: R.nn.conv1d(x, w, strides=2, dilation=2, padding=(2, 1), groups=2))
case("conv1d-nwc-wio", {"x": (1, 8, 3), "w": (3, 3, 5)},
     lambda x, w: R.nn.conv1d(x, w, padding=1, data_layout="NWC", kernel_layout="WIO"))
case("conv3d-basic", {"x": (1, 2, 4, 5, 5), "w": (3, 2, 3, 3, 3)},
     lambda x, w: R.nn.conv3d(x, w, padding=1, strides=(1, 2, 2)))

TX = {"x": (1, 3, 4, 4), "w": (3, 4, 3, 3)}
case("tconv2d-s2-p1-op1", TX,
     lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, padding=1, output_padding=1))
case("tconv2d-s1", TX, lambda x, w: R.nn.conv2d_transpose(x, w))
case("tconv2d-k4-s2-p1", {"x": (2, 3, 4, 5), "w": (3, 2, 4, 4)},
     lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, padding=1))
case("tconv2d-s3-asym", {"x": (1, 2, 3, 4), "w": (2, 3, 3, 2)},
     lambda x, w: R.nn.conv2d_transpose(x, w, strides=(3, 2), padding=(1, 0, 2, 1),
                                        output_padding=(2, 1)))
case("tconv2d-dil2", {"x": (1, 2, 4, 4), "w": (2, 3, 3, 3)},
     lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, dilation=2, padding=1))
case("tconv2d-groups2", {"x": (1, 4, 3, 3), "w": (4, 3, 3, 3)},
     lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, padding=1, groups=2))
case("tconv2d-depthwise", {"x": (1, 3, 3, 3), "w": (3, 1, 2, 2)},
     lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, groups=3))
case("tconv1d-s2", {"x": (1, 3, 5), "w": (3, 2, 3)},
     lambda x, w: R.nn.conv1d_transpose(x, w, strides=2, padding=1, output_padding=1))
case("tconv1d-groups-dil", {"x": (1, 4, 4), "w": (4, 1, 2)},
     lambda x, w: R.nn.conv1d_transpose(x, w, strides=3, dilation=2, groups=2))
case("tconv3d", {"x": (1, 2, 2, 3, 3), "w": (2, 2, 2, 3, 3)},
     lambda x, w: R.nn.conv3d_transpose(x, w, strides=(1, 2, 2), padding=(0, 1, 1)))

# ---- matmul ---------------------------------------------------------------------------------
case("matmul-2d", {"a": (3, 4), "b": (4, 5)}, R.matmul, numpy_ref=np.matmul)
case("matmul-batched", {"a": (2, 3, 4), "b": (2, 4, 5)}, R.matmul, numpy_ref=np.matmul)
case("matmul-broadcast", {"a": (2, 1, 3, 4), "b": (5, 4, 2)}, R.matmul, numpy_ref=np.matmul)
case("matmul-broadcast-lhs", {"a": (3, 4), "b": (2, 4, 5)}, R.matmul, numpy_ref=np.matmul)
case("matmul-vec-mat", {"a": (4,), "b": (4, 5)}, R.matmul, numpy_ref=np.matmul)
case("matmul-mat-vec", {"a": (2, 3, 4), "b": (4,)}, R.matmul, numpy_ref=np.matmul)
case("matmul-vec-vec", {"a": (4,), "b": (4,)}, R.matmul, numpy_ref=np.matmul)
case("matmul-k1", {"a": (3, 1), "b": (1, 5)}, R.matmul, numpy_ref=np.matmul)

# ---- elementwise ----------------------------------------------------------------------------
for _name, _np in [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply),
                   ("divide", np.divide), ("maximum", np.maximum), ("minimum", np.minimum)]:
    case(f"{_name}-same", {"a": (2, 3), "b": (2, 3)}, getattr(R, _name), numpy_ref=_np)
    case(f"{_name}-bcast", {"a": (2, 3, 4), "b": (3, 1)}, getattr(R, _name), numpy_ref=_np)
case("add-bcast-both", {"a": (1, 4), "b": (3, 1)}, R.add, numpy_ref=np.add)
case("power", {"a": (2, 3), "b": (3,)}, R.power, positive=True, numpy_ref=np.power)
case("divide-scalar-const", {"a": (2, 3)}, lambda a: R.divide(a, relax.const(2.5, F32)),
     numpy_ref=lambda a: a / np.float32(2.5))
case("subtract-const-tensor", {"a": (2, 4)},
     lambda a: R.subtract(relax.const(np.arange(4, dtype=F32)), a),
     numpy_ref=lambda a: np.arange(4, dtype=F32) - a)
case("add-0d-var", {"a": (2, 3), "s": ()}, R.add, numpy_ref=np.add)
for _name, _np, _pos in [
    ("nn.relu", lambda a: np.maximum(a, 0), False), ("tanh", np.tanh, False),
    ("sigmoid", lambda a: 1 / (1 + np.exp(-a)), False), ("exp", np.exp, False),
    ("log", np.log, True), ("sqrt", np.sqrt, True), ("rsqrt", lambda a: 1 / np.sqrt(a), True),
    ("erf", None, False), ("abs", np.abs, False), ("negative", np.negative, False),
    ("nn.gelu", None, False), ("nn.gelu_tanh", None, False), ("nn.silu", None, False),
    ("nn.relu6", lambda a: np.clip(a, 0, 6), "wide"), ("square", np.square, False),
]:
    _f = R
    for _part in _name.split("."):
        _f = getattr(_f, _part)
    for _shape in [(2, 3, 4), (7,)]:
        case(f"{_name}-{len(_shape)}d", {"a": _shape}, _f, positive=_pos, numpy_ref=_np)
case("clip", {"a": (3, 4)}, lambda a: R.clip(a, -0.5, 0.25),
     numpy_ref=lambda a: np.clip(a, -0.5, 0.25))
case("leakyrelu", {"a": (3, 4)}, lambda a: R.nn.leakyrelu(a, 0.1),
     numpy_ref=lambda a: np.where(a > 0, a, a * np.float32(0.1)))

# ---- pooling --------------------------------------------------------------------------------
P = {"x": (1, 2, 7, 7)}
case("maxpool-k3s2p1", P, lambda x: R.nn.max_pool2d(x, 3, strides=2, padding=1))
case("maxpool-k2s2", {"x": (2, 3, 6, 8)}, lambda x: R.nn.max_pool2d(x, 2, strides=2))
case("maxpool-ceil", {"x": (1, 2, 8, 8)},
     lambda x: R.nn.max_pool2d(x, 3, strides=2, ceil_mode=True))
case("maxpool-dil-asym", P,
     lambda x: R.nn.max_pool2d(x, (2, 3), strides=(1, 2), dilation=2, padding=(0, 1, 1, 0)))
case("maxpool-nhwc", {"x": (1, 6, 6, 3)},
     lambda x: R.nn.max_pool2d(x, 3, strides=1, padding=1, layout="NHWC"))
case("maxpool-ceil-drop-last", {"x": (1, 1, 4, 4)},
     lambda x: R.nn.max_pool2d(x, 1, strides=2, ceil_mode=True))
case("maxpool-ceil-pad", {"x": (1, 2, 5, 6)},
     lambda x: R.nn.max_pool2d(x, 2, strides=2, padding=1, ceil_mode=True))
for _inc in (True, False):
    _t = "incl" if _inc else "excl"
    case(f"avgpool-k3s2p1-{_t}", P,
         lambda x, _inc=_inc: R.nn.avg_pool2d(x, 3, strides=2, padding=1, count_include_pad=_inc))
    case(f"avgpool-ceil-{_t}", P,
         lambda x, _inc=_inc: R.nn.avg_pool2d(x, 3, strides=2, padding=1, ceil_mode=True,
                                              count_include_pad=_inc))
    case(f"avgpool-dil-asym-{_t}", {"x": (1, 2, 8, 7)},
         lambda x, _inc=_inc: R.nn.avg_pool2d(x, (3, 2), strides=(2, 1), dilation=(2, 1),
                                              padding=(2, 0, 1, 1), count_include_pad=_inc))
    case(f"avgpool-ceil-drop-last-{_t}", {"x": (1, 1, 4, 5)},
         lambda x, _inc=_inc: R.nn.avg_pool2d(x, (1, 2), strides=2, ceil_mode=True,
                                              count_include_pad=_inc))
    case(f"avgpool-ceil-pad-{_t}", {"x": (1, 2, 5, 6)},
         lambda x, _inc=_inc: R.nn.avg_pool2d(x, 2, strides=2, padding=1, ceil_mode=True,
                                              count_include_pad=_inc))
    case(f"avgpool-nhwc-{_t}", {"x": (1, 5, 5, 2)},
         lambda x, _inc=_inc: R.nn.avg_pool2d(x, 2, strides=2, padding=1, layout="NHWC",
                                              count_include_pad=_inc))
case("avgpool-global", {"x": (2, 3, 4, 4)}, lambda x: R.nn.avg_pool2d(x, 4))
case("maxpool1d", {"x": (1, 2, 9)}, lambda x: R.nn.max_pool1d(x, 3, strides=2, padding=1))
case("avgpool1d", {"x": (1, 2, 9)}, lambda x: R.nn.avg_pool1d(x, 3, strides=2, padding=1))
case("maxpool3d", {"x": (1, 1, 4, 5, 5)}, lambda x: R.nn.max_pool3d(x, 2, strides=2,
                                                                    padding=(0, 1, 1, 1, 0, 0)))
case("avgpool3d-excl", {"x": (1, 1, 4, 5, 5)},
     lambda x: R.nn.avg_pool3d(x, 2, strides=2, padding=(0, 1, 1, 1, 0, 0)))

# ---- reductions -----------------------------------------------------------------------------
S = {"a": (2, 3, 4)}
for _name, _np in [("sum", np.sum), ("mean", np.mean), ("max", np.max)]:
    _f = getattr(R, _name)
    case(f"{_name}-axis1-keep", S, lambda a, _f=_f: _f(a, axis=[1], keepdims=True),
         numpy_ref=lambda a, _np=_np: _np(a, axis=1, keepdims=True))
    case(f"{_name}-all", S, lambda a, _f=_f: _f(a), numpy_ref=lambda a, _np=_np: _np(a))
    case(f"{_name}-neg-axes", S, lambda a, _f=_f: _f(a, axis=[0, -1]),
         numpy_ref=lambda a, _np=_np: _np(a, axis=(0, 2)))
    case(f"{_name}-all-keep", S, lambda a, _f=_f: _f(a, keepdims=True),
         numpy_ref=lambda a, _np=_np: _np(a, keepdims=True))
case("sum-unit-axis", {"a": (2, 1, 4)}, lambda a: R.sum(a, axis=[1]),
     numpy_ref=lambda a: a.sum(axis=1))

# ---- layout ---------------------------------------------------------------------------------
case("permute-201", S, lambda a: R.permute_dims(a, [2, 0, 1]),
     numpy_ref=lambda a: a.transpose(2, 0, 1))
case("permute-default", S, lambda a: R.permute_dims(a), numpy_ref=lambda a: a.transpose())
case("permute-4d", {"a": (1, 2, 3, 4)}, lambda a: R.permute_dims(a, [0, 2, 3, 1]),
     numpy_ref=lambda a: a.transpose(0, 2, 3, 1))
for _shape in [(6, 4), (4, 6), (24,), (2, 12), (3, 2, 4), (1, 24, 1), (2, 2, 2, 3)]:
    case(f"reshape-{'x'.join(map(str, _shape))}", S, lambda a, _s=_shape: R.reshape(a, _s),
         numpy_ref=lambda a, _s=_shape: a.reshape(_s))
case("reshape-unflatten", {"a": (4, 64)}, lambda a: R.reshape(a, (1, 4, 8, 8)),
     numpy_ref=lambda a: a.reshape(1, 4, 8, 8))
case("broadcast_to", {"a": (3, 1)}, lambda a: R.broadcast_to(a, (2, 3, 4)),
     numpy_ref=lambda a: np.broadcast_to(a, (2, 3, 4)))
case("broadcast_to-same-rank", {"a": (1, 4)}, lambda a: R.broadcast_to(a, (3, 4)),
     numpy_ref=lambda a: np.broadcast_to(a, (3, 4)))
case("expand_dims", S, lambda a: R.expand_dims(a, [0, 2]),
     numpy_ref=lambda a: a.reshape(1, 2, 1, 3, 4))
case("squeeze", {"a": (2, 1, 3, 1)}, lambda a: R.squeeze(a, [1]),
     numpy_ref=lambda a: a.reshape(2, 3, 1))
case("flatten", S, lambda a: R.flatten(a), numpy_ref=lambda a: a.reshape(-1))
for _k, (_ax, _b, _e, _s) in enumerate([
    ([1], [1], [3], [1]), ([2], [0], [4], [2]), ([0, 2], [-1, -1], [-3, 0], [-1, -2]),
    ([2], [-3], [100], [1]), ([2], [10], [-100], [-3]), ([1, 2], [0, 1], [2, 3], [2, 1]),
]):
    def _ref(a, _ax=_ax, _b=_b, _e=_e, _s=_s):
        sl = [slice(None)] * a.ndim
        for ax, b, e, s in zip(_ax, _b, _e, _s):
            sl[ax] = slice(b, e, s)
        return a[tuple(sl)]

    case(f"strided_slice-{_k}", {"a": (3, 4, 5)},
         lambda a, _ax=_ax, _b=_b, _e=_e, _s=_s: R.strided_slice(a, _ax, _b, _e, _s),
         numpy_ref=_ref)
case("concat-axis1", {"a": (2, 3, 4), "b": (2, 2, 4)}, lambda a, b: R.concat([a, b], axis=1),
     numpy_ref=lambda a, b: np.concatenate([a, b], axis=1))
case("concat-3-neg-axis", {"a": (2, 3), "b": (2, 1), "c": (2, 4)},
     lambda a, b, c: R.concat([a, b, c], axis=-1),
     numpy_ref=lambda a, b, c: np.concatenate([a, b, c], axis=-1))
case("concat-same-twice", {"a": (2, 3)}, lambda a: R.concat([a, a], axis=0),
     numpy_ref=lambda a: np.concatenate([a, a], axis=0))
case("pad-zero", {"a": (1, 2, 3, 3)},
     lambda a: R.nn.pad(a, pad_width=[0, 0, 0, 1, 1, 1, 2, 0]),
     numpy_ref=lambda a: np.pad(a, ((0, 0), (0, 1), (1, 1), (2, 0))))
# take with constant affine indices (an exported window), see lift/gather.py
_I64 = "int64"


def _take(idx, axis):
    arr = np.asarray(idx, dtype=_I64)
    return lambda a: R.take(a, relax.const(arr, _I64), axis=axis)


case("take-slice", {"a": (3, 8, 2)}, _take(np.arange(2, 7), 1))
case("take-strided", {"a": (9, 4)}, _take(np.arange(1, 9, 3), 0))
case("take-band-dilated", {"a": (2, 14, 3)},
     _take(np.arange(6)[:, None] + 2 * np.arange(5)[None, :], 1))
case("take-broadcast", {"a": (5, 3)}, _take(np.tile(np.arange(3)[None, :], (4, 1)), 1))
case("gather_nd-band", {"a": (14, 2, 3)}, lambda a: R.gather_nd(a, relax.const(
    (np.arange(6)[:, None] + 2 * np.arange(5)[None, :])[..., None].astype(_I64), _I64)))
case("gather_nd-2d", {"a": (5, 6, 2)}, lambda a: R.gather_nd(a, relax.const(
    np.stack([np.arange(4), 5 - np.arange(4)], axis=-1).astype(_I64), _I64)))
case("take-scalar", {"a": (4, 5)}, _take(3, 1))
case("pad-value", {"a": (2, 3)}, lambda a: R.nn.pad(a, pad_width=[1, 0, 0, 2], pad_value=1.5),
     numpy_ref=lambda a: np.pad(a, ((1, 0), (0, 2)), constant_values=1.5))


# ---- ops without a registered lift, through the legalization fallback -------------------------
N = {"x": (2, 5), "g": (5,), "b": (5,)}
case("fallback-softmax", {"x": (2, 5)}, lambda x: R.nn.softmax(x), fallback=True)
case("fallback-log_softmax", {"x": (2, 5)}, lambda x: R.nn.log_softmax(x, axis=0),
     fallback=True)
case("fallback-layer_norm", N, lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[-1]),
     fallback=True)
case("fallback-rms_norm", {"x": (2, 5), "g": (5,)},
     lambda x, g: R.nn.rms_norm(x, g, axes=[-1]), fallback=True)
case("fallback-variance", {"x": (2, 5)}, lambda x: R.variance(x, axis=[1]), fallback=True)
case("fallback-tile", {"x": (2, 5)}, lambda x: R.tile(x, (2, 1)), fallback=True)
case("fallback-reflect-pad", {"x": (3, 4)},
     lambda x: R.nn.pad(x, [1, 1, 2, 2], pad_mode="reflect"), fallback=True)
case("fallback-prelu", {"x": (2, 5), "g": (5,)}, lambda x, g: R.nn.prelu(x, g), fallback=True)
case("fallback-registered-op", {"x": (1, 2, 6, 6), "w": (3, 2, 3, 3)},
     lambda x, w: R.nn.conv2d(x, w, padding=1), fallback=True)


# ---- harness --------------------------------------------------------------------------------
def _build(cases):
    bb = relax.BlockBuilder()
    for k, c in enumerate(cases):
        params = [relax.Var(n, relax.TensorType(s, F32)) for n, s in c.inputs.items()]
        with bb.function(f"f{k}", params):
            with bb.dataflow():
                out = bb.emit_output(c.make(*params))
            bb.emit_func_output(out)
    return bb.get()


def _inputs(c: Case, seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lo, hi = {True: (0.5, 2.0), False: (-1.0, 1.0), "wide": (-8.0, 8.0)}[c.positive]
    return {n: rng.uniform(lo, hi, size=s).astype(F32) for n, s in c.inputs.items()}


@pytest.fixture(scope="module")
def compiled():
    mod = _build(CASES)
    ex = tvm.compile(mod, "llvm")
    return mod, relax.VirtualMachine(ex, tvm.cpu())


def _call_of(mod, k):
    return mod[f"f{k}"].body.blocks[0].bindings[-1].value


def _run(vm, k, inputs, c):
    args = [tvm.runtime.tensor(inputs[n]) for n in c.inputs]
    return vm[f"f{k}"](*args).numpy()


@pytest.mark.parametrize("k", range(len(CASES)), ids=[c.cid for c in CASES])
def test_lift_matches_tvm(compiled, k):
    mod, vm = compiled
    c = CASES[k]
    call = _call_of(mod, k)
    expr = lift_via_legalize(call, mod) if c.fallback else lift(call, mod)
    assert isinstance(expr, Scope)
    inputs = _inputs(c, seed=k)
    ref = _run(vm, k, inputs, c)
    got = evaluate(expr, {**inputs, **constant_arrays(call)})
    assert got.shape == ref.shape, str(expr)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=str(expr))
    if c.numpy_ref is not None:
        want = np.asarray(c.numpy_ref(*(inputs[n] for n in c.inputs)), dtype=F32)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(expr))


def test_lifts_read_in_bounds_and_print_back():
    """Registry lifts pad every tensor as far as it is read, and their text parses back."""
    from tvm_ollie.ir.parser import parse  # pylint: disable=import-outside-toplevel
    from tvm_ollie.verify.bounds import check_bounds  # pylint: disable=import-outside-toplevel

    mod = _build(CASES)
    for k, c in enumerate(CASES):
        if c.fallback:
            continue
        expr = lift(_call_of(mod, k), mod)
        assert check_bounds(expr) == [], c.cid
        assert parse(str(expr)) is expr, c.cid


def test_every_required_op_is_covered():
    required = {
        "relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv2d_transpose", "relax.matmul",
        "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum",
        "relax.minimum", "relax.power", "relax.nn.relu", "relax.tanh", "relax.sigmoid",
        "relax.exp", "relax.log", "relax.sqrt", "relax.rsqrt", "relax.erf", "relax.abs",
        "relax.negative", "relax.nn.gelu", "relax.nn.silu", "relax.clip", "relax.nn.max_pool2d",
        "relax.nn.avg_pool2d", "relax.sum", "relax.mean", "relax.max", "relax.permute_dims",
        "relax.reshape", "relax.strided_slice", "relax.concat", "relax.nn.pad",
    }
    assert required <= set(registered_ops())
    mod = _build(CASES)
    covered = {_call_of(mod, k).op.name for k in range(len(CASES)) if not CASES[k].fallback}
    assert set(registered_ops()) - {"relax.call_tir"} <= covered


# ---- the call_tir path: TOPI's PrimFuncs ------------------------------------------------------
@pytest.fixture(scope="module")
def legalized(compiled):
    mod, vm = compiled
    return relax.transform.LegalizeOps()(mod), vm


@pytest.mark.parametrize("k", range(len(CASES)), ids=[c.cid for c in CASES])
def test_call_tir_lift_is_exact_or_refused(legalized, k):
    mod, vm = legalized
    c = CASES[k]
    call = _call_of(mod, k)
    if call.op.name != "relax.call_tir":
        pytest.skip("not legalized into a single call_tir")
    try:
        expr = lift(call, mod)
    except LiftError:
        return
    inputs = _inputs(c, seed=k)
    ref = _run(vm, k, inputs, c)
    got = evaluate(expr, {**inputs, **constant_arrays(call)})
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5, err_msg=str(expr))


# ---- refusals -------------------------------------------------------------------------------
def _single_call(make, *types, names=None):
    bb = relax.BlockBuilder()
    names = names or [f"v{k}" for k in range(len(types))]
    params = [relax.Var(n, t) for n, t in zip(names, types)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(make(*params))
        bb.emit_func_output(out)
    mod = bb.get()
    return mod["main"].body.blocks[0].bindings[-1].value, mod


def _t(shape, dtype=F32):
    return relax.TensorType(shape, dtype)


@pytest.mark.parametrize("make,types,match", [
    (R.nn.softmax, [_t((2, 3))], "no lift is registered"),
    (lambda x: R.nn.pad(x, [1, 1, 1, 1], pad_mode="reflect"), [_t((3, 3))], "pad_mode"),
    (lambda x, w: R.nn.conv2d(x, w, out_layout="NHWC"), [_t((1, 2, 4, 4)), _t((2, 2, 1, 1))],
     "out_layout"),
    (lambda x, w: R.nn.conv2d(x, w, out_dtype="int32"), [_t((1, 2, 4, 4)),
                                                         _t((2, 2, 1, 1))], "floating"),
    (lambda x, w: R.nn.conv2d_transpose(x, w, data_layout="NHWC"),
     [_t((1, 4, 4, 2)), _t((2, 2, 3, 3))], "NCHW"),
    (R.add, [_t((2, 3), "int32"), _t((2, 3), "int32")], "floating"),
    (lambda x, w: R.nn.conv2d(x, w, data_layout="NCHW4c"),
     [_t((1, 2, 4, 4, 4)), _t((8, 8, 3, 3))], "unsupported layout"),
    (lambda x, w: R.nn.conv2d(x, w, data_layout="NCWH"), [_t((1, 8, 4, 5)), _t((8, 8, 3, 3))],
     "orders the spatial axes"),
    (lambda x: R.nn.max_pool2d(x, 2, layout="NCHW4c"), [_t((1, 2, 4, 4, 4))],
     "unsupported layout"),
    (lambda x: R.take(x, relax.const(np.array([[3, 0, 4], [1, 1, 2]], "int64")), axis=0),
     [_t((5, 3))], "not an affine"),
    (lambda x: R.take(x, relax.const(np.array([-1, 0, 1], "int64")), axis=0),
     [_t((5, 3))], "outside"),
    (lambda x, i: R.take(x, i, axis=0), [_t((5, 3)), _t((2,), "int64")], "not a constant"),
    (lambda x: R.gather_nd(x, relax.const(np.array([[3], [0], [4]]), "int64")), [_t((5, 3))],
     "not an affine"),
])
def test_unsupported_raises(make, types, match):
    call, mod = _single_call(make, *types)
    with pytest.raises(LiftError, match=match):
        lift(call, mod)


def test_symbolic_shape_raises():
    n = tirx.Var("n", "int64")
    call, mod = _single_call(R.nn.relu, _t((n, 4)))
    with pytest.raises(LiftError, match="symbolic"):
        lift(call, mod)


def test_call_tir_needs_module():
    mod = relax.transform.LegalizeOps()(_single_call(R.nn.relu, _t((2, 3)))[1])
    call = mod["main"].body.blocks[0].bindings[-1].value
    with pytest.raises(LiftError, match="IRModule"):
        lift(call)
    assert isinstance(lift(call, mod), Scope)


def test_not_an_operator_raises():
    with pytest.raises(LiftError):
        lift(3)


def test_linear_is_permute_dims_then_matmul():
    """TVM 0.27 has no relax.nn.linear op: relax.op.linear emits permute_dims + matmul."""
    from tvm.ir import Op  # pylint: disable=import-outside-toplevel

    with pytest.raises(Exception):
        Op.get("relax.nn.linear")
    _, mod = _single_call(R.linear, _t((2, 4)), _t((3, 4)))
    bindings = mod["main"].body.blocks[0].bindings
    assert [b.value.op.name for b in bindings] == ["relax.permute_dims", "relax.matmul"]
    rng = np.random.default_rng(0)
    x, w = rng.uniform(-1, 1, (2, 4)).astype(F32), rng.uniform(-1, 1, (3, 4)).astype(F32)
    wt = evaluate(lift(bindings[0].value, mod), {"v1": w})
    out = evaluate(lift(bindings[1].value, mod), {"v0": x, bindings[0].var.name: wt})
    np.testing.assert_allclose(out, x @ w.T, rtol=1e-5, atol=1e-6)


def test_registered_names_are_tvm_ops():
    from tvm.ir import Op  # pylint: disable=import-outside-toplevel

    for name in registered_ops():
        assert Op.get(name) is not None, name


def test_fallback_is_opt_in():
    call, mod = _single_call(R.nn.softmax, _t((2, 3)))
    with pytest.raises(LiftError):
        lift(call, mod)
    assert isinstance(lift(call, mod, legalize_fallback=True), Scope)
    call, mod = _single_call(lambda x: R.nn.adaptive_avg_pool2d(x, 2), _t((1, 1, 5, 5)))
    with pytest.raises(LiftError):
        lift(call, mod, legalize_fallback=True)
    call, mod = _single_call(lambda x, i: R.take(x, i, axis=0), _t((4, 3)), _t((2,), "int64"))
    with pytest.raises(LiftError, match="data-dependent"):
        lift(call, mod, legalize_fallback=True)


@pytest.mark.parametrize("names,expected", [
    (["x", "y"], ["x", "y"]),
    (["x", "x"], ["in0", "in1"]),
    (["x.1", "in0"], ["in0_0", "in0"]),
    (["for", "y"], ["in0", "y"]),
])
def test_operand_names(names, expected):
    call, mod = _single_call(R.add, _t((2, 3)), _t((2, 3)), names=names)
    assert [t.name for t in lift(call, mod).inputs] == expected


def test_same_var_twice_is_one_tensor():
    call, mod = _single_call(lambda a: R.multiply(a, a), _t((3,)), names=["a"])
    expr = lift(call, mod)
    assert [t.name for t in expr.inputs] == ["a"]
    a = np.arange(3, dtype=F32)
    np.testing.assert_allclose(evaluate(expr, {"a": a}), a * a)


def test_constants_are_named_in_order():
    k1, k2 = np.ones((2, 2), F32), np.full((2, 2), 3.0, F32)
    call, mod = _single_call(lambda x: R.concat([relax.const(k1), x, relax.const(k2)], axis=0),
                             _t((2, 2)), names=["x"])
    expr = lift(call, mod)
    assert [t.name for t in expr.inputs] == ["const0", "x", "const1"]
    x = np.zeros((2, 2), F32)
    got = evaluate(expr, {"x": x, **constant_arrays(call)})
    np.testing.assert_allclose(got, np.concatenate([k1, x, k2]))


def test_package_attribute_stays_callable():
    import tvm_ollie  # pylint: disable=import-outside-toplevel

    call, mod = _single_call(R.nn.relu, _t((2, 3)))
    assert isinstance(tvm_ollie.lift(call, mod), Scope)


# ---- realistic layer sizes (one compile each) -------------------------------------------------
SLOW_CASES = [
    Case("conv2d-resnet-3x3", {"x": (1, 64, 14, 14), "w": (64, 64, 3, 3)},
         lambda x, w: R.nn.conv2d(x, w, padding=1)),
    Case("conv2d-stride2-nhwc", {"x": (2, 28, 28, 32), "w": (3, 3, 32, 64)},
         lambda x, w: R.nn.conv2d(x, w, strides=2, padding=1, data_layout="NHWC",
                                  kernel_layout="HWIO")),
    Case("tconv2d-dcgan", {"x": (1, 64, 8, 8), "w": (64, 32, 4, 4)},
         lambda x, w: R.nn.conv2d_transpose(x, w, strides=2, padding=1)),
    Case("matmul-bert", {"a": (4, 128, 64), "b": (4, 64, 128)}, R.matmul, numpy_ref=np.matmul),
    Case("avgpool-excl-big", {"x": (2, 16, 33, 33)},
         lambda x: R.nn.avg_pool2d(x, 3, strides=2, padding=1, ceil_mode=True)),
]


@pytest.mark.parametrize("k", range(len(SLOW_CASES)), ids=[c.cid for c in SLOW_CASES])
def test_lift_matches_tvm_large(k):
    c = SLOW_CASES[k]
    mod = _build([c])
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    call = _call_of(mod, 0)
    inputs = _inputs(c, seed=k)
    ref = _run(vm, 0, inputs, c)
    got = evaluate(lift(call, mod), inputs)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
