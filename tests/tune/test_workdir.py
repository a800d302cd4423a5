"""A work dir cut short by a crash still opens: repair of the JSON database and the measurement
cache, atomic writes, and the work-dir lock. No tuning: the records are committed directly."""

import json
import logging
import os
import subprocess
import sys

import pytest
import tvm
import tvm_ffi
from tvm import te

from tvm_ollie.compat import meta_schedule
from tvm_ollie.tune import workdir
from tvm_ollie.tune.metaschedule import Tuner, optional_database
from tvm_ollie.target import normalize_target


def _matmul(n: int) -> tvm.IRModule:
    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


SIZES = (4, 8, 16)


def make_database(work_dir: str) -> list:
    """A JSON database with one workload and one (empty-trace) record per size; returns the
    workload modules in line order."""
    ms = meta_schedule()
    db = ms.database.JSONDatabase(work_dir=work_dir)
    target = normalize_target("llvm")
    mods = []
    for n in SIZES:
        mod = _matmul(n)
        workload = db.commit_workload(mod)
        db.commit_tuning_record(ms.database.TuningRecord(
            tvm.s_tir.Schedule(mod).trace, workload, run_secs=[1e-4 * n], target=target,
            args_info=ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
        mods.append(mod)
    return mods


def _path(work_dir, name):
    return os.path.join(str(work_dir), name)


def _cut(path: str, keep: int) -> None:
    with open(path, "rb") as file:
        data = file.read()
    with open(path, "wb") as file:
        file.write(data[: len(data) - keep] if keep > 0 else data[:-keep])


def _corrupt_files(work_dir) -> list:
    return sorted(f for f in os.listdir(work_dir) if ".corrupt-" in f)


def _has_record(db, mod) -> bool:
    return any(tvm_ffi.structural_equal(r.workload.mod, mod) for r in db.get_all_tuning_records())


def test_intact_database_is_left_alone(tmp_path, caplog):
    make_database(str(tmp_path))
    before = {f: os.path.getmtime(_path(tmp_path, f)) for f in os.listdir(tmp_path)}
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        assert workdir.repair_database(str(tmp_path)) == []
    assert not caplog.records and not _corrupt_files(tmp_path)
    assert {f: os.path.getmtime(_path(tmp_path, f)) for f in before} == before


def test_truncated_workload_file_keeps_the_valid_prefix(tmp_path, caplog):
    mods = make_database(str(tmp_path))
    wl = _path(tmp_path, workdir.WORKLOAD_FILE)
    _cut(wl, 40)
    with pytest.raises(Exception):  # what MetaSchedule alone does with it
        meta_schedule().database.JSONDatabase(work_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        db = Tuner("llvm", str(tmp_path)).database
    (message,) = [r.getMessage() for r in caplog.records]
    assert "kept 2 of 3 workloads and 2 of 3 tuning records" in message
    assert len(_corrupt_files(tmp_path)) == 2
    assert _has_record(db, mods[0]) and _has_record(db, mods[1])
    assert len(db) == 2  # the record of the cut workload is gone (tuned again later)


def test_truncated_record_file(tmp_path, caplog):
    mods = make_database(str(tmp_path))
    _cut(_path(tmp_path, workdir.RECORD_FILE), 25)
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        db = optional_database(str(tmp_path))
    assert "kept 2 of 3 tuning records" in caplog.records[0].getMessage()
    assert [_has_record(db, m) for m in mods] == [True, True, False]
    # the next commit starts on a line of its own, so the file stays loadable
    ms = meta_schedule()
    workload = db.commit_workload(mods[2])
    db.commit_tuning_record(ms.database.TuningRecord(
        tvm.s_tir.Schedule(mods[2]).trace, workload, run_secs=[1e-3],
        target=normalize_target("llvm"),
        args_info=ms.arg_info.ArgInfo.from_prim_func(mods[2]["main"])))
    again = ms.database.JSONDatabase(work_dir=str(tmp_path))
    assert len(again) == 3


def test_garbage_bytes_in_the_record_file(tmp_path, caplog):
    mods = make_database(str(tmp_path))
    rec = _path(tmp_path, workdir.RECORD_FILE)
    with open(rec, "rb") as file:
        first = file.read().split(b"\n")[0]
    with open(rec, "wb") as file:
        file.write(first + b"\n" + bytes(range(11, 256)) * 3 + b"\n{\"not\": \"a record\"}\n")
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        db = workdir.open_database(str(tmp_path))
    assert "kept 1 of 3 tuning records" in caplog.records[0].getMessage()
    assert [_has_record(db, m) for m in mods] == [True, False, False]


def test_garbage_bytes_in_the_workload_file(tmp_path, caplog):
    make_database(str(tmp_path))
    with open(_path(tmp_path, workdir.WORKLOAD_FILE), "wb") as file:
        file.write(b"\x00\xff garbage \x80" * 50)
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        db = workdir.open_database(str(tmp_path))
    assert len(db) == 0 and len(db.get_all_tuning_records()) == 0
    assert "kept 0 of 1 workloads and 0 of 3 tuning records" in caplog.records[0].getMessage()


def test_empty_workload_file(tmp_path, caplog):
    make_database(str(tmp_path))
    open(_path(tmp_path, workdir.WORKLOAD_FILE), "wb").close()
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        db = workdir.open_database(str(tmp_path))
    assert len(db) == 0
    assert "kept 0 of 3 tuning records" in caplog.records[0].getMessage()
    (saved,) = _corrupt_files(tmp_path)
    assert saved.startswith(workdir.RECORD_FILE + ".corrupt-")


def test_empty_database_files_are_valid(tmp_path, caplog):
    for name in (workdir.WORKLOAD_FILE, workdir.RECORD_FILE):
        open(_path(tmp_path, name), "wb").close()
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        assert len(workdir.open_database(str(tmp_path))) == 0
    assert not caplog.records


@pytest.mark.parametrize("content", [b'{"abc": 0.5, "de', b"", b"\xff\xfe\x00", b"[1, 2]"])
def test_measurement_cache_cut_short(tmp_path, caplog, content):
    path = _path(tmp_path, workdir.MEASURE_FILE)
    with open(path, "wb") as file:
        file.write(content)
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        notes = workdir.prepare_work_dir(str(tmp_path))
    assert len(notes) == 1 and "measurements are taken again" in notes[0]
    assert not os.path.exists(path) and len(_corrupt_files(tmp_path)) == 1


def test_valid_measurement_cache_is_kept(tmp_path):
    path = _path(tmp_path, workdir.MEASURE_FILE)
    workdir.atomic_write_bytes(path, json.dumps({"k": 1e-3}).encode())
    assert workdir.prepare_work_dir(str(tmp_path)) == []
    with open(path, encoding="utf-8") as file:
        assert json.load(file) == {"k": 1e-3}
    assert os.listdir(tmp_path) == [workdir.MEASURE_FILE]  # no temporary file left


_TRY_LOCK = """
import fcntl, os, sys
fd = os.open(os.path.join(sys.argv[1], ".ollie.lock"), os.O_RDWR | os.O_CREAT)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(3)
"""


def test_work_dir_lock_is_exclusive_and_reentrant(tmp_path):
    def other_process_gets_it() -> bool:
        proc = subprocess.run([sys.executable, "-c", _TRY_LOCK, str(tmp_path)], check=False)
        assert proc.returncode in (0, 3)
        return proc.returncode == 0

    with workdir.work_dir_lock(str(tmp_path)):
        with workdir.work_dir_lock(str(tmp_path)):
            assert workdir.lock_is_held(str(tmp_path))
        assert workdir.lock_is_held(str(tmp_path)) and not other_process_gets_it()
    assert not workdir.lock_is_held(str(tmp_path)) and other_process_gets_it()


def test_database_that_parses_but_does_not_load_starts_empty(tmp_path, caplog):
    """A workload line that is valid JSON but holds no module: MetaSchedule rejects the file, so
    both files are moved aside and an empty database is started."""
    make_database(str(tmp_path))
    with open(_path(tmp_path, workdir.WORKLOAD_FILE), "w", encoding="utf-8") as file:
        for _ in SIZES:
            file.write('["123", "bm90IGEgbW9kdWxl"]\n')  # base64 of "not a module"
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        db = workdir.open_database(str(tmp_path))
    assert len(db) == 0
    (message,) = [r.getMessage() for r in caplog.records]
    assert "cannot be loaded" in message and "starting an empty one" in message
    assert len(_corrupt_files(tmp_path)) == 2
    assert not workdir.lock_is_held(str(tmp_path))


class _Notes(workdir.JsonRecords):
    FILE = "notes.json"


def test_json_records_round_trip_and_corruption(tmp_path):
    notes = _Notes(str(tmp_path))
    notes.data["a"] = 1.5
    notes.save()
    assert _Notes(str(tmp_path)).data == {"a": 1.5}
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # written atomically
    (tmp_path / "notes.json").write_text('{"a": 1.')  # cut short
    assert _Notes(str(tmp_path)).data == {}
    memory = _Notes(None)
    memory.data["b"] = 2
    memory.save()  # without a work dir: nothing written, nothing raised
    assert memory.path is None
