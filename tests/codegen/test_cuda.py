"""CUDA compile-only path: dlight-scheduled kernels, CUDA source and PTX, without a GPU."""

from __future__ import annotations

import re
import shutil

import pytest
from hypothesis import HealthCheck, given, settings

from tvm_ollie.codegen import build_cuda, compile_ptx, lower
from tvm_ollie.ir.nodes import IterVar, Scope, Tensor, Var

from strategies import scopes  # tests/ir, put on sys.path by tests/conftest.py


def _conv() -> Scope:
    n, f, h, w, c, r, s = map(Var, "nfhwcrs")
    A = Tensor("A", (1, 4, 8, 8), pad=[0, 0, 1, 1])
    K = Tensor("K", (8, 4, 3, 3))
    return Scope(
        [IterVar(n, 0, 1), IterVar(f, 0, 8), IterVar(h, 0, 8), IterVar(w, 0, 8)],
        [IterVar(c, 0, 4), IterVar(r, 0, 3), IterVar(s, 0, 3)],
        A[n, c, h + r - 1, w + s - 1] * K[f, c, r, s],
    )


def _matmul() -> Scope:
    i, j, k = Var("i"), Var("j"), Var("k")
    A, B = Tensor("A", (64, 32)), Tensor("B", (32, 48))
    return Scope([IterVar(i, 0, 64), IterVar(j, 0, 48)], [IterVar(k, 0, 32)], A[i, k] * B[k, j])


def _two_stage() -> Scope:
    t, c, h, r = map(Var, "tchr")
    X, K = Tensor("X", (8, 4)), Tensor("K", (3,))
    inner = Scope([IterVar(t, 1, 8)], [IterVar(c, 0, 4)], X[t, c], pad=[1])
    return Scope([IterVar(h, 0, 7)], [IterVar(r, 0, 3)], inner[h + r] * K[r], reducer="max")


def _kernels(source: str) -> list:
    return re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source)


@pytest.mark.parametrize("make", [_conv, _matmul, _two_stage], ids=["conv", "matmul", "two_stage"])
def test_cuda_source_without_gpu(make):
    expr = make()
    executable, source = build_cuda(expr, arch="sm_90")
    assert "__global__" in source
    assert _kernels(source), source[-2000:]
    assert "threadIdx" in source  # dlight bound the loops to threads
    assert executable.mod is not None


def test_cuda_from_named_primfunc():
    _, source = build_cuda(lower(_matmul(), name="my_mm"))
    assert any(name.startswith("my_mm") for name in _kernels(source))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_ptx_from_nvcc():
    _, source = build_cuda(_conv())
    ptx = compile_ptx(source, arch="sm_90")
    text = ptx.decode(errors="replace")
    assert ".target sm_90" in text and ".entry" in text


def test_row_max_falls_back_to_a_schedule_that_compiles():
    i, k = Var("i"), Var("k")
    A = Tensor("A", (16, 64))
    row_max = Scope([IterVar(i, 0, 16)], [IterVar(k, 0, 64)], A[i, k], reducer="max")
    _, source = build_cuda(row_max)
    assert "-CUDART_INF_F" in source  # the exact identity of max survived


def test_unschedulable_input_is_a_typed_error():
    with pytest.raises(TypeError):
        build_cuda(Tensor("A", (4,)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=scopes(max_extent=4, pad_values=(0.0, 1.5)))
def test_random_scopes_build_for_cuda(expr):
    _, source = build_cuda(expr)
    assert _kernels(source)
