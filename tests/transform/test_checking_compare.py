"""The checker's float comparison a chunk at a time (:func:`tvm_ollie.transform.checking.
_max_error`): the same error and scale as comparing whole float64 copies, wherever in the
result the largest difference or a NaN lies."""

import numpy as np
import pytest

from tvm_ollie.transform import checking


def _whole(ref, got):
    r, g = ref.astype(np.float64), got.astype(np.float64)
    return float(np.max(np.abs(g - r))), float(np.max(np.abs(r)))


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_chunks_give_the_whole_comparison(monkeypatch, chunk, dtype):
    monkeypatch.setattr(checking, "COMPARE_CHUNK", chunk)
    rng = np.random.default_rng(0)
    ref = (rng.standard_normal((3, 5, 11)) * 100).astype(dtype)
    got = ref.copy()
    got.reshape(-1)[-1] += 3  # the largest difference in the last chunk
    assert checking._max_error(ref, got) == _whole(ref, got)


def test_a_nan_in_any_chunk_fails_the_check(monkeypatch):
    monkeypatch.setattr(checking, "COMPARE_CHUNK", 4)
    ref = np.ones(10, dtype="float32")
    got = ref.copy()
    got[5] = np.nan
    err, _ = checking._max_error(ref, got)
    assert np.isnan(err)
    ok, why = checking._compare(ref, got, 1e-4)
    assert not ok and "numerics differ" in why


def test_within_and_beyond_the_tolerance_and_empty_results(monkeypatch):
    monkeypatch.setattr(checking, "COMPARE_CHUNK", 3)
    ref = np.linspace(-2, 2, 17, dtype="float32")
    log = []
    assert checking._compare(ref, ref + np.float32(1e-5), 1e-4, log) == (True, "")
    assert log[0]["scale"] == 2.0
    assert not checking._compare(ref, ref + np.float32(1e-3), 1e-4)[0]
    assert checking._max_error(np.zeros(0, "float32"), np.zeros(0, "float32")) == (0.0, 0.0)
    assert checking._compare(ref, ref[:-1], 1e-4)[0] is False
