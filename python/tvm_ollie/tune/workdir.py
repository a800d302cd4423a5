"""Keeping a tuning work dir usable: repair of cut-short files, atomic writes and a lock.

A work dir holds MetaSchedule's JSON database (``database_workload.json``: one workload per
line; ``database_tuning_record.json``: one ``[workload_line, record]`` per line) and the pass's
measurement cache (``ollie_measurements.json``, one JSON object). A crash, a Ctrl-C or a full
disk can leave any of them cut short, and MetaSchedule then refuses to open the database.

* :func:`repair_database` keeps what is valid: the workloads up to the first broken line (so
  the line numbers the records refer to stay the same) and every record that parses and refers
  to a kept workload. The original file is kept aside as ``NAME.corrupt-<timestamp>`` and one
  warning says so; what was dropped is tuned again.
* :func:`open_database` repairs, then opens the database; if MetaSchedule still rejects it, both
  files are moved aside and the database starts empty.
* :func:`repair_measurements` moves an unreadable measurement cache aside.
* :func:`work_dir_lock` is an exclusive ``fcntl.flock`` on ``.ollie.lock`` in the work dir, so
  that processes sharing a work dir tune and write one at a time; it is re-entrant within a
  process.
* :func:`atomic_write_bytes` writes through a temporary file and ``os.replace``;
  :class:`JsonRecords` keeps one JSON object in a work dir's file that way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import sys
import tempfile
import threading
import time
from typing import Dict, Iterator, List, Optional

from ..compat import meta_schedule

__all__ = ["WORKLOAD_FILE", "RECORD_FILE", "MEASURE_FILE", "LOCK_FILE", "atomic_write_bytes",
           "quarantine", "repair_database", "repair_measurements", "open_database",
           "prepare_work_dir", "work_dir_lock", "lock_is_held", "JsonRecords"]

LOG = logging.getLogger("tvm_ollie.tune")

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
MEASURE_FILE = "ollie_measurements.json"
LOCK_FILE = ".ollie.lock"


def _warn(message: str) -> None:
    """One warning line on stderr (through logging, so that library users can silence it)."""
    LOG.warning("tvm-ollie: warning: %s", message)


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never a part."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def quarantine(path: str) -> str:
    """Move ``path`` aside as ``path.corrupt-<timestamp>``; returns the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = f"{path}.corrupt-{stamp}"
    count = 1
    while os.path.exists(target):
        count += 1
        target = f"{path}.corrupt-{stamp}-{count}"
    os.replace(path, target)
    return target


def _split_lines(data: bytes) -> List[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _parse_line(line: bytes):
    """The JSON value of one line, or None if it is not valid JSON text."""
    try:
        return json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def _valid_workload(value) -> bool:
    # MetaSchedule writes ["<structural hash>", "<base64 module>"].
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _valid_record(value, n_workloads: int) -> bool:
    # MetaSchedule writes [workload_line, [trace, run_secs, target, args_info]].
    return (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int)
            and not isinstance(value[0], bool) and 0 <= value[0] < n_workloads
            and isinstance(value[1], list))  # fmt: skip


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as file:
            return file.read()
    except FileNotFoundError:
        return None


def repair_database(work_dir: str) -> List[str]:
    """Drop the broken lines of the JSON database in ``work_dir``; returns the warnings given.

    Workloads are kept up to the first line that does not parse (records refer to workloads by
    line number, so nothing after a broken line can be trusted); records are kept when they
    parse and refer to a kept workload. Each changed file is rewritten atomically, with the
    original kept as ``NAME.corrupt-<timestamp>``.
    """
    wl_path = os.path.join(work_dir, WORKLOAD_FILE)
    rec_path = os.path.join(work_dir, RECORD_FILE)
    wl_data, rec_data = _read(wl_path), _read(rec_path)
    if wl_data is None and rec_data is None:
        return []
    kept_wl: List[bytes] = []
    wl_lines = _split_lines(wl_data or b"")
    for line in wl_lines:
        if not _valid_workload(_parse_line(line)):
            break
        kept_wl.append(line)
    wl_ok = len(kept_wl) == len(wl_lines) and (not wl_data or wl_data.endswith(b"\n"))
    rec_lines = _split_lines(rec_data or b"")
    kept_rec = [line for line in rec_lines if _valid_record(_parse_line(line), len(kept_wl))]
    rec_ok = len(kept_rec) == len(rec_lines) and (not rec_data or rec_data.endswith(b"\n"))
    kept_text, saved = [], []
    for path, ok, kept, total, what in (
        (wl_path, wl_ok, kept_wl, wl_lines, "workloads"),
        (rec_path, rec_ok, kept_rec, rec_lines, "tuning records"),
    ):
        if ok or not os.path.exists(path):
            continue
        saved.append(os.path.basename(quarantine(path)))
        atomic_write_bytes(path, b"".join(line + b"\n" for line in kept))
        kept_text.append(f"{len(kept)} of {len(total)} {what}")
    if not saved:
        return []
    note = (f"the tuning database in {work_dir} was cut short or corrupt: kept "
            f"{' and '.join(kept_text)} (originals saved as {', '.join(saved)}); what is "
            "missing is tuned again")  # fmt: skip
    _warn(note)
    return [note]


def open_database(work_dir: str):
    """MetaSchedule's JSON database of ``work_dir``, repaired first (see :func:`repair_database`).

    If MetaSchedule still cannot load it, both files are moved aside and an empty database is
    started (with a warning).
    """
    work_dir = os.path.abspath(work_dir)
    with work_dir_lock(work_dir):  # already held (re-entrant) when called within a build
        repair_database(work_dir)
        return _load_or_start_empty(work_dir)


def _load_or_start_empty(work_dir: str):
    database = meta_schedule().database.JSONDatabase
    try:
        return database(work_dir=work_dir)
    except Exception as err:  # pylint: disable=broad-except
        saved = []
        for name in (WORKLOAD_FILE, RECORD_FILE):
            path = os.path.join(work_dir, name)
            if os.path.exists(path):
                saved.append(os.path.basename(quarantine(path)))
        reason = " ".join(str(err).split())[:160]
        _warn(f"the tuning database in {work_dir} cannot be loaded ({type(err).__name__}: "
              f"{reason}); moved aside as {', '.join(saved) or 'nothing'}, starting an empty "
              "one")  # fmt: skip
        return database(work_dir=work_dir)


def repair_measurements(work_dir: str) -> List[str]:
    """Move an unreadable measurement cache of ``work_dir`` aside; returns the warnings given."""
    path = os.path.join(work_dir, MEASURE_FILE)
    data = _read(path)
    if data is None:
        return []
    try:
        value = json.loads(data.decode("utf-8"))
        ok = isinstance(value, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    except (UnicodeDecodeError, ValueError):
        ok = False
    if ok:
        return []
    saved = quarantine(path)
    note = (f"{path} was cut short or corrupt (moved aside as {os.path.basename(saved)}); its "
            "measurements are taken again")  # fmt: skip
    _warn(note)
    return [note]


#: (path, size, modification time) of the unreadable record files already warned about
_UNREADABLE: set = set()


def _warn_unreadable(path: str, err: Exception) -> None:
    """One warning per unreadable version of a record file (several readers open it in one
    build)."""
    try:
        st = os.stat(path)
        version = (path, st.st_size, st.st_mtime_ns)
    except OSError:
        version = (path, None, None)
    if version not in _UNREADABLE:
        _UNREADABLE.add(version)
        LOG.warning("ollie: ignoring the unreadable %s (%s: %s); it is written again",
                    path, type(err).__name__, str(err)[:120])


class JsonRecords:
    """One JSON object kept in a work dir's file ``FILE``, read once and saved whole after
    every change (atomically: other processes sharing the work dir may read it). Without a work
    dir the records live in memory only; an unreadable file (cut short, not JSON, not an
    object) reads as empty with one warning, and is replaced by the next save."""

    FILE = ""

    def __init__(self, work_dir: Optional[str]):
        self.path = os.path.join(work_dir, self.FILE) if work_dir else None
        self.data: dict = {}
        if self.path and os.path.exists(self.path):
            try:
                with open(self.path, encoding="utf-8") as f:
                    self.data = json.load(f)
                if not isinstance(self.data, dict):
                    raise ValueError(f"a JSON {type(self.data).__name__}, not an object")
            except (OSError, ValueError) as err:
                _warn_unreadable(self.path, err)
                self.data = {}

    def save(self) -> None:
        """Write :attr:`data` to the file (nothing without a work dir)."""
        if self.path:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            atomic_write_bytes(self.path, json.dumps(self.data, indent=1,
                                                     sort_keys=True).encode("utf-8"))


def prepare_work_dir(work_dir: Optional[str]) -> List[str]:
    """Repair the database and the measurement cache of ``work_dir`` (if it exists)."""
    if not work_dir or not os.path.isdir(work_dir):
        return []
    return repair_database(work_dir) + repair_measurements(work_dir)


class _Held:
    """A lock file held by this process: its descriptor and how many holders nest on it."""

    def __init__(self, fd: int):
        self.fd = fd
        self.depth = 1


_HELD: Dict[str, _Held] = {}
_GUARD = threading.RLock()


@contextlib.contextmanager
def work_dir_lock(work_dir: Optional[str]) -> Iterator[None]:
    """Hold the exclusive lock of ``work_dir`` (nothing to lock when it is None).

    Another process holding it is waited for (with a note on stderr). Nested uses in one
    process share the lock; threads of one process are serialized by a process-wide lock.
    """
    if not work_dir:
        yield
        return
    os.makedirs(work_dir, exist_ok=True)
    key = os.path.realpath(work_dir)
    with _GUARD:
        held = _HELD.get(key)
        if held is not None:
            held.depth += 1
        else:
            _HELD[key] = _Held(_acquire(key))
        try:
            yield
        finally:
            held = _HELD[key]
            held.depth -= 1
            if held.depth == 0:
                del _HELD[key]
                os.close(held.fd)  # closing the descriptor releases the flock


def _acquire(key: str) -> int:
    fd = os.open(os.path.join(key, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"tvm-ollie: waiting for another process using the work dir {key}",
                  file=sys.stderr, flush=True)  # fmt: skip
            fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def lock_is_held(work_dir: str) -> bool:
    """Whether this process holds the lock of ``work_dir`` (for checks and tests)."""
    return os.path.realpath(work_dir) in _HELD
