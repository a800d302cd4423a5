"""The VM-overhead measurement's pieces on a small module (no zoo model, no timing asserted)."""

from __future__ import annotations

import numpy as np
import pytest
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ollie.bench import vm_overhead
from tvm_ollie.codegen import cached_alloc
from tvm_ollie.compat import relax, tvm

# pylint: disable=invalid-name,no-self-argument,missing-class-docstring,missing-function-docstring


@I.ir_module
class Chain:
    @R.function
    def main(x: R.Tensor((2, 16), "float32"), w: R.Tensor((16, 16), "float32")
             ) -> R.Tensor((2, 16), "float32"):
        with R.dataflow():
            a = R.nn.relu(R.matmul(x, w))
            b = R.nn.relu(R.matmul(a, w))
            c = R.add(R.matmul(b, w), a)
            R.output(c)
        return c


def test_without_kernels_keeps_the_vm_work():
    """Every kernel call becomes testing.nop (the count is the kernels'), the builtins stay,
    and the module still builds and runs."""
    lowered = vm_overhead.lowered_module(Chain, "llvm", False)
    calls = vm_overhead.calls_by_callee(lowered)
    assert calls["TVM kernel"] == 3
    nop, replaced = vm_overhead.without_kernels(lowered)
    assert replaced == 3
    after = vm_overhead.calls_by_callee(nop)
    assert "TVM kernel" not in after and after[vm_overhead.NOP] == 3
    assert {k: v for k, v in after.items() if k != vm_overhead.NOP} == \
        {k: v for k, v in calls.items() if k != "TVM kernel"}
    vm = relax.VirtualMachine(vm_overhead.build_lowered(nop), tvm.cpu())
    args = [tvm.runtime.tensor(np.ones(s, "float32")) for s in ((2, 16), (16, 16))]
    assert vm_overhead.cpu_per_run(lambda: vm["main"](*args), rounds=2, number=3) > 0


def test_cached_build_makes_fewer_calls():
    """With the passes, the allocation builtins of main are replaced by one cached call and
    tuple items, and the kills of cached views are gone."""
    if not cached_alloc.available():
        pytest.skip("the loaded native library predates tvm_ollie.vm.cached_alloc")
    off = vm_overhead.calls_by_callee(vm_overhead.lowered_module(Chain, "llvm", False))
    on = vm_overhead.calls_by_callee(vm_overhead.lowered_module(Chain, "llvm", True))
    assert on["relax.call_builtin_with_ctx"] == 1 and on["tuple_getitem"] == 2
    assert on.get("relax.vm.alloc_tensor", 0) == off["relax.vm.alloc_tensor"] - 2
    assert on.get("relax.vm.kill_object", 0) < off["relax.vm.kill_object"]
