"""Banded attention regions on the native g2bmm/gbmm kernels.

The regions are written as exported graphs write Longformer's dilated sliding window (window
``W``, dilation ``D``): ``pad`` + ``take`` with a constant affine index + ``matmul``::

    scores[h, m, w] = sum_k q[h, m, k] * k_pad[h, m + D * w, k]       (g2bmm)
    out[h, m, n]    = sum_w p[h, m, w] * v_pad[h, m + D * w, n]        (gbmm)

The derived g2bmm/gbmm stage must be emitted as one ``call_dps_packed`` of the library kernel
(``impl="native"``) and the rewritten module must equal the original.
"""

from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import relax  # noqa: E402

from tvm_ollie import native  # noqa: E402
from tvm_ollie.codegen import library as lib  # noqa: E402
from tvm_ollie.transform.optimize import optimize_module  # noqa: E402
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration  # noqa: E402

R = relax.op
F32 = "float32"
H, N, DK, W, D = 2, 16, 4, 2, 2
#: A given roof (no per-process measurement in a default test), the library's kernels at 70 %.
CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["llvm"], native_matmul=0.7,
                                               native_g2bmm=0.7, native_gbmm=0.7), "given")


@pytest.fixture(autouse=True)
def _band_kernels():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.unavailable_reason()}")
    if not (native.provides(native.G2BMM) and native.provides(native.GBMM)):
        pytest.skip("the loaded native library predates the g2bmm/gbmm kernels")


def _band_index() -> np.ndarray:
    return (np.arange(N)[:, None] + D * np.arange(2 * W + 1)[None, :]).astype("int64")


def _window(bb, x):
    """``take(pad(x), idx)``: ``[1, H, N, 2W+1, DK]``, the window rows of every row of ``x``."""
    xp = bb.emit(R.nn.pad(x, [0, 0, 0, 0, D * W, D * W, 0, 0]))
    return bb.emit(R.take(xp, relax.const(_band_index()), axis=2))


def _module(kind: str):
    """g2bmm: ``q @ window(k)^T``; gbmm: ``p @ window(v)``."""
    bb = relax.BlockBuilder()
    a_cols = DK if kind == "g2bmm" else 2 * W + 1
    a = relax.Var("a", relax.TensorType((1, H, N, a_cols), F32))
    b = relax.Var("b", relax.TensorType((1, H, N, DK), F32))
    with bb.function("main", [a, b]):
        with bb.dataflow():
            rows = _window(bb, b)
            ae = bb.emit(R.expand_dims(a, 3))
            if kind == "g2bmm":
                s = bb.emit(R.matmul(ae, bb.emit(R.permute_dims(rows, [0, 1, 2, 4, 3]))))
                out = bb.emit(R.reshape(s, (1, H, N, 2 * W + 1)))
            else:
                out = bb.emit(R.reshape(bb.emit(R.matmul(ae, rows)), (1, H, N, DK)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    return bb.get()


def _run(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(x) for x in args]).numpy()


def _prefer_native(kind):
    """A timer under which the derived ``kind`` program on the library is the fastest."""
    def timer(mod, label):  # noqa: ARG001
        return 0.5 if kind in label and label.endswith("[native]") else 1.0

    return timer


def _packed_calls(mod):
    """The library kernels ``mod`` calls."""
    return [name for name in lib.KERNELS if f'"{name}"' in mod.script()]


@pytest.mark.parametrize("kind", ["g2bmm", "gbmm"])
def test_band_region_runs_on_the_library_kernel(kind):
    mod = _module(kind)
    new, report = optimize_module(mod, "llvm", search_time_s=2.0, library=True, max_measured=2,
                                  calibration=CALIB, timer=_prefer_native(kind))
    (reg,) = report.regions
    assert reg.rewritten, reg.reason
    assert kind in reg.chosen and reg.chosen.endswith("[native]")
    assert _packed_calls(new) == [lib.BAND_KERNELS[kind]]
    assert f'"{lib.BAND_KERNELS[kind]}", (R.str("width={W};dil={D}")' in new.script()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in v.ty.shape]).astype(F32)
            for v in mod["main"].params]
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-5, atol=1e-5)


def test_calibration_measures_the_band_kernels():
    from tvm_ollie.tune.calibrate import measure_native_efficiency  # pylint: disable=C0415

    eff = measure_native_efficiency()
    assert 0 < eff["native_g2bmm"] <= 1.0 and 0 < eff["native_gbmm"] <= 1.0
