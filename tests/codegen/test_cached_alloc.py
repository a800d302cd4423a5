"""Planned allocations made once per VM (:mod:`tvm_ollie.codegen.cached_alloc`).

Structure: Before (a function as ``StaticPlanBlockMemory`` leaves it) and Expected after each
pass. Numerics: the CPU pipeline with the passes against TVM's own build, over consecutive calls
whose earlier outputs must stay intact (returned tensors never live in the cached memory), on
two VMs of one executable, and a dynamic-shape module, which is left alone.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie.codegen import cached_alloc
from tvm_ollie.codegen.cached_alloc import DropCachedKills, LiftPlannedAllocations
from tvm_ollie.compat import relax, tvm
from tvm_ollie.config import ConfigError, OllieConfig, config_scope
from tvm_ollie.tune.metaschedule import default_pipeline

# pylint: disable=invalid-name,no-self-argument,missing-class-docstring
# pylint: disable=missing-function-docstring,redefined-outer-name,unused-argument


@I.ir_module
class Planned:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        R.func_attr({"relax.force_pure": True})
        storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                R.dtype("float32"))
        a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(storage, 0, R.shape([2, 8]),
                                                                R.dtype("float32"), 0)
        _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
        out: R.Tensor((2, 8), "float32") = R.builtin.alloc_tensor(
            R.shape([2, 8]), R.dtype("float32"), 0, R.str("global"))
        _2: R.Tuple = R.call_packed("test.relu", a, out, ty_args=(R.Tuple,))
        return out


@I.ir_module
class Lifted:
    @R.function(private=True)
    def main_cached_alloc() -> R.Tuple(R.Tensor((2, 8), "float32")):
        R.func_attr({"relax.force_pure": True})
        storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                R.dtype("float32"))
        a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(storage, 0, R.shape([2, 8]),
                                                                R.dtype("float32"), 0)
        return (a,)

    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        R.func_attr({"relax.force_pure": True})
        cls = Lifted
        cached: R.Tuple(R.Tensor((2, 8), "float32")) = R.call_builtin_with_ctx(
            "tvm_ollie.vm.cached_alloc", (cls.main_cached_alloc,),
            ty_args=(R.Tuple(R.Tensor((2, 8), "float32")),))
        a: R.Tensor((2, 8), "float32") = cached[0]
        _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
        out: R.Tensor((2, 8), "float32") = R.builtin.alloc_tensor(
            R.shape([2, 8]), R.dtype("float32"), 0, R.str("global"))
        _2: R.Tuple = R.call_packed("test.relu", a, out, ty_args=(R.Tuple,))
        return out


def test_lift_structure():
    """Before/Expected: the planned storage and its view move into the allocation function;
    the returned tensor (``R.builtin.alloc_tensor``, unplanned) stays per call."""
    tvm.ir.assert_structural_equal(LiftPlannedAllocations()(Planned), Lifted)


def test_lift_reshape_structure():
    """Before/Expected: a reshape of a lifted view (read through a trivial binding) is a view
    of the same cached memory: lifted with it."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((4, 4), "float32"):
            R.func_attr({"relax.force_pure": True})
            storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                    R.dtype("float32"))
            a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
            lv: R.Tensor((2, 8), "float32") = a
            r: R.Tensor((4, 4), "float32") = R.reshape(lv, R.shape([4, 4]))
            out: R.Tensor((4, 4), "float32") = R.builtin.alloc_tensor(
                R.shape([4, 4]), R.dtype("float32"), 0, R.str("global"))
            _2: R.Tuple = R.call_packed("test.relu", r, out, ty_args=(R.Tuple,))
            return out

    @I.ir_module
    class Expected:
        @R.function(private=True)
        def main_cached_alloc() -> R.Tuple(R.Tensor((2, 8), "float32"),
                                           R.Tensor((4, 4), "float32")):
            R.func_attr({"relax.force_pure": True})
            storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                    R.dtype("float32"))
            a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            r: R.Tensor((4, 4), "float32") = R.reshape(a, R.shape([4, 4]))
            return (a, r)

        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((4, 4), "float32"):
            R.func_attr({"relax.force_pure": True})
            cls = Expected
            cached: R.Tuple(R.Tensor((2, 8), "float32"), R.Tensor((4, 4), "float32")) = \
                R.call_builtin_with_ctx(
                    "tvm_ollie.vm.cached_alloc", (cls.main_cached_alloc,),
                    ty_args=(R.Tuple(R.Tensor((2, 8), "float32"),
                                     R.Tensor((4, 4), "float32")),))
            a: R.Tensor((2, 8), "float32") = cached[0]
            _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
            lv: R.Tensor((2, 8), "float32") = a
            r: R.Tensor((4, 4), "float32") = cached[1]
            out: R.Tensor((4, 4), "float32") = R.builtin.alloc_tensor(
                R.shape([4, 4]), R.dtype("float32"), 0, R.str("global"))
            _2: R.Tuple = R.call_packed("test.relu", r, out, ty_args=(R.Tuple,))
            return out

    tvm.ir.assert_structural_equal(LiftPlannedAllocations()(Before), Expected)


def test_equal_views_share_an_item():
    """Before/Expected: two views with the same storage, offset, shape and dtype (the planner
    reusing a block for tensors of one size) are one tensor: one item, the second bound to the
    first (a binding that generates no code)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((16,), "float32"):
            R.func_attr({"relax.force_pure": True})
            storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                    R.dtype("float32"))
            a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
            b: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            _2: R.Tuple = R.call_packed("test.relu", a, b, ty_args=(R.Tuple,))
            r: R.Tensor((16,), "float32") = R.reshape(b, R.shape([16]))
            out: R.Tensor((16,), "float32") = R.builtin.alloc_tensor(
                R.shape([16]), R.dtype("float32"), 0, R.str("global"))
            _3: R.Tuple = R.call_packed("test.relu", r, out, ty_args=(R.Tuple,))
            return out

    @I.ir_module
    class Expected:
        @R.function(private=True)
        def main_cached_alloc() -> R.Tuple(R.Tensor((2, 8), "float32"),
                                           R.Tensor((16,), "float32")):
            R.func_attr({"relax.force_pure": True})
            storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                    R.dtype("float32"))
            a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            r: R.Tensor((16,), "float32") = R.reshape(a, R.shape([16]))
            return (a, r)

        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((16,), "float32"):
            R.func_attr({"relax.force_pure": True})
            cls = Expected
            cached: R.Tuple(R.Tensor((2, 8), "float32"), R.Tensor((16,), "float32")) = \
                R.call_builtin_with_ctx(
                    "tvm_ollie.vm.cached_alloc", (cls.main_cached_alloc,),
                    ty_args=(R.Tuple(R.Tensor((2, 8), "float32"), R.Tensor((16,), "float32")),))
            a: R.Tensor((2, 8), "float32") = cached[0]
            _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
            b: R.Tensor((2, 8), "float32") = a
            _2: R.Tuple = R.call_packed("test.relu", a, b, ty_args=(R.Tuple,))
            r: R.Tensor((16,), "float32") = cached[1]
            out: R.Tensor((16,), "float32") = R.builtin.alloc_tensor(
                R.shape([16]), R.dtype("float32"), 0, R.str("global"))
            _3: R.Tuple = R.call_packed("test.relu", r, out, ty_args=(R.Tuple,))
            return out

    tvm.ir.assert_structural_equal(LiftPlannedAllocations()(Before), Expected)


def test_drop_kills_structure():
    """Before/Expected: the kill of a cached view goes, the kill of the tuple and of an
    uncached tensor stay."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            R.func_attr({"relax.force_pure": True})
            cached: R.Tuple(R.Tensor((2, 8), "float32")) = R.call_builtin_with_ctx(
                "tvm_ollie.vm.cached_alloc", (x,),
                ty_args=(R.Tuple(R.Tensor((2, 8), "float32")),))
            a: R.Tensor((2, 8), "float32") = cached[0]
            R.vm.kill_object(cached)
            b: R.Tensor((2, 8), "float32") = R.builtin.alloc_tensor(
                R.shape([2, 8]), R.dtype("float32"), 0, R.str("global"))
            _1: R.Tuple = R.call_packed("test.relu", a, b, ty_args=(R.Tuple,))
            R.memory.kill_tensor(a)
            out: R.Tensor((2, 8), "float32") = R.builtin.alloc_tensor(
                R.shape([2, 8]), R.dtype("float32"), 0, R.str("global"))
            _2: R.Tuple = R.call_packed("test.relu", b, out, ty_args=(R.Tuple,))
            R.memory.kill_tensor(b)
            return out

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            R.func_attr({"relax.force_pure": True})
            cached: R.Tuple(R.Tensor((2, 8), "float32")) = R.call_builtin_with_ctx(
                "tvm_ollie.vm.cached_alloc", (x,),
                ty_args=(R.Tuple(R.Tensor((2, 8), "float32")),))
            a: R.Tensor((2, 8), "float32") = cached[0]
            R.vm.kill_object(cached)
            b: R.Tensor((2, 8), "float32") = R.builtin.alloc_tensor(
                R.shape([2, 8]), R.dtype("float32"), 0, R.str("global"))
            _1: R.Tuple = R.call_packed("test.relu", a, b, ty_args=(R.Tuple,))
            out: R.Tensor((2, 8), "float32") = R.builtin.alloc_tensor(
                R.shape([2, 8]), R.dtype("float32"), 0, R.str("global"))
            _2: R.Tuple = R.call_packed("test.relu", b, out, ty_args=(R.Tuple,))
            R.memory.kill_tensor(b)
            return out

    tvm.ir.assert_structural_equal(DropCachedKills()(Before), Expected)


def test_left_alone_dynamic_and_called():
    """A symbolic shape in the signature, or a function another Relax function calls: no
    change."""

    @I.ir_module
    class Dynamic:
        @R.function
        def main(x: R.Tensor(("n", 8), "float32")) -> R.Tensor(("n", 8), "float32"):
            R.func_attr({"relax.force_pure": True})
            storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                    R.dtype("float32"))
            a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
            return x

    tvm.ir.assert_structural_equal(LiftPlannedAllocations()(Dynamic), Dynamic)

    @I.ir_module
    class Called:
        @R.function
        def inner(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            R.func_attr({"relax.force_pure": True})
            storage: R.Any = R.memory.alloc_storage(R.shape([64]), 0, R.str("global"),
                                                    R.dtype("float32"))
            a: R.Tensor((2, 8), "float32") = R.memory.alloc_tensor(
                storage, 0, R.shape([2, 8]), R.dtype("float32"), 0)
            _1: R.Tuple = R.call_packed("test.relu", x, a, ty_args=(R.Tuple,))
            return x

        @R.function
        def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
            cls = Called
            y: R.Tensor((2, 8), "float32") = cls.inner(x)
            return y

    tvm.ir.assert_structural_equal(LiftPlannedAllocations()(Called), Called)


def test_switch():
    """On by default; ``on=False`` (or ``OllieConfig.cached_alloc=False``) is TVM's list
    unchanged; on adds the two passes where they belong."""
    target = tvm.target.Target("llvm")
    tvm_names = [p.info.name for p in cached_alloc.finalize_passes(target, on=False)]
    assert tvm_names == [p.info.name for p in cpu_generic.finalize_passes(target)]
    assert OllieConfig().cached_alloc  # on by default (docs/per-call.md)
    with config_scope(OllieConfig()):
        assert cached_alloc.enabled() == cached_alloc.available()
    with config_scope(OllieConfig(cached_alloc=False)):
        assert not cached_alloc.enabled()
    with pytest.raises(ConfigError):
        OllieConfig(cached_alloc="no")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(cached_alloc.ENV_SWITCH, "0")
        with cached_alloc.cached_alloc_scope(True):
            assert not cached_alloc.enabled()
    with cached_alloc.cached_alloc_scope(False):
        assert [p.info.name for p in cached_alloc.finalize_passes(target)] == tvm_names
    if not cached_alloc.available():
        return
    names = [p.info.name for p in cached_alloc.finalize_passes(target, on=True)]
    assert names[names.index("StaticPlanBlockMemory") + 1] == "LiftPlannedAllocations"
    assert names[names.index("KillAfterLastUse") + 1] == "DropCachedKills"


@pytest.fixture
def builtin():
    if not cached_alloc.available():
        pytest.skip("the loaded native library predates tvm_ollie.vm.cached_alloc")


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((2, 16), "float32"), w: R.Tensor((16, 16), "float32"),
             w8: R.Tensor((8, 8), "float32")
             ) -> R.Tuple(R.Tensor((2, 16), "float32"), R.Tensor((2, 16), "float32")):
        with R.dataflow():
            a = R.nn.relu(R.matmul(x, w))
            r = R.reshape(a, (4, 8))  # a reshape of a planned tensor: lifted too
            t = R.reshape(R.matmul(r, w8), (2, 16))
            b = R.nn.relu(R.matmul(t, w))
            c = R.add(R.matmul(b, w), a)
            d = R.reshape(R.nn.relu(R.matmul(c, w)), (2, 16))
            e = R.multiply(R.matmul(d, w), b)
            R.output(d, e)
        return (d, e)


def _reference(x, w, w8):
    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    a = relu(x @ w)
    t = (a.reshape(4, 8) @ w8).reshape(2, 16)
    b = relu(t @ w)
    c = b @ w + a
    d = relu(c @ w)
    return d, (d @ w) * b


def _build(mod, on: bool):
    with cached_alloc.cached_alloc_scope(on):
        return tvm.compile(mod, target="llvm", relax_pipeline=default_pipeline("llvm"))


def test_outputs_survive_later_calls(builtin):
    """The cached build computes what TVM's build does, and what a call returned stays
    intact through the next calls (outputs are never in the reused memory)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16)).astype("float32") * 0.3
    w8 = rng.standard_normal((8, 8)).astype("float32") * 0.3
    xs = [rng.standard_normal((2, 16)).astype("float32") for _ in range(3)]
    ex = _build(Chain, True)
    assert "tvm_ollie.vm.cached_alloc" in ex.as_text()
    tvm_ex = tvm.compile(Chain, target="llvm", relax_pipeline=relax.get_default_pipeline(
        tvm.target.Target("llvm")))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    tvm_vm = relax.VirtualMachine(tvm_ex, tvm.cpu())
    wt, w8t = tvm.runtime.tensor(w), tvm.runtime.tensor(w8)
    outs = [vm["main"](tvm.runtime.tensor(x), wt, w8t) for x in xs]  # kept, not copied
    for x, out in zip(xs, outs):
        ref = tvm_vm["main"](tvm.runtime.tensor(x), wt, w8t)
        for got, want, exact in zip(out, ref, _reference(x, w, w8)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got.numpy(), exact, rtol=1e-4, atol=1e-4)


def test_vms_have_their_own_memory(builtin):
    """Two VMs of one executable, called in turn, do not share buffers; a VM's entry goes
    with it."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((16, 16)).astype("float32") * 0.3
    w8 = rng.standard_normal((8, 8)).astype("float32") * 0.3
    x1, x2 = (rng.standard_normal((2, 16)).astype("float32") for _ in range(2))
    ex = _build(Chain, True)
    gc.collect()
    before = cached_alloc.cached_entries()
    vm1, vm2 = relax.VirtualMachine(ex, tvm.cpu()), relax.VirtualMachine(ex, tvm.cpu())
    wt, w8t = tvm.runtime.tensor(w), tvm.runtime.tensor(w8)
    for _ in range(2):
        o1 = vm1["main"](tvm.runtime.tensor(x1), wt, w8t)
        o2 = vm2["main"](tvm.runtime.tensor(x2), wt, w8t)
        for out, x in ((o1, x1), (o2, x2)):
            for got, exact in zip(out, _reference(x, w, w8)):
                np.testing.assert_allclose(got.numpy(), exact, rtol=1e-4, atol=1e-4)
    assert cached_alloc.cached_entries() == before + 2
    del vm1, vm2
    gc.collect()
    assert cached_alloc.cached_entries() == before


def test_dynamic_shapes_left_alone(builtin):
    """A model with a symbolic batch builds without the cached call and still computes."""

    @I.ir_module
    class Dyn:
        @R.function
        def main(x: R.Tensor(("n", 16), "float32"), w: R.Tensor((16, 16), "float32")
                 ) -> R.Tensor(("n", 16), "float32"):
            with R.dataflow():
                a = R.nn.relu(R.matmul(x, w))
                b = R.add(R.matmul(a, w), a)
                R.output(b)
            return b

    ex = _build(Dyn, True)
    assert "tvm_ollie.vm.cached_alloc" not in ex.as_text()
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 16)).astype("float32") * 0.3
    for n in (3, 5):
        x = rng.standard_normal((n, 16)).astype("float32")
        a = np.maximum(x @ w, 0)
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
        np.testing.assert_allclose(got, a @ w + a, rtol=1e-4, atol=1e-4)
