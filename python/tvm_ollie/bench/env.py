"""Thread settings for a benchmark process where several runtimes take turns on the cores.

Every system gets ``threads`` threads (the machine's cores), and no system's idle threads may
keep spinning after it returns: interleaved timing alternates systems call by call, and a
runtime whose workers spin-wait steals the cores from the next one. Measured on the 2-core
development machine: torch eager on a BERT layer took 0.3-0.6 ms alone but 60-230 ms right
after a torch.compile call (two OpenMP pools spinning), and 28 ms right after ONNX Runtime;
with passive waiting both stayed under 2 ms. Hence:

* ``OMP_WAIT_POLICY=PASSIVE`` for PyTorch and inductor's OpenMP code (read when the OpenMP
  runtime starts, so it must be set before ``import torch``: ``python -m tvm_ollie.bench`` does);
* ``TVM_THREAD_POOL_SPIN_COUNT=0`` and ``TVM_NUM_THREADS`` for TVM's pool (read when the pool
  starts, at the first parallel kernel);
* ONNX Runtime's ``session.intra_op.allow_spinning=0`` (a session option, see ``systems.py``).

Values already in the environment are kept, so a user can override any of them.

That is the interleaved mode's setting. The isolated mode (the default) times each system in its
own process, one at a time, so each keeps its runtime's own waiting (what a user gets):
:func:`runtime_default_environ` is the environment without the passive waits this module added.
"""

from __future__ import annotations

import os
import sys
from typing import Dict

#: Variables set by :func:`configure_threads` (besides ``TVM_NUM_THREADS``).
PASSIVE_WAIT = {"OMP_WAIT_POLICY": "PASSIVE", "TVM_THREAD_POOL_SPIN_COUNT": "0"}

#: Environment variable naming the PASSIVE_WAIT keys that a restarted process got from the
#: benchmark, not from the user (``python -m tvm_ollie.bench`` restarts itself to set them).
ADDED_VAR = "TVM_OLLIE_BENCH_ADDED"

_ADDED: set = set()


def configure_threads(threads: int) -> Dict[str, str]:
    """Set the thread variables (keeping existing values); returns what is in effect.

    The result also says whether torch was imported before the call (``torch_preloaded``), in
    which case ``OMP_WAIT_POLICY`` may have come too late to affect it.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(int(threads)))
    for key, value in PASSIVE_WAIT.items():
        if key not in os.environ:
            _ADDED.add(key)
            os.environ[key] = value
    names = ["TVM_NUM_THREADS", *PASSIVE_WAIT, "OMP_NUM_THREADS"]
    state = {name: os.environ[name] for name in names if name in os.environ}
    state["torch_preloaded"] = str("torch" in sys.modules)
    return state


def runtime_default_environ() -> Dict[str, str]:
    """This process's environment without the passive waits that the benchmark set (by
    :func:`configure_threads` or before a restart): every runtime waits as it does by default,
    unless the user set a value. ``TVM_NUM_THREADS`` stays (the thread count is the run's)."""
    added = _ADDED | set(filter(None, os.environ.get(ADDED_VAR, "").split(",")))
    env = {k: v for k, v in os.environ.items() if k not in added and k != ADDED_VAR}
    return env
