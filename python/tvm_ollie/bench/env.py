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
"""

from __future__ import annotations

import os
import sys
from typing import Dict

#: Variables set by :func:`configure_threads` (besides ``TVM_NUM_THREADS``).
PASSIVE_WAIT = {"OMP_WAIT_POLICY": "PASSIVE", "TVM_THREAD_POOL_SPIN_COUNT": "0"}


def configure_threads(threads: int) -> Dict[str, str]:
    """Set the thread variables (keeping existing values); returns what is in effect.

    The result also says whether torch was imported before the call (``torch_preloaded``), in
    which case ``OMP_WAIT_POLICY`` may have come too late to affect it.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(int(threads)))
    for key, value in PASSIVE_WAIT.items():
        os.environ.setdefault(key, value)
    names = ["TVM_NUM_THREADS", *PASSIVE_WAIT, "OMP_NUM_THREADS"]
    state = {name: os.environ[name] for name in names if name in os.environ}
    state["torch_preloaded"] = str("torch" in sys.modules)
    return state
