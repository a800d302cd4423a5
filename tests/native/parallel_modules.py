"""TVMScript modules shared by the tests of TVM's parallel loops on the native library's
OpenMP pool (``test_parallel_runtime.py``, ``test_stall_fallback.py``)."""

import tvm
from tvm.script import relax as R
from tvm.script import tirx as T

#: Rows of :class:`Scaled` (its one parallel loop's extent).
N = 64


# fmt: off
@tvm.script.ir_module
class Scaled:
    @T.prim_func
    def scale_add(a: T.Buffer((N, 33), "float32"), b: T.Buffer((N, 33), "float32"),
                  c: T.Buffer((N, 33), "float32")):
        for i in T.parallel(N):
            for j in range(33):
                c[i, j] = a[i, j] * T.float32(2) + b[i, j]

    @R.function
    def main(x: R.Tensor((N, 33), "float32"), y: R.Tensor((N, 33), "float32")):
        cls = Scaled
        with R.dataflow():
            z = R.call_tir(cls.scale_add, (x, y), R.Tensor((N, 33), "float32"))
            R.output(z)
        return z
# fmt: on
