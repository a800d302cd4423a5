"""Gathers marked injective after TVM's pattern analysis, so that its greedy fusion fuses them
(``tvm_ollie.tune.gather_pattern``): PyTorch's reflection pad (two ``take`` calls, Candy) runs
as one kernel with its elementwise neighbours instead of two lone ones."""

from __future__ import annotations

import numpy as np
import pytest
import tvm_ffi
from tvm.script import tirx as T

from tvm_ollie.compat import relax, tirx, tvm
from tvm_ollie.pipeline.compile import compile_module
from tvm_ollie.profiler.vm_trace import vm_calls
from tvm_ollie.tune.gather_pattern import (INJECTIVE, OPAQUE, is_gather, mark_gathers_injective,
                                           with_gathers_injective)

SHAPE = (1, 4, 6, 6)


def _reflect_index(n: int, pad: int) -> "relax.Constant":
    """PyTorch's reflection pad as an index: ``n-1 - |n-1 - |arange(-pad, n+pad)||``."""
    i = np.arange(-pad, n + pad)
    return relax.const((n - 1 - np.abs(n - 1 - np.abs(i))).astype("int64"))


def _padded(producer: bool = False) -> "tvm.IRModule":
    """``relu(take(take(x', idx, 2), idx, 3))``, ``x' = exp(x)`` with ``producer``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    idx = _reflect_index(SHAPE[2], 2)
    with bb.function("main", [x]):
        with bb.dataflow():
            src = bb.emit(relax.op.exp(x)) if producer else x
            h = bb.emit(relax.op.take(src, idx, axis=2))
            w = bb.emit(relax.op.take(h, idx, axis=3))
            out = bb.emit_output(relax.op.nn.relu(w))
        bb.emit_func_output(out)
    return bb.get()


def _annotated(mod: "tvm.IRModule") -> "tvm.IRModule":
    with tvm.target.Target("llvm"):
        return tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                         relax.transform.AnnotateTIROpPattern()])(mod)


def _prim_funcs(mod: "tvm.IRModule") -> dict:
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def _fused_calls(mod: "tvm.IRModule") -> list:
    with tvm.target.Target("llvm"):
        fused = tvm.transform.Sequential([relax.transform.FuseOps(),
                                          relax.transform.FuseTIR()])(mod)
    return [b.value.args[0].name_hint for b in fused["main"].body.blocks[0].bindings]


def _run(ex, x: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def test_tvm_calls_a_take_opaque_and_the_rule_accepts_it():
    """Why the pass exists: TVM's analysis marks ``take`` opaque; the rule accepts it (one
    spatial block writing at its iterators) and refuses the elementwise and reduction
    kernels, which are not opaque."""
    funcs = _prim_funcs(_annotated(_padded()))
    takes = [f for name, f in funcs.items() if name.startswith("take")]
    assert len(takes) == 2 and all(int(f.attrs["op_pattern"]) == OPAQUE for f in takes)
    assert all(is_gather(f) for f in takes)
    assert not is_gather(funcs["relu"])


def test_a_reduction_or_an_opaque_kernel_of_several_blocks_is_no_gather():
    """``sum`` (a reduction iterator), a kernel of two blocks and a predicated block stay as
    TVM marked them."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(x, axis=[2]))
        bb.emit_func_output(out)
    funcs = _prim_funcs(_annotated(bb.get()))
    reduction = next(iter(funcs.values())).with_attr("op_pattern", OPAQUE)
    assert not is_gather(reduction)

    @T.prim_func(s_tir=True)
    def two_blocks(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        T.func_attr({"op_pattern": 8})
        tmp = T.alloc_buffer((4,), "float32")
        for i in range(4):
            with T.sblock("first"):
                v = T.axis.spatial(4, i)
                tmp[v] = a[v] * T.float32(2)
        for i in range(4):
            with T.sblock("second"):
                v = T.axis.spatial(4, i)
                b[v] = tmp[3 - v]

    assert not is_gather(two_blocks)

    @T.prim_func(s_tir=True)
    def predicated(a: T.Buffer((4,), "float32"), b: T.Buffer((3,), "float32")):
        T.func_attr({"op_pattern": 8})
        for i in range(4):
            with T.sblock("part"):
                v = T.axis.spatial(3, i)
                T.where(i < 3)
                b[v] = a[3 - v]

    assert not is_gather(predicated)


def test_marking_is_the_attribute_change_only():
    """Before: the legalized, annotated module. Expected: the same module with each take
    kernel's ``op_pattern`` injective, nothing else changed."""
    before = _annotated(_padded())
    expected = _annotated(_padded())
    for gv, func in list(expected.functions_items()):
        if gv.name_hint.startswith("take"):
            expected[gv] = func.with_attr("op_pattern", INJECTIVE)
    after = mark_gathers_injective(before)
    tvm.ir.assert_structural_equal(after, expected)
    assert not tvm_ffi.structural_equal(after, _annotated(_padded()))


def test_tvm_fusion_makes_the_pad_and_its_neighbours_one_kernel():
    """Before marking, ``FuseOps`` leaves exp, both takes and relu as four kernels; after, one."""
    mod = _annotated(_padded(producer=True))
    assert len(_fused_calls(mod)) == 4
    assert len(_fused_calls(mark_gathers_injective(mod))) == 1


@pytest.mark.parametrize("producer", [False, True])
def test_the_fused_pad_computes_what_tvm_builds(producer):
    """The ollie build's pipeline (gathers fused) against TVM's default build of the module."""
    mod = _padded(producer)
    ours = compile_module(mod, "llvm")
    assert len(_padded_kernels(ours)) == 1
    x = np.random.default_rng(3).standard_normal(SHAPE).astype("float32")
    np.testing.assert_allclose(_run(ours, x), _run(tvm.compile(mod, "llvm"), x),
                               rtol=1e-6, atol=1e-6)


def _padded_kernels(ex) -> list:
    """The kernels of ``ex``'s main that hold a take."""
    return [c for c in vm_calls(ex) if "take" in c]


def test_the_cpu_pipeline_runs_the_pass_after_the_pattern_analysis():
    """``with_gathers_injective`` inserts the pass right after ``AnnotateTIROpPattern``; the
    ollie build calls one fused kernel for the pad."""
    names = [p.info.name for p in with_gathers_injective(
        [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
         relax.transform.FuseOps()])]
    assert names == ["LegalizeOps", "AnnotateTIROpPattern", "MarkGathersInjective", "FuseOps"]
    assert len(_padded_kernels(compile_module(_padded(), "llvm"))) == 1
