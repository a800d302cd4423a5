"""The loader shared by the CPU and CUDA kernel libraries: once, thread-safe, never raising."""

import pytest

from tvm_ollie.library_loader import LibraryLoader, candidate_paths, disabled, find_dist_file


def test_loads_once_and_reports_the_path():
    calls = []

    def _open(state):
        calls.append(1)
        state.path = "/x/lib.so"
        return True

    loader = LibraryLoader("test library", _open)
    assert loader.load() and loader.load()
    assert calls == [1]
    assert loader.path() == "/x/lib.so" and loader.reason() == ""


def test_an_exception_becomes_the_reason_and_one_warning(stand_in_log):
    def _open(state):
        raise OSError("libfoo.so: cannot open")

    log = stand_in_log
    loader = LibraryLoader("test library", _open, logger=log)
    assert not loader.load() and not loader.load()
    assert loader.reason() == "OSError: libfoo.so: cannot open"
    assert log.lines == ["test library unavailable: OSError: libfoo.so: cannot open"]
    assert not loader.provides("anything")
    with pytest.raises(RuntimeError, match="test library unavailable: OSError"):
        loader.func("anything")


def test_disabled_by_the_environment_without_a_warning(monkeypatch, stand_in_log):
    monkeypatch.setenv("TVM_OLLIE_DISABLE_NATIVE", "1")
    log = stand_in_log
    loader = LibraryLoader("test library", lambda state: not disabled(state), logger=log)
    assert not loader.load()
    assert loader.reason() == "disabled by TVM_OLLIE_DISABLE_NATIVE"
    assert not log.lines


def test_candidate_paths_put_the_environment_first(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_OLLIE_TEST_LIB", str(tmp_path / "x.so"))
    paths = candidate_paths("libx.so", "TVM_OLLIE_TEST_LIB")
    assert paths[0] == tmp_path / "x.so"
    assert all(p.name == "libx.so" for p in paths[1:]) and len(paths) >= 2


def test_find_dist_file():
    assert find_dist_file("no-such-distribution-here", "x.so") is None
    path = find_dist_file("scipy", "__init__.py")
    assert path is None or path.endswith("__init__.py")
