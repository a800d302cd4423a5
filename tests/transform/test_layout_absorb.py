"""transform/layout_absorb: a region's layout permutations absorbed into one library conv.

The Mix-FFN form of SegFormer (tokens ``[H*W, C]`` viewed as NCHW, a depthwise conv with bias,
viewed back as tokens, GELU) and its variations: dense and grouped convs, strided, tokens or
NCHW on either side, with and without bias or activation. Before/Expected modules compared
structurally; numerics against TVM's build of the original region (Relax ``nn.conv2d``, no
library); the alternative offered, chosen by the timer and emitted in the whole module."""

import numpy as np
import pytest
import tvm
from tvm import relax

import small_models as sm
from tvm_ollie import native
from tvm_ollie.codegen import library as lib
from tvm_ollie.transform.checking import check_numerics
from tvm_ollie.transform.layout_absorb import absorbed_conv, format_of, read_format
from tvm_ollie.transform.regions import find_regions, isolated_region_module

R = relax.op
F32 = "float32"


@pytest.fixture(autouse=True)
def _native():
    if not native.available():
        pytest.skip("native library unavailable")


def _var(name, shape):
    return relax.Var(name, relax.TensorType(shape, F32))


def _rng_w(seed, *shape):
    return (np.random.default_rng(seed).standard_normal(shape) * 0.3).astype(F32)


def mix_ffn(h=4, w=4, c=8, f=None, groups=None, stride=1, bias="var", act="gelu",
            tokens_in=True, tokens_out=True, batch=None):
    """``act(tokens(conv(image(t)) + b))``: ``t`` tokens ``[H*W, C]`` (``[B, H*W, C]`` with
    ``batch``) or NCHW, the result tokens or NCHW; ``bias`` ``"var"`` (a ``[1, F, 1, 1]``
    parameter, as the exporters reshape it outside the region), ``"const"``, ``"tokens"`` (a
    ``[F]`` constant added to the tokens) or None."""
    f = c if f is None else f
    groups = c if groups is None else groups
    n = 1 if batch is None else batch
    x_shape = ((h * w, c) if batch is None else (n, h * w, c)) if tokens_in else (n, c, h, w)
    t = _var("t", x_shape)
    params = [t]
    bvar = None
    if bias == "var":
        bvar = _var("b", (1, f, 1, 1))
        params.append(bvar)
    oh, ow = (h + 2 - 3) // stride + 1, (w + 2 - 3) // stride + 1
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            if tokens_in:
                x = bb.emit(R.reshape(t, (n, h * w, c)))
                x = bb.emit(R.permute_dims(x, [0, 2, 1]))
                x = bb.emit(R.reshape(x, (n, c, h, w)))
            else:
                x = bb.emit(R.reshape(t, (n, c, h * w)))
                x = bb.emit(R.reshape(x, (n, c, h, w)))
            wt = relax.const(_rng_w(1, f, c // groups, 3, 3))
            y = bb.emit(R.nn.conv2d(x, wt, strides=stride, padding=1, groups=groups))
            if bias == "var":
                y = bb.emit(R.add(y, bvar))
            elif bias == "const":
                y = bb.emit(R.add(y, relax.const(_rng_w(2, 1, f, 1, 1))))
            if tokens_out:
                y = bb.emit(R.reshape(y, (n, f, oh * ow)))
                y = bb.emit(R.permute_dims(y, [0, 2, 1]))
            else:
                y = bb.emit(R.reshape(y, (n, f, oh * ow)))
            if bias == "tokens":
                y = bb.emit(R.add(y, relax.const(_rng_w(3, f))))
            if act == "gelu":
                y = bb.emit(R.nn.gelu(y))
            elif act == "relu":
                y = bb.emit(R.nn.relu(y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _region(mod):
    (region,) = [r for r in find_regions(mod) if r.size > 1]
    return region


# ---------------------------------------------------------------------------------------------
# Before / Expected

def test_mix_ffn_becomes_one_channels_last_call():
    """Before: reshape, permute, reshape, depthwise conv, add, reshape, permute, gelu.
    Expected: ``t`` viewed as [1, H, W, C], the bias as [C], one conv call reading and
    writing channels-last with bias and GELU, its result viewed as the tokens."""
    h, w, c = 4, 4, 8
    region = _region(mix_ffn(h, w, c))
    form = region.library_form()
    assert form is not None and form.absorbs_layout
    assert (form.src_fmt, form.dst_fmt) == ("nhwc", "nhwc")
    assert form.kernel.get("groups") == str(c)
    assert (form.kernel.get("bias"), form.kernel.get("act")) == ("1", "gelu")

    got = isolated_region_module(region, impl="native")

    t, b = _var("t", (h * w, c)), _var("b", (1, c, 1, 1))
    weight = region.heavy_call.args[1]
    kernel = lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), c, "NCHW", "OIHW").with_attrs(
        src_fmt="nhwc", dst_fmt="nhwc", bias=1, act="gelu")
    bb = relax.BlockBuilder()
    with bb.function("main", [t, b]):
        with bb.dataflow():
            x = bb.emit(R.reshape(t, (1, h, w, c)))
            vec = bb.emit(R.reshape(b, (c,)))
            y = bb.emit(lib.emit_call(kernel, [x, weight, vec], (1, h, w, c)))
            out = bb.emit_output(R.reshape(y, (1, h * w, c)))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(got, bb.get())


def test_nchw_views_keep_the_plain_format():
    """Pure views of NCHW data and an NCHW result (flattened): formats stay nchw, and the
    attributes say nothing about formats."""
    form = _region(mix_ffn(tokens_in=False, tokens_out=False, groups=1, f=6)).library_form()
    assert form is not None and not form.absorbs_layout
    assert "src_fmt" not in form.kernel.text() and "dst_fmt" not in form.kernel.text()


def _conv_then(case, h=4, w=4, c=8):
    """Tokens viewed as NCHW, a depthwise conv, then the consumers of ``case``, then the
    tokens view back."""
    t = _var("t", (h * w, c))
    bb = relax.BlockBuilder()
    with bb.function("main", [t]):
        with bb.dataflow():
            x = bb.emit(R.reshape(t, (1, h, w, c)))
            x = bb.emit(R.permute_dims(x, [0, 3, 1, 2]))
            y = bb.emit(R.nn.conv2d(x, relax.const(_rng_w(1, c, 1, 3, 3)), padding=1,
                                    groups=c))
            if case == "act_before_bias":
                y = bb.emit(R.nn.gelu(y))
                y = bb.emit(R.add(y, relax.const(_rng_w(2, 1, c, 1, 1))))
            elif case == "bias_along_width":
                y = bb.emit(R.add(y, relax.const(_rng_w(2, w))))
            elif case == "slice":
                y = bb.emit(R.strided_slice(y, axes=[2], begin=[0], end=[2]))
            elif case == "layer_norm_on_tokens":
                y = bb.emit(R.permute_dims(y, [0, 2, 3, 1]))
                y = bb.emit(R.nn.layer_norm(y, relax.const(_rng_w(4, c)),
                                            relax.const(_rng_w(5, c)), axes=[-1]))
            if case != "layer_norm_on_tokens":
                y = bb.emit(R.permute_dims(y, [0, 2, 3, 1]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


#: case -> (the kernel's dst_fmt, act, bias) where the chain stops folding; the source is
#: channels-last in each.
PARTIAL = {
    "act_before_bias": ("nchw", "gelu", "0"),
    "bias_along_width": ("nchw", "none", "0"),
    "slice": ("nchw", "none", "0"),
    "layer_norm_on_tokens": ("nhwc", "none", "0"),
}


@pytest.mark.parametrize("case", list(PARTIAL))
def test_chain_folds_up_to_the_first_step_it_cannot(case):
    """The call computes the last value whose positions spell a format; the consumers after
    it run on that view as they were (and the whole still computes what TVM builds)."""
    region = _region(_conv_then(case))
    form = region.library_form()
    assert form is not None and form.src_fmt == "nhwc"
    assert (form.dst_fmt, form.kernel.get("act", "none"), form.kernel.get("bias", "0")) == \
        PARTIAL[case]
    ok, why = check_numerics(isolated_region_module(region),
                             isolated_region_module(region, impl="native"))
    assert ok, why


def test_rule_does_not_apply():
    """Nothing absorbed (the data is sliced, not viewed; a product follows): no form; an
    NHWC conv has no formats to absorb into either."""
    h, w, c = 4, 4, 8
    t = _var("t", (1, c, h + 1, w))
    bb = relax.BlockBuilder()
    with bb.function("main", [t]):
        with bb.dataflow():
            x = bb.emit(R.strided_slice(t, axes=[2], begin=[0], end=[h]))
            y = bb.emit(R.nn.conv2d(x, relax.const(_rng_w(1, c, c, 3, 3)), padding=1))
            y = bb.emit(R.multiply(y, y))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    region = _region(bb.get())
    assert absorbed_conv(region.bindings, region.heavy) is None

    t = _var("t", (h * w, c))
    bb = relax.BlockBuilder()
    with bb.function("main", [t]):
        with bb.dataflow():
            x = bb.emit(R.reshape(t, (1, h, w, c)))
            y = bb.emit(R.nn.conv2d(x, relax.const(_rng_w(1, 3, 3, c, c)), padding=1,
                                    data_layout="NHWC", kernel_layout="HWIO"))
            out = bb.emit_output(R.reshape(y, (h * w, c)))
        bb.emit_func_output(out)
    region = _region(bb.get())
    assert region.library_form() is None


def test_format_of():
    base = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert format_of(base, (2, 3, 4, 5)) == "nchw"
    assert format_of(np.transpose(base, (0, 2, 3, 1)), (2, 3, 4, 5)) == "nhwc"
    assert format_of(np.transpose(base, (0, 1, 3, 2)), (2, 3, 4, 5)) is None
    # a source stored channels-last: x[n, c, h, w] = flat(t)[((n*H + h)*W + w)*C + c]
    t = np.arange(2 * 4 * 5 * 3).reshape(2, 4, 5, 3)
    assert read_format(np.transpose(t, (0, 3, 1, 2))) == "nhwc"
    assert read_format(base) == "nchw"
    assert read_format(np.transpose(base, (0, 1, 3, 2))) is None


# ---------------------------------------------------------------------------------------------
# Numerics against TVM's build of the original region

CASES = {
    "depthwise tokens gelu": dict(),
    "depthwise tokens no act": dict(act=None),
    "depthwise tokens const bias": dict(bias="const", h=5, w=3, c=16),
    "dense tokens bias on tokens": dict(groups=1, f=12, bias="tokens", act="relu"),
    "grouped strided tokens": dict(groups=2, f=6, c=4, stride=2, h=6, w=6),
    "batched tokens": dict(batch=2, bias=None),
    "nchw in, tokens out": dict(tokens_in=False, groups=1, f=5, c=3),
    "tokens in, nchw out, gelu": dict(tokens_out=False, groups=4),
    "nchw both, no bias": dict(tokens_in=False, tokens_out=False, bias=None, groups=1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_numerics_match_tvm(case):
    region = _region(mix_ffn(**CASES[case]))
    assert region.library_form() is not None
    ref = isolated_region_module(region)
    got = isolated_region_module(region, impl="native")
    assert "nn.conv2d" not in got.script()
    ok, why = check_numerics(ref, got)
    assert ok, why


# ---------------------------------------------------------------------------------------------
# In the pass: offered, timed against the others, emitted

OPTS = dict(trials=0, max_depth=1, search_time_s=1.0, check_untuned=False,
            blocked_layout=False, calibration=sm.LLVM_CALIB)


def _timer(fast: str):
    """Times ``fast`` (an alternative label) 1 us and everything else 1 ms."""
    return lambda _mod, label: 1e-6 if label.endswith("|" + fast) else 1e-3


def _run(mod, args):
    ex = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def test_offered_and_chosen_when_it_measures_faster():
    from tvm_ollie.transform.optimize import optimize_module

    mod = mix_ffn(h=4, w=4, c=8)
    new, report = optimize_module(mod, "llvm", timer=_timer("original [native]"), **OPTS)
    (decision,) = [d for d in report.regions if d.kind == "region"]
    assert decision.chosen == "original [native]", decision.reason
    script = new.script()
    assert "nn.conv2d" not in script and "permute_dims" not in script
    assert "src_fmt=nhwc" in script and "act=gelu" in script
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((16, 8)).astype(F32), rng.standard_normal((1, 8, 1, 1))
            .astype(F32)]
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-5, atol=1e-5)


def test_library_plan_takes_the_native_form():
    """The guard's library plan (no derivation) finds the regions and takes a region's native
    form, as it takes every call's library kernel: Before = the Mix-FFN region, Expected = one
    channels-last conv call with the GELU folded, no transpose left; the same result."""
    from tvm_ollie.config import OllieConfig
    from tvm_ollie.pipeline.joint import library_plan

    mod = mix_ffn(h=4, w=4, c=8)
    new, report = library_plan(mod, OllieConfig(target="llvm", **OPTS))
    (decision,) = [d for d in report.regions if d.kind == "region"]
    assert decision.chosen == "original [native]", decision.reason
    script = new.script()
    assert "nn.conv2d" not in script and "permute_dims" not in script
    assert "src_fmt=nhwc" in script and "act=gelu" in script
    rng = np.random.default_rng(1)
    args = [rng.standard_normal((16, 8)).astype(F32), rng.standard_normal((1, 8, 1, 1))
            .astype(F32)]
    np.testing.assert_allclose(_run(new, args), _run(mod, args), rtol=1e-5, atol=1e-5)


def test_kept_when_the_original_measures_faster():
    from tvm_ollie.transform.optimize import optimize_module

    mod = mix_ffn(h=4, w=4, c=8)
    _, report = optimize_module(mod, "llvm", timer=_timer("original"), **OPTS)
    (decision,) = [d for d in report.regions if d.kind == "region"]
    assert decision.chosen == "original"
    assert "original [native]" in decision.reason  # it was timed


def test_not_offered_without_a_permutation():
    """NCHW views only: the form exists (and computes the same) but is not an alternative:
    kept, the region's conv is decided alone with the same epilogue fold."""
    from tvm_ollie.transform.alternatives import Candidates

    region = _region(mix_ffn(tokens_in=False, tokens_out=False, groups=1, f=6))
    assert region.library_form() is not None
    found = Candidates(library=True, derive=False, max_depth=1)(region, 1.0)
    assert [a.label for a in found.alternatives] == ["original"]
    offered = Candidates(library=True, derive=False, max_depth=1)(_region(mix_ffn()), 1.0)
    assert [a.label for a in offered.alternatives] == ["original", "original [native]"]


@pytest.mark.parametrize("bias_shape,folds", [((6,), True), ((1, 5, 1, 1), False)])
def test_epilogue_bias_of_a_channels_last_call(bias_shape, folds):
    """A call writing channels-last (``dst_fmt=nhwc``, out [1, 5, 5, 6]) takes a bias along its
    last axis as its epilogue, never one along axis 1 (the NCHW channel axis, here H): the
    fold leaves the numerics unchanged."""
    from tvm_ollie.transform.epilogue import fuse_epilogues

    x = _var("x", (1, 5, 5, 4))
    kernel = lib.conv2d_call((1, 1), (1, 1, 1, 1), (1, 1), 1, "NCHW", "OIHW").with_attrs(
        src_fmt="nhwc", dst_fmt="nhwc")
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(lib.emit_call(kernel, [x, relax.const(_rng_w(1, 6, 4, 3, 3))],
                                      (1, 5, 5, 6)))
            out = bb.emit_output(R.add(y, relax.const(_rng_w(2, *bias_shape))))
        bb.emit_func_output(out)
    mod = bb.get()
    fused, counts = fuse_epilogues(mod)
    assert bool(counts) == folds
    assert ("bias=1" in fused.script()) == folds
    x_val = np.random.default_rng(0).standard_normal((1, 5, 5, 4)).astype(F32)
    np.testing.assert_allclose(_run(fused, [x_val]), _run(mod, [x_val]), rtol=1e-5, atol=1e-5)
