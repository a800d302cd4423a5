"""Float weight packs and thread counts (weight_pack.h, docs/threads.md, "Packs and thread
counts"): a pack records the OpenMP count it was made under, and a call at another count runs at
the pack's count instead of reordering the pack on every call; inside a stall window it stays on
the calling thread, and its pack is re-laid once into the one-thread primitive's format and kept
(weight_pack::RelaidPacks) while the pack is unchanged. Outputs are bit for bit those of the
unpacked call on blocked formats at the count the call ran at (the plain-format primitive, which
fmt=auto picks for these unpacked weights, rounds differently in the last bits)."""

import numpy as np
import pytest
import tvm_ffi

from native_util import call_direct, require_native, two_threads_stall_on
from tvm_ollie import native


@pytest.fixture(autouse=True)
def _native():
    require_native()
    if not native.provides(native.STALL_STATS):
        pytest.skip("the loaded native library has no stall fallback (built before it)")
    with two_threads_stall_on():
        yield


def _t(a):
    return tvm_ffi.from_dlpack(np.ascontiguousarray(a))


def _header_threads(packed: np.ndarray) -> int:
    return int(packed[:16].view(np.uint64)[5])


def _cache_stats() -> dict:
    return {k: int(v) for k, v in (kv.split("=") for kv in
                                   tvm_ffi.get_global_func(native.CACHE_STATS)().split(";"))}


def _pack_reorders() -> int:
    return _cache_stats()["pack_reorders"]


def _conv_case():
    """A ResNet-18 quick block's 3x3 convolution (64 channels on 4x4): on AVX2, oneDNN's
    one-thread primitive wants Acdb24a weights, the two-thread one Acdb16a."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 64, 4, 4)).astype("float32")
    w = rng.standard_normal((64, 64, 3, 3)).astype("float32")
    attrs = "pad=1,1,1,1;act=relu"
    size = tvm_ffi.get_global_func("tvm_ollie.cpu.conv2d_packed_size")(attrs, [1, 64, 4, 4],
                                                                        [64, 64, 3, 3])
    packed = call_direct("tvm_ollie.cpu.conv2d_pack_weight", attrs, [x, w], (size,))
    return x, w, attrs, packed


def _conv(attrs, x, w, packed=None):
    if packed is None:  # the packed call's primitive (blocked formats), weights reordered per call
        return call_direct(native.CONV2D, attrs + ";fmt=blocked", [x, w], (1, 64, 4, 4))
    return call_direct(native.CONV2D, attrs + ";wpacked=1;kernel=3,3", [x, packed], (1, 64, 4, 4))


def _matmul_case():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((64, 96)).astype("float32")
    b = rng.standard_normal((96, 80)).astype("float32")
    out = np.zeros((64, 80), "float32")
    size = int(tvm_ffi.get_global_func(native.MATMUL_PACKED_SIZE)("lib=onednn", _t(a), _t(b),
                                                                   _t(out)))
    packed = np.zeros(size, "float32")
    tvm_ffi.get_global_func(native.MATMUL_PACK_WEIGHT)("lib=onednn", _t(a), _t(b), _t(out),
                                                       _t(packed))
    return a, b, packed


def _matmul(a, b, packed=None):
    if packed is None:
        return call_direct(native.MATMUL, "lib=onednn", [a, b], (64, 80))
    return call_direct(native.MATMUL, "lib=onednn;wpacked=1", [a, packed], (64, 80))


def test_packs_record_their_thread_count():
    _, _, _, conv_packed = _conv_case()
    _, _, mm_packed = _matmul_case()
    assert _header_threads(conv_packed) == _header_threads(mm_packed) == 2


def test_packs_skip_the_stall_window():
    """A pack made while a stall window holds calls serial is made for the threshold's count
    (two here): the window passes, the pack stays; and its size query agrees with it."""
    native.hold_serial(10_000_000)  # 10 s
    _, _, _, conv_packed = _conv_case()
    _, _, mm_packed = _matmul_case()
    assert _header_threads(conv_packed) == _header_threads(mm_packed) == 2


def test_a_call_at_another_count_runs_at_its_packs_count():
    """After set_num_threads(1), a two-thread pack is read as it is: no reorder per call, the
    two-thread plain call's output bit for bit, the library's count kept."""
    x, w, attrs, conv_packed = _conv_case()
    a, b, mm_packed = _matmul_case()
    conv_plain, mm_plain = _conv(attrs, x, w), _matmul(a, b)  # at the packs' count, two
    native.set_num_threads(1)
    before = _pack_reorders()
    for _ in range(3):
        assert np.array_equal(_conv(attrs, x, w, conv_packed), conv_plain)
        assert np.array_equal(_matmul(a, b, mm_packed), mm_plain)
    assert _pack_reorders() == before
    assert native.get_num_threads() == 1


def test_a_call_in_a_stall_window_stays_serial():
    """Inside a stall window a two-thread pack is reordered for the one-thread primitive where
    the formats differ (the call stays off the stalled worker): still the plain output."""
    x, w, attrs, conv_packed = _conv_case()
    a, b, mm_packed = _matmul_case()
    native.hold_serial(10_000_000)
    conv_plain, mm_plain = _conv(attrs, x, w), _matmul(a, b)  # serial too
    serial_before = native.stall_stats()["serial_calls"]
    assert np.array_equal(_conv(attrs, x, w, conv_packed), conv_plain)
    assert np.array_equal(_matmul(a, b, mm_packed), mm_plain)
    assert native.stall_stats()["serial_calls"] >= serial_before + 2


def test_a_pack_is_relaid_once_in_a_stall_window():
    """Inside a stall window a two-thread conv or matmul pack whose format the one-thread
    primitive does not read is re-laid once and kept: no call reorders it again (on AVX2 the
    conv's formats differ: at most one re-laid copy, none where a copy of these very weights is
    kept already or the formats agree), every output is the serial unpacked call's; a pack
    rewritten in place with other weights is re-laid again (its sampled floats changed), so the
    kept copy never serves stale weights (the outputs would differ on AVX2)."""
    x, w, attrs, conv_packed = _conv_case()
    native.hold_serial(10_000_000)
    plain = _conv(attrs, x, w)  # serial, blocked formats
    before = _cache_stats()
    for _ in range(3):
        assert np.array_equal(_conv(attrs, x, w, conv_packed), plain)
    after = _cache_stats()
    assert after["pack_reorders"] - before["pack_reorders"] in (0, 1)
    w2 = np.random.default_rng(7).standard_normal(w.shape).astype("float32")
    tvm_ffi.get_global_func("tvm_ollie.cpu.conv2d_pack_weight")(attrs, _t(x), _t(w2),
                                                                 tvm_ffi.from_dlpack(conv_packed))
    assert np.array_equal(_conv(attrs, x, w2, conv_packed), _conv(attrs, x, w2))
    assert _cache_stats()["pack_reorders"] - after["pack_reorders"] in (0, 1)
    a, b, mm_packed = _matmul_case()
    mm_plain = _matmul(a, b)
    before = _cache_stats()
    for _ in range(3):
        assert np.array_equal(_matmul(a, b, mm_packed), mm_plain)
    assert _cache_stats()["pack_reorders"] - before["pack_reorders"] in (0, 1)
