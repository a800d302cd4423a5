"""fuse_epilogues through a reshape (SINK_RESHAPE): the activation, residual and bias that
importers write after ``reshape`` back to ``[batch, seq, hidden]`` fold into the native call;
and a product by a scalar constant (attention's scale) folds as ``act=scale_C``."""

from dataclasses import replace

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.epilogue import fuse_epilogues

from test_epilogue import _build, _f32

MATMUL = lib.matmul_call()
B3 = np.arange(3, dtype="float32") - 1.0


def _params():
    return [relax.Var("x", _f32((1, 5, 7))), relax.Var("w", _f32((7, 3))),
            relax.Var("r", _f32((1, 5, 3)))]


def test_gelu_after_reshape_folds():
    def before(bb, x, w, r):
        x2 = bb.emit(relax.op.reshape(x, (5, 7)))
        y = bb.emit(lib.emit_call(MATMUL, [x2, w], (5, 3)))
        y = bb.emit(relax.op.add(y, relax.const(B3)))
        y = bb.emit(relax.op.reshape(y, (1, 5, 3)))
        return relax.op.nn.gelu(y)

    def expected(bb, x, w, r):
        x2 = bb.emit(relax.op.reshape(x, (5, 7)))
        call = MATMUL.with_attrs(bias=1, act="gelu")
        y = bb.emit(lib.emit_call(call, [x2, w, relax.const(B3)], (5, 3)))
        return relax.op.reshape(y, (1, 5, 3))

    got, counts = fuse_epilogues(_build(_params(), before))
    tvm.ir.assert_structural_equal(got, _build(_params(), expected))
    assert counts == {"matmul": 2}


def test_residual_after_reshape_is_viewed_in_the_kernel_shape():
    def before(bb, x, w, r):
        x2 = bb.emit(relax.op.reshape(x, (5, 7)))
        y = bb.emit(lib.emit_call(MATMUL, [x2, w], (5, 3)))
        y = bb.emit(relax.op.add(y, relax.const(B3)))
        y = bb.emit(relax.op.reshape(y, (1, 5, 3)))
        return relax.op.add(r, y)

    def expected(bb, x, w, r):
        x2 = bb.emit(relax.op.reshape(x, (5, 7)))
        view = bb.emit(relax.op.reshape(r, (5, 3)))
        call = MATMUL.with_attrs(bias=1, res=1)
        y = bb.emit(lib.emit_call(call, [x2, w, relax.const(B3), view], (5, 3)))
        return relax.op.reshape(y, (1, 5, 3))

    got, _ = fuse_epilogues(_build(_params(), before))
    tvm.ir.assert_structural_equal(got, _build(_params(), expected))


def test_bias_after_reshape_and_constant_residual():
    """A bias of shape [1, 1, N] after the reshape is viewed as [N]; a constant residual is
    reshaped at build time (no binding)."""
    res = np.linspace(-1, 1, 15, dtype="float32").reshape(1, 5, 3)

    def before(bb, x, w, r):
        y = bb.emit(lib.emit_call(MATMUL, [bb.emit(relax.op.reshape(x, (5, 7))), w], (5, 3)))
        y = bb.emit(relax.op.reshape(y, (1, 5, 3)))
        y = bb.emit(relax.op.add(y, relax.const(B3.reshape(1, 1, 3))))
        return relax.op.add(y, relax.const(res))

    def expected(bb, x, w, r):
        x2 = bb.emit(relax.op.reshape(x, (5, 7)))
        call = MATMUL.with_attrs(bias=1, res=1)
        y = bb.emit(lib.emit_call(call, [x2, w, relax.const(B3), relax.const(res.reshape(5, 3))],
                                  (5, 3)))
        return relax.op.reshape(y, (1, 5, 3))

    got, _ = fuse_epilogues(_build(_params(), before))
    tvm.ir.assert_structural_equal(got, _build(_params(), expected))


def _unchanged(body):
    mod = _build(_params(), body)
    got, counts = fuse_epilogues(mod)
    tvm.ir.assert_structural_equal(got, mod)
    assert counts == {}


def test_guard_reshape_read_twice():
    def body(bb, x, w, r):
        y = bb.emit(lib.emit_call(MATMUL, [bb.emit(relax.op.reshape(x, (5, 7))), w], (5, 3)))
        y = bb.emit(relax.op.reshape(y, (1, 5, 3)))
        z = bb.emit(relax.op.nn.relu(y))
        return relax.op.add(z, y)

    _unchanged(body)


def test_guard_bias_that_is_not_along_the_kernel_channel():
    """After the reshape the last axis is no longer the kernel's N: a vector along it is not
    a bias of the kernel."""
    def body(bb, x, w, r):
        y = bb.emit(lib.emit_call(MATMUL, [bb.emit(relax.op.reshape(x, (5, 7))), w], (5, 3)))
        y = bb.emit(relax.op.reshape(y, (1, 15)))
        return relax.op.add(y, relax.const(np.ones(15, "float32")))

    _unchanged(body)


def test_guard_step_that_would_break_the_kernel_order():
    """An activation already folded: a residual after the reshape is not sunk (the kernel adds
    the residual before its activation)."""
    def body(bb, x, w, r):
        x2 = bb.emit(relax.op.reshape(x, (5, 7)))
        y = bb.emit(lib.emit_call(MATMUL.with_attrs(act="relu"), [x2, w], (5, 3)))
        y = bb.emit(relax.op.reshape(y, (1, 5, 3)))
        return relax.op.add(y, r)

    _unchanged(body)


def test_guard_non_library_producer():
    def body(bb, x, w, r):
        y = bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(x, (5, 7))), w))
        y = bb.emit(relax.op.reshape(y, (1, 5, 3)))
        return relax.op.nn.gelu(y)

    _unchanged(body)


def _ffn(library: bool):
    """A transformer FFN as importers write it: reshape, matmul, bias, reshape, GELU, reshape,
    matmul, bias, reshape, residual add, then layer norm; the matmuls on the native kernel
    (``library``) or TVM's."""
    rng = np.random.default_rng(0)
    w1 = relax.const(rng.standard_normal((16, 32)).astype("float32") * 0.3)
    b1 = relax.const(rng.standard_normal(32).astype("float32"))
    w2 = relax.const(rng.standard_normal((32, 16)).astype("float32") * 0.3)
    b2 = relax.const(rng.standard_normal(16).astype("float32"))
    gamma = relax.const(np.ones(16, "float32"))
    beta = relax.const(np.zeros(16, "float32"))

    def mm(bb, a, w, n):
        if library:
            return bb.emit(lib.emit_call(MATMUL, [a, w], (8, n)))
        return bb.emit(relax.op.matmul(a, w))

    def body(bb, x):
        h = mm(bb, bb.emit(relax.op.reshape(x, (8, 16))), w1, 32)
        h = bb.emit(relax.op.add(h, b1))
        h = bb.emit(relax.op.nn.gelu(bb.emit(relax.op.reshape(h, (1, 8, 32)))))
        h = mm(bb, bb.emit(relax.op.reshape(h, (8, 32))), w2, 16)
        h = bb.emit(relax.op.add(h, b2))
        h = bb.emit(relax.op.add(bb.emit(relax.op.reshape(h, (1, 8, 16))), x))
        return relax.op.nn.layer_norm(h, gamma, beta, axes=[-1])

    return _build([relax.Var("x", _f32((1, 8, 16)))], body)


def _kernel_attrs(mod):
    """The attribute strings of the native calls in ``main``."""
    out = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            found = lib.lib_call_of(binding.value)
            if found is not None:
                out.append(found[0].text())
    return out


def test_ffn_folds_everything_into_the_two_calls():
    got, counts = fuse_epilogues(_ffn(library=True))
    assert counts == {"matmul": 4}
    assert _kernel_attrs(got) == ["ta=0;tb=0;bias=1;act=gelu", "ta=0;tb=0;bias=1;res=1"]
    ops = [b.value.op.name for blk in got["main"].body.blocks for b in blk.bindings
           if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    assert "relax.nn.gelu" not in ops and "relax.add" not in ops


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
def test_ffn_numerics_against_tvm():
    """The folded FFN on the native kernels against TVM's build of the same FFN."""
    x = np.random.default_rng(1).standard_normal((1, 8, 16)).astype("float32")

    def run(mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x)).numpy()

    fused, _ = fuse_epilogues(_ffn(library=True))
    np.testing.assert_allclose(run(fused), run(_ffn(library=False)), rtol=1e-4, atol=1e-4)


#: The scale folds only where the loaded library parses ``scale_A`` (a stale build does not).
needs_scale = pytest.mark.skipif(not native.takes_activation("scale_0.125"),
                                 reason="the loaded native library predates act=scale_A")


def _scores_params():
    return [relax.Var("q", _f32((2, 4, 6))), relax.Var("k", _f32((2, 6, 4)))]


def _scores(bb, q, k, scale, func=lib.MATMUL):
    """Attention scores as importers write them: batched matmul, reshape, product by a
    constant."""
    call = replace(MATMUL, func=func)
    s = bb.emit(lib.emit_call(call, [q, k], (2, 4, 4)))
    s = bb.emit(relax.op.reshape(s, (1, 2, 4, 4)))
    return relax.op.multiply(s, scale)


@needs_scale
def test_scale_after_reshape_folds():
    def before(bb, q, k):
        return _scores(bb, q, k, relax.const(np.float32(0.125)))

    def expected(bb, q, k):
        s = bb.emit(lib.emit_call(MATMUL.with_attrs(act="scale_0.125"), [q, k], (2, 4, 4)))
        return relax.op.reshape(s, (1, 2, 4, 4))

    got, counts = fuse_epilogues(_build(_scores_params(), before))
    tvm.ir.assert_structural_equal(got, _build(_scores_params(), expected))
    assert counts == {"matmul": 1}


@needs_scale
def test_scale_on_the_left_and_shaped_one():
    """``c * y`` with ``c`` of shape [1, 1, 1]: a scale too."""
    def before(bb, q, k):
        s = bb.emit(lib.emit_call(MATMUL, [q, k], (2, 4, 4)))
        return relax.op.multiply(relax.const(np.full((1, 1, 1), 0.5, "float32")), s)

    def expected(bb, q, k):
        return lib.emit_call(MATMUL.with_attrs(act="scale_0.5"), [q, k], (2, 4, 4))

    got, _ = fuse_epilogues(_build(_scores_params(), before))
    tvm.ir.assert_structural_equal(got, _build(_scores_params(), expected))


def _unchanged_scores(body):
    mod = _build(_scores_params(), body)
    got, counts = fuse_epilogues(mod)
    tvm.ir.assert_structural_equal(got, mod)
    assert counts == {}


def test_guard_scale_by_a_vector_or_per_batch():
    _unchanged_scores(lambda bb, q, k: _scores(bb, q, k, relax.const(np.ones(4, "float32"))))
    _unchanged_scores(lambda bb, q, k: relax.op.multiply(
        bb.emit(lib.emit_call(MATMUL, [q, k], (2, 4, 4))),
        relax.const(np.ones((2, 1, 1), "float32"))))


def test_guard_scale_not_on_cuda_kernels():
    _unchanged_scores(lambda bb, q, k: _scores(bb, q, k, relax.const(np.float32(0.125)),
                                               lib.CUDA_MATMUL))


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
@needs_scale
def test_scaled_scores_softmax_numerics_against_tvm():
    """Scores, scale and softmax on the native kernel (scale folded) against TVM's build."""
    rng = np.random.default_rng(2)
    args = [rng.standard_normal((2, 4, 6)).astype("float32"),
            rng.standard_normal((2, 6, 4)).astype("float32")]

    def body(library):
        def emit(bb, q, k):
            if library:
                s = bb.emit(lib.emit_call(MATMUL, [q, k], (2, 4, 4)))
            else:
                s = bb.emit(relax.op.matmul(q, k))
            s = bb.emit(relax.op.reshape(s, (1, 2, 4, 4)))
            s = bb.emit(relax.op.multiply(s, relax.const(np.float32(0.125))))
            return relax.op.nn.softmax(s, axis=-1)
        return emit

    def run(mod):
        vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    fused, counts = fuse_epilogues(_build(_scores_params(), body(True)))
    assert counts == {"matmul": 1}
    np.testing.assert_allclose(run(fused), run(_build(_scores_params(), body(False))),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not native.load(), reason="native library not loaded")
@needs_scale
def test_bert_quick_library_plan_folds_every_epilogue(tmp_path):
    """The zoo's BERT layer as the benchmark imports it (PyTorch, constant weights): in the
    library plan every bias, residual, GELU and the attention scale is in a native call, and
    the plan computes what TVM's build of the imported module does."""
    from tvm_ollie.config import OllieConfig
    from tvm_ollie.models.export import to_relax
    from tvm_ollie.models.registry import get_model
    from tvm_ollie.pipeline.joint import library_plan

    spec = get_model("bert", quick=True)
    mod, _ = to_relax(spec, weights="constants")
    # (pack_weights=False: the matmul weights' forms, transform/matmul_pack.py, would change
    # tb and add wpacked by timing; their own tests are tests/transform/test_matmul_pack.py)
    plan, _ = library_plan(mod, OllieConfig(target="llvm", work_dir=str(tmp_path),
                                            pack_weights=False))
    attrs = sorted(_kernel_attrs(plan))
    assert attrs == sorted(["ta=0;tb=0;bias=1", "ta=0;tb=0;act=scale_0.125", "ta=0;tb=0",
                            "ta=0;tb=0;bias=1;res=1", "ta=0;tb=0;bias=1;act=gelu",
                            "ta=0;tb=0;bias=1;res=1"])
    x = spec.example_inputs[0].detach().numpy().astype("float32")

    def run(m):
        vm = relax.VirtualMachine(tvm.compile(m, target="llvm"), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x)).numpy()

    np.testing.assert_allclose(run(plan), run(mod), rtol=1e-4, atol=1e-4)
