"""CPU schedule rules: same results as TVM's unscheduled build, parallel loops where expected."""

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.s_tir import dlight

from tvm_ollie.tune import cpu_schedule as cs
from tvm_ollie.tune.metaschedule import default_pipeline

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})
F32 = "float32"


def _module(body, params):
    """A one-function Relax module: ``params`` is [(shape, dtype)], ``body(*vars)`` the output."""
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(shape, dtype))
          for i, (shape, dtype) in enumerate(params)]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(body(*xs))
        bb.emit_func_output(out)
    return bb.get()


def _inputs(params, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in params:
        if dtype == "bool":
            out.append(rng.random(shape) > 0.5)
        elif dtype.startswith("int"):
            out.append(rng.integers(-50, 50, size=shape).astype(dtype))
        else:
            out.append(rng.standard_normal(shape).astype(dtype))
    return out


def _run(lowered, inputs):
    """Build a module that already went through a Relax pipeline and run its ``main``."""
    ex = tvm.compile(lowered, target=TARGET, relax_pipeline=tvm.transform.Sequential([]))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return [o.numpy() for o in out] if not hasattr(out, "numpy") else [out.numpy()]


def _loop_kinds(func):
    kinds = set()

    def visit(node):
        kinds.add(int(node.kind))

    tvm_ffi.structural_walk(func.body, [(tirx.For, visit)], order="post")
    return kinds


def _prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def _has(func, kind):
    return int(kind) in _loop_kinds(func)


PARALLEL, VECTORIZED = tirx.ForKind.PARALLEL, tirx.ForKind.VECTORIZED
R = relax.op


def _take(x, idx):
    return R.take(x, idx, axis=1)


def _idx(shape, high):
    """Index input for take: a tensor of valid indices (int64) built from a constant."""
    return relax.const(np.random.default_rng(1).integers(0, high, size=shape).astype("int64"))


# name: (body, params, parallel expected, exact comparison, scheduling rule expected)
CASES = {
    "add_relu_sigmoid_broadcast": (
        lambda x, y: R.sigmoid(R.nn.relu(R.add(R.multiply(x, y), y))),
        [((64, 128, 56), F32), ((56,), F32)], True, True, "InjectiveRule"),
    "transpose": (lambda x: R.permute_dims(x, [0, 2, 1]), [((32, 64, 48), F32)],
                  True, True, "InjectiveRule"),
    "pad": (lambda x: R.nn.pad(x, [0, 0, 0, 0, 1, 2, 3, 1], pad_value=0.5),
            [((1, 16, 56, 56), F32)], True, True, "InjectiveRule"),
    "strided_slice": (lambda x: R.strided_slice(x, [1, 2], [1, 0], [121, 112], [2, 3]),
                      [((32, 128, 112), F32)], True, True, "InjectiveRule"),
    "concat": (lambda x, y: R.concat([x, y], axis=1),
               [((8, 48, 64), F32), ((8, 16, 64), F32)], True, True, "InjectiveRule"),
    "take_gather": (lambda x: _take(x, _idx((96,), 200)), [((256, 200), F32)],
                    True, True, "InjectiveRule"),
    "reshape_transpose": (lambda x: R.permute_dims(R.reshape(x, (16, 32, 8, 16)), [0, 2, 1, 3]),
                          [((16, 32, 128), F32)], True, True, "InjectiveRule"),
    "softmax": (lambda x: R.nn.softmax(x, axis=-1), [((64, 56, 128), F32)],
                True, False, "dlight.cpu.Reduction"),
    "layer_norm": (lambda x, g, b: R.nn.layer_norm(x, g, b, axes=[-1]),
                   [((4, 128, 96), F32), ((96,), F32), ((96,), F32)],
                   True, False, "dlight.cpu.Reduction"),
    # reductions of < 64 elements per output stay serial (measured slower in parallel) ...
    "mean_middle_axis": (lambda x: R.mean(x, axis=[1]), [((64, 56, 128), F32)],
                         False, False, None),
    "max_pool2d": (lambda x: R.nn.max_pool2d(x, (3, 3), (2, 2), (1, 1)),
                   [((1, 16, 56, 56), F32)], False, True, None),
    # ... while their injective producers/consumers and longer reductions are parallel
    "mean_middle_axis_long": (lambda x: R.mean(x, axis=[1]), [((32, 96, 128), F32)],
                              True, False, "ReductionRule"),
    "max_pool2d_8x8": (lambda x: R.nn.max_pool2d(x, (8, 8), (8, 8)), [((1, 16, 128, 128), F32)],
                       True, True, "ReductionRule"),
    "avg_pool2d": (lambda x: R.nn.avg_pool2d(x, (2, 2), (2, 2)), [((2, 16, 64, 64), F32)],
                   False, False, None),
    "matmul": (lambda x, w: R.matmul(x, w), [((64, 128), F32), ((128, 96), F32)],
               True, False, "ReductionRule"),
    "gemv": (lambda x, v: R.matmul(x, v), [((512, 256), F32), ((256,), F32)], True, False,
             "ReductionRule"),
    "conv2d_relu": (lambda x, w: R.nn.relu(R.nn.conv2d(x, w, padding=(1, 1))),
                    [((1, 8, 32, 32), F32), ((16, 8, 3, 3), F32)], True, False, None),
    "odd_small_7x13x5": (lambda x, y: R.multiply(R.add(x, y), x), [((7, 13, 5), F32)] * 2,
                         False, True, None),
    "odd_large_37x61x13": (lambda x, y: R.tanh(R.subtract(x, y)), [((37, 61, 13), F32)] * 2,
                           True, True, "InjectiveRule"),
    "one_element": (lambda x, y: R.add(x, y), [((1,), F32), ((1,), F32)], False, True, None),
    "int64_max": (lambda x, y: R.maximum(R.multiply(x, y), y), [((128, 256), "int64")] * 2,
                  True, True, "InjectiveRule"),
    "int32_sum": (lambda x: R.sum(R.add(x, x), axis=[1]), [((512, 256), "int32")],
                  True, True, None),
    "bool_compare": (lambda x, y, m: R.logical_and(R.greater(x, y), m),
                     [((64, 512), F32), ((64, 512), F32), ((64, 512), "bool")],
                     True, True, "InjectiveRule"),
    "float16_chain": (lambda x, y: R.multiply(R.add(x, y), y), [((64, 1024), "float16")] * 2,
                      True, True, "InjectiveRule"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedule_keeps_results_and_parallelizes(name):
    body, params, parallel, exact, rule = CASES[name]
    mod = _module(body, params)
    base = relax.get_default_pipeline(TARGET)(mod)
    ours = cs.cpu_pipeline(TARGET)(mod)
    funcs = _prim_funcs(ours)
    scheduled = {n: f.attrs.get(cs.SCHEDULED_BY_ATTR) for n, f in funcs.items()
                 if f.attrs.get(cs.SCHEDULED_BY_ATTR) is not None}
    any_parallel = any(_has(f, PARALLEL) for f in funcs.values())
    assert any_parallel == parallel, (name, scheduled)
    assert not any(_has(f, PARALLEL) for f in _prim_funcs(base).values())
    if rule is not None:
        assert rule in scheduled.values(), scheduled
    inputs = _inputs(params)
    want, got = _run(base, inputs), _run(ours, inputs)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert w.dtype == g.dtype and w.shape == g.shape
        if exact:
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_injective_chain_is_inlined_and_vectorized():
    mod = _module(CASES["add_relu_sigmoid_broadcast"][0], CASES["add_relu_sigmoid_broadcast"][1])
    (func,) = _prim_funcs(cs.cpu_pipeline(TARGET)(mod)).values()
    assert _has(func, VECTORIZED) and _has(func, PARALLEL)
    assert "sblock_alloc_buffer" not in func.script()  # the intermediates were inlined away


class _Raises(dlight.ScheduleRule):
    """A rule that schedules half-way and then raises, as a buggy rule would."""

    def apply(self, func, target, tunable):
        from tvm import s_tir

        sch = s_tir.Schedule(func)
        sch.parallel(sch.get_loops(sch.get_sblock(_first_block(func)))[0])
        raise RuntimeError("rule bug")


def _first_block(func):
    names = []

    def visit(node):
        names.append(node.name_hint)

    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, visit)], order="pre")
    return [n for n in names if n != "root"][0]


def test_raising_rule_leaves_function_unscheduled_and_build_correct():
    body, params = CASES["add_relu_sigmoid_broadcast"][:2]
    mod = _module(body, params)
    pipeline = cs.cpu_pipeline(TARGET, rules=[_Raises(), cs.InjectiveRule()])
    lowered = pipeline(mod)
    base = relax.get_default_pipeline(TARGET)(mod)
    for name, func in _prim_funcs(lowered).items():
        assert not _has(func, PARALLEL) and cs.SCHEDULED_BY_ATTR not in func.attrs
        tvm.ir.assert_structural_equal(func, _prim_funcs(base)[name])
    inputs = _inputs(params)
    np.testing.assert_array_equal(_run(lowered, inputs)[0], _run(base, inputs)[0])


class _RaisesInSchedule(dlight.ScheduleRule):
    """Vectorizes a reduction loop: the schedule primitive itself raises."""

    def apply(self, func, target, tunable):
        from tvm import s_tir

        sch = s_tir.Schedule(func)
        block = sch.get_sblock(_first_block(func))
        sch.vectorize(sch.get_loops(block)[-1])
        return sch


class _VectorizeDynamic(dlight.ScheduleRule):
    """Returns a schedule TIR lowering rejects (a vector loop of symbolic extent on x86)."""

    def apply(self, func, target, tunable):
        from tvm import s_tir

        sch = s_tir.Schedule(func)
        sch.vectorize(sch.get_loops(sch.get_sblock(_first_block(func)))[0])
        return sch


def test_schedule_primitive_error_leaves_reduction_unscheduled():
    mod = _module(lambda x: R.sum(x, axis=[1]), [((64, 256), F32)])
    lowered = cs.cpu_pipeline(TARGET, rules=[_RaisesInSchedule(), cs.ReductionRule()])(mod)
    for func in _prim_funcs(lowered).values():
        assert cs.SCHEDULED_BY_ATTR not in func.attrs and not _has(func, PARALLEL)
    inputs = _inputs([((64, 256), F32)])
    np.testing.assert_allclose(_run(lowered, inputs)[0], inputs[0].sum(axis=1), rtol=1e-4,
                               atol=1e-4)


def test_schedule_that_fails_lowering_is_dropped_and_build_works():
    n = tirx.Var("n", "int64")
    mod = _module(lambda x, y: R.add(x, y), [((n, 64), F32), ((n, 64), F32)])
    with TARGET:  # without the check the build itself fails on this schedule
        with pytest.raises(Exception, match="vectorize"):
            tvm.compile(mod, target=TARGET, relax_pipeline=tvm.transform.Sequential(
                [relax.get_pipeline("zero"), dlight.ApplyDefaultSchedule(_VectorizeDynamic()),
                 relax.get_default_pipeline(TARGET)]))
    lowered = cs.cpu_pipeline(TARGET, rules=[_VectorizeDynamic()])(mod)
    for func in _prim_funcs(lowered).values():
        assert cs.SCHEDULED_BY_ATTR not in func.attrs and not _has(func, VECTORIZED)
    inputs = _inputs([((5, 64), F32), ((5, 64), F32)])
    np.testing.assert_array_equal(_run(lowered, inputs)[0], inputs[0] + inputs[1])
    # the default rules do schedule the dynamic-shape add (parallel over the symbolic extent)
    funcs = _prim_funcs(cs.cpu_pipeline(TARGET)(mod))
    assert any(_has(f, PARALLEL) for f in funcs.values())
    np.testing.assert_array_equal(_run(cs.cpu_pipeline(TARGET)(mod), inputs)[0],
                                  inputs[0] + inputs[1])


def test_scheduled_functions_are_left_alone():
    mod = _module(CASES["transpose"][0], CASES["transpose"][1])
    with TARGET:
        legal = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                          relax.transform.AnnotateTIROpPattern(),
                                          relax.transform.FuseOps(),
                                          relax.transform.FuseTIR()])(mod)
        marked = legal
        for gv, func in _prim_funcs(legal).items():
            marked[marked.get_global_var(gv)] = func.with_attr(cs.IS_SCHEDULED_ATTR, True)
        assert _prim_funcs(marked)
        before = _prim_funcs(marked)
        after = _prim_funcs(cs.cpu_schedule_pass()(marked))
    assert before.keys() == after.keys()
    for name, func in after.items():
        tvm.ir.assert_structural_equal(func, before[name])
        assert not _has(func, PARALLEL)


def test_small_kernels_stay_single_threaded_and_threshold_is_a_parameter():
    body, params = CASES["odd_small_7x13x5"][:2]
    mod = _module(body, params)
    funcs = _prim_funcs(cs.cpu_pipeline(TARGET)(mod))
    assert not any(_has(f, PARALLEL) for f in funcs.values())
    low = cs.cpu_pipeline(TARGET, rules=cs.default_rules(min_parallel_work=64))(mod)
    assert any(_has(f, PARALLEL) for f in _prim_funcs(low).values())


def test_fallback_rule_alone_parallelizes_outer_spatial_loop_of_matmul():
    body, params = CASES["matmul"][:2]
    mod = _module(body, params)
    lowered = cs.cpu_pipeline(TARGET, rules=[cs.FallbackRule()])(mod)
    (func,) = _prim_funcs(lowered).values()
    assert func.attrs[cs.SCHEDULED_BY_ATTR] == "FallbackRule" and _has(func, PARALLEL)
    inputs = _inputs(params)
    np.testing.assert_allclose(_run(lowered, inputs)[0], inputs[0] @ inputs[1], rtol=1e-4,
                               atol=1e-4)


def test_one_core_target_never_parallelizes():
    one = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    body, params = CASES["add_relu_sigmoid_broadcast"][:2]
    funcs = _prim_funcs(cs.cpu_pipeline(one)(_module(body, params)))
    assert not any(_has(f, PARALLEL) for f in funcs.values())
    assert any(_has(f, VECTORIZED) for f in funcs.values())


def test_opt_out_and_default_pipeline(monkeypatch):
    body, params = CASES["transpose"][:2]
    mod = _module(body, params)
    assert any(_has(f, PARALLEL) for f in _prim_funcs(default_pipeline(TARGET)(mod)).values())
    assert not any(_has(f, PARALLEL)
                   for f in _prim_funcs(cs.cpu_pipeline(TARGET, enabled=False)(mod)).values())
    monkeypatch.setenv(cs.ENV_SWITCH, "0")
    assert not any(_has(f, PARALLEL) for f in _prim_funcs(default_pipeline(TARGET)(mod)).values())


def test_function_with_short_reduction_is_left_unscheduled():
    body, params = CASES["max_pool2d"][:2]
    mod = _module(body, params)
    (func,) = _prim_funcs(cs.cpu_pipeline(TARGET)(mod)).values()
    (base,) = _prim_funcs(relax.get_default_pipeline(TARGET)(mod)).values()
    assert cs.SCHEDULED_BY_ATTR not in func.attrs
    tvm.ir.assert_structural_equal(func, base)
    # not even the fallback parallelizes it
    (fallback,) = _prim_funcs(cs.cpu_pipeline(TARGET, rules=[cs.FallbackRule()])(mod)).values()
    assert not _has(fallback, PARALLEL)


def test_eoperator_gather_from_te_is_parallel_not_vectorized():
    """An im2col-like TE gather (as our pass emits): div/mod indices are not vectorized."""
    from tvm_ollie.bench.sched_bench import _im2col

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 16, 20, 24), F32))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(_im2col, x))
        bb.emit_func_output(out)
    mod = bb.get()
    lowered = cs.cpu_pipeline(TARGET)(mod)
    (func,) = _prim_funcs(lowered).values()
    assert func.attrs[cs.SCHEDULED_BY_ATTR] == "InjectiveRule"
    assert _has(func, PARALLEL) and not _has(func, VECTORIZED)
    inputs = _inputs([((1, 16, 20, 24), F32)])
    base = relax.get_default_pipeline(TARGET)(mod)
    np.testing.assert_array_equal(_run(lowered, inputs)[0], _run(base, inputs)[0])
    padded = np.pad(inputs[0][0], ((0, 0), (1, 1), (1, 1)))
    c, r, s = 5, 4, 7  # channel 5, tap (1, 2), output pixel (4, 7)
    assert _run(lowered, inputs)[0][0, c * 9 + 5, r * 24 + s] == padded[c, r + 1, s + 2]
