"""Measurement through TVM's RPC tracker, against real trackers and servers on 127.0.0.1.

Every cluster is TVM's own ``python -m tvm.exec.rpc_tracker`` / ``rpc_server`` in subprocesses
(:class:`LocalCluster`), ended when its test or module ends. The default run shares one
tracker with one server (its start costs two TVM imports); the tuning tests start their own.
"""

import dataclasses
import logging
import os
import sys
import threading
import time

import numpy as np
import pytest
from tvm import relax

from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.pipeline import build
from tvm_ollie.transform.decide import Decider
from tvm_ollie.tune import STATS, Tuner, compile_module, random_args, time_main
from tvm_ollie.tune.rpc import (EXTRA_HINT, LocalCluster, RPCConfig, RPCError, parse_tracker,
                                require_tracker_dependencies)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "transform"))
import small_models as sm  # noqa: E402

logging.getLogger("tvm_ollie.derive").setLevel(logging.CRITICAL)


def _matmul(n=64):
    return single_function_module([tensor_var("x", (n, n)), tensor_var("w", (n, n))],
                                  lambda bb, x, w: relax.op.matmul(x, w))


def _closed_port() -> int:
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nobody listens


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(1, key="ollie-test", log_dir=str(tmp_path_factory.mktemp("rpc"))) as c:
        yield c


# -- configuration (no network) ---------------------------------------------------------------


def test_config_parsing_and_validation():
    cfg = RPCConfig.from_address("127.0.0.1:9190", "k", workers=2)
    assert (cfg.tracker_host, cfg.tracker_port, cfg.key, cfg.workers) == ("127.0.0.1", 9190,
                                                                          "k", 2)
    assert cfg.address == "127.0.0.1:9190" and "'k'" in str(cfg)
    assert parse_tracker("[::1]:9000") == ("::1", 9000)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.key = "other"  # type: ignore[misc]
    for bad in ("localhost", "host:", ":9190", "h:70000", "h:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            RPCConfig.from_address(bad, "k")
    with pytest.raises(ValueError, match="workers"):
        RPCConfig("h", 1, "k", workers=0)
    with pytest.raises(ValueError, match="key"):
        RPCConfig("h", 1, "two words")
    with pytest.raises(ValueError, match="device_wait_s"):
        RPCConfig("h", 1, "k", device_wait_s=0)


def test_missing_tornado_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tornado", None)  # makes ``import tornado`` fail
    with pytest.raises(RPCError) as err:
        require_tracker_dependencies()
    assert EXTRA_HINT in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RPCError, match="tvm-ollie\\[rpc\\]"):
        LocalCluster(1)


# -- error paths --------------------------------------------------------------------------------


def test_unreachable_tracker_fails_fast_in_one_line():
    cfg = RPCConfig("127.0.0.1", _closed_port(), "k")
    t0 = time.perf_counter()
    with pytest.raises(RPCError) as err:
        cfg.check()
    assert time.perf_counter() - t0 < 5  # not TVM's minute of connection retries
    msg = str(err.value)
    assert msg.startswith(f"cannot reach the RPC tracker at {cfg.address}") and "\n" not in msg
    # the pass fails before any search or build
    with pytest.raises(RPCError, match="cannot reach"):
        Decider("llvm", trials=2, rpc=cfg)
    ex = compile_module(_matmul(8), "llvm")
    with pytest.raises(RPCError, match="cannot reach"):
        time_main(ex, random_args(_matmul(8)["main"]), rpc=cfg)


def test_key_without_servers(cluster):
    cfg = dataclasses.replace(cluster.config(), key="no-such-device")
    with pytest.raises(RPCError, match="no RPC server is registered under key 'no-such-device'"):
        cfg.check()
    assert cluster.config().check() == 1


def test_no_free_device_is_a_bounded_wait(cluster):
    cfg = cluster.config(device_wait_s=1.0)
    held = cfg.connect()  # the only device is now busy
    try:
        t0 = time.perf_counter()
        with pytest.raises(RPCError, match="no free device under key 'ollie-test'.*within 1 s"):
            cfg.connect()
        assert time.perf_counter() - t0 < 10
    finally:
        del held
    # the device comes back once the session ends (the server re-registers within seconds)
    deadline = time.monotonic() + 30
    while True:
        try:
            session = cluster.config(device_wait_s=5.0).connect()
            break
        except RPCError:
            assert time.monotonic() < deadline, "the device never came back"
    assert session.cpu().exist
    del session


# -- the path itself ------------------------------------------------------------------------


def test_time_main_runs_on_the_remote_server(cluster):
    mod = _matmul()
    ex = compile_module(mod, "llvm")
    args = random_args(mod["main"])
    before = cluster.loads()[0]
    seconds = time_main(ex, args, rpc=cluster.config(), target="llvm", number=2, repeat=2)
    assert 0 < seconds < 1
    assert cluster.loads()[0] == before + 1  # the module was uploaded and loaded there
    with pytest.raises(ValueError, match="not both"):
        time_main(ex, args, device=object(), rpc=cluster.config())


def test_failed_remote_timing_is_never_cached(cluster, tmp_path):
    """A measurement that fails remotely leaves the Decider's timing cache empty."""
    call = sm.conv3x3()["main"].body.blocks[0].bindings[0].value
    from tvm_ollie.transform.decide import isolated_module  # pylint: disable=C0415

    decider = Decider("llvm", trials=0, work_dir=str(tmp_path), rpc=cluster.config(),
                      check_untuned=True)
    gone = dataclasses.replace(cluster.config(), key="no-such-device")
    decider.cost_model.rpc = gone  # the devices went away after the start-up check
    t0 = time.perf_counter()
    assert decider.cost_model.measure(isolated_module(call), "sig|original") is None
    assert time.perf_counter() - t0 < 30  # no wait for a device that cannot come
    # the measured path (trials > 0) with its own cache
    decider = Decider("llvm", trials=2, work_dir=str(tmp_path), rpc=cluster.config())
    decider.cost_model.rpc = decider.cost_model.tuner.rpc = gone
    calls = STATS.calls
    assert decider.cost_model.measure(isolated_module(call), "sig|original") is None
    assert STATS.calls == calls  # stopped before tuning: no trial was spent
    assert decider.cost_model.cache.data == {}
    assert not os.path.exists(os.path.join(str(tmp_path), "ollie_measurements.json"))


# -- tuning through the tracker (tens of seconds to minutes on 2 cores) -----------------------


@pytest.mark.tuning
def test_tuning_uses_both_servers_and_matches_local(tmp_path):
    mod = _matmul()
    args = random_args(mod["main"])
    with LocalCluster(2, log_dir=str(tmp_path / "logs")) as c:
        cfg = c.config(workers=2)
        ex, report = build(mod, "llvm", trials=4, work_dir=str(tmp_path / "db"), rpc=cfg,
                           search_time_s=3, max_measured=1)
        loads = c.loads()
        assert all(n >= 1 for n in loads.values()), loads  # both servers measured trials
        remote_s = time_main(ex, args, rpc=cfg, target="llvm")
    assert remote_s > 0 and report.decisions
    tuner = Tuner("llvm", str(tmp_path / "db"))
    from tvm_ollie.tune.metaschedule import legalize_and_fuse  # pylint: disable=C0415

    assert not tuner.untuned(legalize_and_fuse(mod, "llvm"))  # valid records in work_dir
    local, _ = build(mod, "llvm", trials=0, search_time_s=3)
    np.testing.assert_allclose(sm.run(ex, args), sm.run(local, args), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(sm.run(ex, args), args[0] @ args[1], rtol=1e-4, atol=1e-4)


@pytest.mark.tuning
def test_server_killed_mid_tuning(tmp_path):
    """One of two devices dies during the trials: the run finishes on the other one."""
    mod = _matmul()
    args = random_args(mod["main"])
    with LocalCluster(2, log_dir=str(tmp_path / "logs")) as c:
        cfg = c.config(workers=2)
        killed, done = threading.Event(), threading.Event()

        def kill_after_first_measurement():
            while not done.is_set():
                if c.loads()[0] >= 1:
                    c.kill_server(0)
                    killed.set()
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_after_first_measurement, daemon=True)
        watcher.start()
        tuner = Tuner("llvm", str(tmp_path / "db"), rpc=cfg)
        try:
            ex = compile_module(mod, "llvm", tuner, trials=4)
        finally:
            done.set()
            watcher.join(timeout=10)
        assert killed.is_set(), "server 0 took no measurement to be killed during"
        assert c.loads()[1] >= 1, c.loads()
        assert cfg.check() == 1  # the tracker dropped the dead server
        assert time_main(ex, args, rpc=cfg, target="llvm") > 0  # measured on the survivor
    np.testing.assert_allclose(sm.run(ex, args), args[0] @ args[1], rtol=1e-4, atol=1e-4)
