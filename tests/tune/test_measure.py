"""time_main: local timing statistics."""

import pytest
import tvm
from tvm import relax

from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.tune.measure import random_args, time_main


def _module():
    return single_function_module([tensor_var("x", (64, 64)), tensor_var("y", (64, 64))],
                                  lambda bb, x, y: relax.op.add(x, y))


def test_min_and_median_statistics_and_bad_stat_raises():
    mod = _module()
    ex = tvm.compile(mod, target="llvm")
    args = random_args(mod["main"])
    fastest = time_main(ex, args, number=1, repeat=9, stat="min")
    median = time_main(ex, args, number=1, repeat=9)
    assert 0 < fastest < 1 and 0 < median < 1
    with pytest.raises(ValueError, match="stat"):
        time_main(ex, args, stat="mean")
