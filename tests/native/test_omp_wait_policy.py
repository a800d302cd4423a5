"""GNU OpenMP's waiting policy is set before anything loads libgomp: ``import tvm`` loads one
(torch's here), and libgomp reads ``OMP_WAIT_POLICY`` once, when it initializes, so the policy
is applied when ``tvm_ollie.native`` is imported, which ``import tvm_ollie`` does first."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")

#: Records the policy at the moment ``tvm`` is first imported, then imports tvm_ollie.
_CHILD = """
import os, sys
seen = {}
class Hook:
    def find_spec(self, name, path=None, target=None):
        if name == "tvm" and "tvm" not in seen:
            seen["tvm"] = os.environ.get("OMP_WAIT_POLICY", "unset")
        return None
sys.meta_path.insert(0, Hook())
import tvm_ollie
print(seen.get("tvm"))
"""


def _policy_when_tvm_loads(**env) -> str:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("OMP_WAIT_POLICY", "TVM_OLLIE_OMP_WAIT_POLICY",
                            "TVM_OLLIE_PARALLEL_RUNTIME")}
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", _CHILD], cwd=ROOT, env=environ,
                         capture_output=True, text=True, timeout=300, check=True)
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow  # two fresh interpreters importing TVM: ~20 s on the shared 2-core machine
def test_policy_is_set_before_tvm_loads_libgomp():
    assert _policy_when_tvm_loads() == "unset"  # one pool: OpenMP's own policy
    assert _policy_when_tvm_loads(TVM_OLLIE_PARALLEL_RUNTIME="tvm") == "PASSIVE"  # two pools
    assert _policy_when_tvm_loads(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"  # the user's kept
    assert _policy_when_tvm_loads(TVM_OLLIE_OMP_WAIT_POLICY="unset") == "unset"
