"""Test-suite set-up: make the shared hypothesis strategies importable from every test folder,
a stand-in logger for tests that read a module's warnings, MetaSchedule's worker pools kept
for the whole run (:mod:`kept_pools`) and the one new process with another string-hash seed
that the cross-process determinism tests share."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "ir"))

# The native library's stall fallback (docs/threads.md, "Stalled workers") reacts to the load
# of the machine: on a shared CI machine it would run some parallel calls on one thread, and
# tests that count parallel loops or the primitives prepared per thread count would depend on
# the load. Off for the suite (subprocesses inherit it); tests/native/test_stall_fallback.py
# turns it on where it tests it.
os.environ.setdefault("TVM_OLLIE_STALL_FALLBACK", "0")

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from kept_pools import keep_pools  # noqa: E402

# Deterministic examples and no per-example deadline: CI machines are shared and noisy, and a
# property test must fail on a real counterexample, not on a slow moment of the machine.
settings.register_profile(
    "ollie", deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ollie")


class StandInLog:
    """Stands for a module's logger and keeps its lines: pytest's caplog misses a logger that
    another test of the full suite detached from pytest's capture."""

    def __init__(self):
        self.lines = []

    def _add(self, msg, *args):
        self.lines.append(msg % args)

    warning = info = debug = _add

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


@pytest.fixture
def stand_in_log() -> StandInLog:
    """A fresh :class:`StandInLog`."""
    return StandInLog()


@pytest.fixture(scope="session", autouse=True)
def _session_derivation_cache(tmp_path_factory):
    """Module- and session-scoped fixtures that compile (before any test's own cache is set)
    write their derivations into a temporary directory, never the real home directory."""
    old = os.environ.get("TVM_OLLIE_CACHE_DIR")
    os.environ["TVM_OLLIE_CACHE_DIR"] = str(tmp_path_factory.mktemp("ollie_cache_session"))
    yield
    if old is None:
        os.environ.pop("TVM_OLLIE_CACHE_DIR", None)
    else:
        os.environ["TVM_OLLIE_CACHE_DIR"] = old


@pytest.fixture(autouse=True)
def _own_derivation_cache(_session_derivation_cache, tmp_path_factory, monkeypatch):
    """Every test gets an empty per-user derivation cache of its own
    (:mod:`tvm_ollie.derive.cache`): no test sees another's derivations, and none writes into
    the real home directory. Subprocesses inherit the variable."""
    monkeypatch.setenv("TVM_OLLIE_CACHE_DIR", str(tmp_path_factory.mktemp("ollie_cache")))


@pytest.fixture(scope="session", autouse=True)
def _kept_metaschedule_pools():
    """MetaSchedule's local builders and runners share worker processes kept for the whole run
    (:mod:`kept_pools`): each worker's TVM import is paid once, not once per ``build()`` call
    and per runner."""
    with keep_pools():
        yield


#: The checks that run once more in a new process with another string-hash seed than this
#: one's (:func:`other_hash_seed_lines`): name -> (test folder, test module, function returning
#: the text to compare). One process runs them all: each new process pays the TVM import.
OTHER_SEED_CHECKS = {
    "fingerprint": ("ir", "test_fingerprint", "_fingerprint_text"),
    "search": ("derive", "test_search", "_determinism_lines"),
}

_OTHER_SEED_SCRIPT = """
import importlib, json, os, sys
tests, checks = sys.argv[1], json.loads(sys.argv[2])
out = {}
for name, (folder, module, func) in checks.items():
    sys.path.insert(0, os.path.join(tests, folder))
    out[name] = getattr(importlib.import_module(module), func)()
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def other_hash_seed_lines(tmp_path_factory) -> dict:
    """The text of every check of :data:`OTHER_SEED_CHECKS` computed in one new process with
    another string-hash seed (``PYTHONHASHSEED``) than this process's (random unless set) and
    an empty derivation cache of its own."""
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = dict(os.environ, PYTHONHASHSEED=seed,
               TVM_OLLIE_CACHE_DIR=str(tmp_path_factory.mktemp("ollie_cache_other_seed")))
    proc = subprocess.run(
        [sys.executable, "-c", _OTHER_SEED_SCRIPT, os.path.dirname(os.path.abspath(__file__)),
         json.dumps(OTHER_SEED_CHECKS)], env=env, capture_output=True, text=True, timeout=300,
        check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])
