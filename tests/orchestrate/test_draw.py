"""The kernel layout and picture of an orchestration (orchestrate.draw)."""

import pytest
from tvm import relax

from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.orchestrate.draw import draw_kernels, kernel_layout
from tvm_ollie.orchestrate.fission import fission


def _attention():
    def body(bb, x, wq):
        q = bb.emit(relax.op.matmul(x, wq))
        s = bb.emit(relax.op.matmul(q, relax.op.permute_dims(q, [1, 0])))
        sm = bb.emit(relax.op.nn.softmax(s))
        return relax.op.add(relax.op.matmul(sm, q), x)

    return single_function_module([tensor_var("x", (8, 16)), tensor_var("wq", (16, 16))], body)


def test_layout_covers_every_primitive_with_its_kernel():
    lay = kernel_layout(_attention(), "llvm", fission=lambda m: fission(m)[0])
    n = len(lay.names)
    assert n == len(lay.kinds) == len(lay.positions) == len(lay.kernel) > 5  # softmax split
    assert all(0 <= k < len(lay.kernel_sizes) for k in lay.kernel)
    assert sum(lay.kernel_sizes) == n
    assert len(lay.kernel_sizes) < n  # something was fused
    for a, b in lay.edges:  # producers are drawn left of their consumers
        assert lay.positions[a][0] < lay.positions[b][0]
    assert len(set(lay.positions)) == n


def test_draw_kernels_gives_one_hull_per_fused_kernel():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    lay = kernel_layout(_attention(), "llvm", fission=lambda m: fission(m)[0])
    ax = draw_kernels(lay)
    assert len(ax.patches) == sum(1 for s in lay.kernel_sizes if s > 1)
    assert "kernels" in ax.get_title()
