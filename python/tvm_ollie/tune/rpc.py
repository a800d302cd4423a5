"""Measurement on remote devices through TVM's RPC tracker.

Tuning on the machine that compiles is only right when that machine is the deployment device.
With an :class:`RPCConfig` every measurement tvm-ollie makes (MetaSchedule trials through
``ms.runner.RPCRunner``, untuned timings and candidate comparisons through
:func:`.measure.time_main`) runs on the devices that ``python -m tvm.exec.rpc_server`` registered
with a ``python -m tvm.exec.rpc_tracker`` under one key, while builds stay local and the records
go to the same ``work_dir`` database.

Failures are explicit, never silent: an unreachable tracker, a key without servers, or no free
device within :attr:`RPCConfig.device_wait_s` raise :class:`RPCError` with a one-line message;
a device that disconnects mid-tuning makes its trials MetaSchedule errors (not records) while
the other devices go on; a remote timing that fails raises instead of returning a number.

The client side needs nothing beyond TVM; the tracker process needs ``tornado``, which the
``rpc`` extra (``pip install 'tvm-ollie[rpc]'``) installs. :class:`LocalCluster` starts a tracker
and servers on the loopback interface, to try the path on one machine (the tests use it).
"""

from __future__ import annotations

import functools
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from ..compat import meta_schedule, relax, rpc_module, tvm

__all__ = ["EXTRA_HINT", "LocalCluster", "RPCConfig", "RPCError", "parse_tracker",
           "require_tracker_dependencies", "time_remote"]

#: How to install what the RPC tracker needs (named in the error when it is missing).
EXTRA_HINT = "pip install 'tvm-ollie[rpc]'"


class RPCError(RuntimeError):
    """A remote measurement cannot happen (tracker, key or device); the message is one line."""

def require_tracker_dependencies() -> None:
    """Raise :class:`RPCError` naming the ``rpc`` extra when the tracker cannot be started here.

    TVM's tracker imports ``tornado``, which TVM does not install; without this check its
    ImportError surfaces from a subprocess, far from the command that needed it.
    """
    try:
        # lazy: tornado is optional (the rpc extra)
        import tornado  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as err:
        raise RPCError(f"the RPC tracker needs tornado, which is missing ({err}): "
                       f"{EXTRA_HINT}") from None


def parse_tracker(address: str) -> tuple:
    """``"HOST:PORT"`` -> ``(host, port)``; :class:`ValueError` with a one-line reason."""
    host, sep, port = str(address).strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bad RPC tracker address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class RPCConfig:
    """Where remote measurements run: the devices registered under ``key`` at a tracker.

    Parameters
    ----------
    tracker_host, tracker_port : str, int
        Address of ``python -m tvm.exec.rpc_tracker``.
    key : str
        The device key the servers registered with (``rpc_server --key``).
    workers : int
        Measurements run at once, each on its own device; more than the number of servers only
        queues at the tracker. MetaSchedule's runner gets this many workers.
    session_timeout_s : float
        Longest time one measurement session may hold a device; the server ends it after that,
        so a hung kernel cannot keep a device forever.
    connect_timeout_s : float
        Longest time to open the connection to the tracker (an unreachable tracker fails fast
        instead of TVM's default minute of retries).
    device_wait_s : float
        Longest time to wait for a free device of ``key`` (the tracker queues requests while
        every device is busy; without a bound, a key whose servers all died waits forever).
    """

    tracker_host: str
    tracker_port: int
    key: str
    workers: int = 1
    session_timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    device_wait_s: float = 120.0

    def __post_init__(self):
        if not self.tracker_host:
            raise ValueError("RPCConfig: tracker_host is empty")
        if not 0 < int(self.tracker_port) < 65536:
            raise ValueError(f"RPCConfig: bad tracker port {self.tracker_port}")
        if not self.key or any(c.isspace() for c in self.key):
            raise ValueError(f"RPCConfig: bad device key {self.key!r} (non-empty, no spaces)")
        if int(self.workers) < 1:
            raise ValueError(f"RPCConfig: workers must be >= 1, not {self.workers}")
        for name in ("session_timeout_s", "connect_timeout_s", "device_wait_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RPCConfig: {name} must be > 0")

    @classmethod
    def from_address(cls, address: str, key: str, **options) -> "RPCConfig":
        """The config for a ``"HOST:PORT"`` tracker address (as the CLI takes it)."""
        host, port = parse_tracker(address)
        return cls(host, port, key, **options)

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the tracker."""
        return f"{self.tracker_host}:{self.tracker_port}"

    def __str__(self) -> str:
        return f"key {self.key!r} at tracker {self.address}"

    # -- tracker protocol (bounded) --------------------------------------------------------

    def _tracker_socket(self) -> socket.socket:
        """A connection to the tracker after its handshake; RPCError when it cannot be had."""
        base = rpc_module().base
        try:
            sock = socket.create_connection((self.tracker_host, self.tracker_port),
                                            timeout=self.connect_timeout_s)
        except OSError as err:
            raise RPCError(f"cannot reach the RPC tracker at {self.address}: "
                           f"{err.strerror or err} (is python -m tvm.exec.rpc_tracker running "
                           f"there? it needs {EXTRA_HINT})") from None
        try:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(sock, 4))[0]
        except (OSError, RuntimeError) as err:
            sock.close()
            raise RPCError(f"{self.address} did not answer as an RPC tracker: {err}") from None
        if magic != base.RPC_TRACKER_MAGIC:
            sock.close()
            raise RPCError(f"{self.address} is not an RPC tracker")
        return sock

    def summary(self) -> dict:
        """The tracker's summary (``server_info``, ``queue_info``)."""
        base = rpc_module().base
        sock = self._tracker_socket()
        try:
            base.sendjson(sock, [base.TrackerCode.SUMMARY])
            value = base.recvjson(sock)
        except (OSError, RuntimeError) as err:
            raise RPCError(f"the RPC tracker at {self.address} dropped the connection: "
                           f"{err}") from None
        finally:
            sock.close()
        if not value or value[0] != base.TrackerCode.SUCCESS:
            raise RPCError(f"the RPC tracker at {self.address} refused a summary: {value!r}")
        return value[1]

    def servers(self) -> int:
        """Number of servers registered under :attr:`key` (busy or free)."""
        count = 0
        for item in self.summary().get("server_info", []):
            kind, _, key = str(item.get("key", "")).partition(":")
            if kind == "server" and key == self.key:
                count += 1
        return count

    def check(self) -> int:
        """Fail fast before any work: the tracker answers and has servers for :attr:`key`.

        Returns the number of servers; raises :class:`RPCError` otherwise.
        """
        n = self.servers()
        if n == 0:
            raise RPCError(f"no RPC server is registered under key {self.key!r} at the tracker "
                           f"{self.address} (start one with python -m tvm.exec.rpc_server "
                           f"--tracker {self.address} --key {self.key})")
        return n

    def connect(self) -> "tvm.rpc.RPCSession":
        """A session on a free device of :attr:`key`, waiting at most :attr:`device_wait_s`.

        A key without any server fails at once (the tracker would queue the request until
        one registers): that is what remains when every device of the key disconnected.
        """
        base = rpc_module().base
        self.check()
        sock = self._tracker_socket()
        try:
            sock.settimeout(self.device_wait_s)
            base.sendjson(sock, [base.TrackerCode.REQUEST, self.key, "", 1])
            value = base.recvjson(sock)
        except socket.timeout:
            raise RPCError(f"no free device under key {self.key!r} at the tracker {self.address} "
                           f"within {self.device_wait_s:g} s") from None
        except (OSError, RuntimeError) as err:
            raise RPCError(f"the RPC tracker at {self.address} dropped the connection while a "
                           f"device of key {self.key!r} was requested: {err}") from None
        finally:
            # Closing withdraws a request still queued at the tracker.
            sock.close()
        if not value or value[0] != base.TrackerCode.SUCCESS:
            raise RPCError(f"the RPC tracker at {self.address} refused key {self.key!r}: "
                           f"{value!r}")
        host, port, matchkey = value[1]
        try:
            return rpc_module().connect(host, port, matchkey,
                                        session_timeout=self.session_timeout_s)
        except Exception as err:  # pylint: disable=broad-except
            raise RPCError(f"the device at {host}:{port} (key {self.key!r}) did not accept the "
                           f"session: {_first_line(err)}") from None

    # -- MetaSchedule ----------------------------------------------------------------------

    def ms_runner(self, evaluator_config=None) -> "object":
        """``ms.runner.RPCRunner`` measuring on these devices, :attr:`workers` at a time.

        Its sessions are opened by :meth:`connect` (bounded waits), in the runner's worker
        processes; a trial whose device disconnects is a runner error, never a record.
        """
        ms = meta_schedule()
        config = ms.runner.RPCConfig(
            tracker_host=self.tracker_host, tracker_port=self.tracker_port,
            tracker_key=self.key, session_timeout_sec=int(math.ceil(self.session_timeout_s)))
        return ms.runner.RPCRunner(
            rpc_config=config, evaluator_config=evaluator_config,
            f_create_session=functools.partial(_runner_session, self),
            max_workers=int(self.workers))


def _runner_session(config: RPCConfig, _ms_config) -> "tvm.rpc.RPCSession":
    """RPCRunner's session factory (runs in its worker processes)."""
    return config.connect()


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def time_remote(ex: "tvm.runtime.Executable", args: Sequence, config: RPCConfig,
                device_kind: str = "cpu", number: int = 5, repeat: int = 5) -> float:
    """Median seconds of ``main`` on a remote device: export, upload, load, time there.

    Raises :class:`RPCError` (one line) when any step fails and when the timing is not a
    positive finite number, so callers never record a failed measurement as a success.
    """

    with tempfile.TemporaryDirectory(prefix="ollie_rpc_") as tmp:
        name = f"ollie_{uuid.uuid4().hex[:12]}.so"
        path = os.path.join(tmp, name)
        ex.export_library(path)
        session = config.connect()
        try:
            session.upload(path)
            lib = session.load_module(name)
            dev = session.device(device_kind, 0)
            vm = relax.VirtualMachine(lib, dev)
            targs = [tvm.runtime.tensor(a, dev) for a in args]
            vm["main"](*targs)
            res = vm.time_evaluator("main", dev, number=number, repeat=repeat,
                                    min_repeat_ms=0)(*targs)
            seconds = float(res.median)
        except RPCError:
            raise
        except Exception as err:  # pylint: disable=broad-except
            raise RPCError(f"remote timing on {config} failed: {type(err).__name__}: "
                           f"{_first_line(err)}") from None
        finally:
            del session
    if not (math.isfinite(seconds) and seconds > 0):
        raise RPCError(f"remote timing on {config} returned {seconds!r} s")
    return seconds


# ---------------------------------------------------------------------------------------------
# A tracker and servers on this machine (loopback only)
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """A tracker and ``servers`` RPC servers on 127.0.0.1, as subprocesses (a context manager).

    Each process runs TVM's own ``python -m tvm.exec.rpc_tracker`` / ``rpc_server`` in a new
    session (process group), so :meth:`kill_server` and :meth:`close` end a server together
    with the session processes it forked, and nothing outlives the context. Server logs go to
    ``log_dir`` (one file each), where every uploaded module shows as a ``load_module`` line:
    :meth:`loads` counts them per server.

    Parameters
    ----------
    servers : int
        Number of servers registered under ``key``.
    key : str
        Device key.
    log_dir : str, optional
        Where the logs go (a temporary directory when None).
    start_timeout_s : float
        Longest wait for the tracker to list every server.
    """

    def __init__(self, servers: int = 2, key: str = "ollie-local", log_dir: Optional[str] = None,
                 start_timeout_s: float = 120.0):
        require_tracker_dependencies()
        self.key = key
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="ollie_rpc_logs_")
        os.makedirs(self.log_dir, exist_ok=True)
        self.n_servers = int(servers)
        self.start_timeout_s = start_timeout_s
        self.tracker_port = 0
        self._tracker: Optional[subprocess.Popen] = None
        self._servers: List[subprocess.Popen] = []
        self._logs: List[str] = []
        self._files: List = []

    # -- lifecycle -------------------------------------------------------------------------

    def _spawn(self, args: List[str], log: str) -> subprocess.Popen:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        out = open(log, "w", encoding="utf-8")  # pylint: disable=consider-using-with
        self._files.append(out)
        return subprocess.Popen([sys.executable, "-m", *args], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)

    def start(self) -> "LocalCluster":
        """Start the tracker and the servers; return once the tracker lists every server."""
        port = _free_port()
        self._tracker = self._spawn(
            ["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
             "--port-end", str(port + 1)], os.path.join(self.log_dir, "tracker.log"))
        self.tracker_port = port
        config = RPCConfig("127.0.0.1", port, self.key, connect_timeout_s=1.0)
        deadline = time.monotonic() + self.start_timeout_s
        # The servers start with the tracker (each pays TVM's import, seconds on a loaded
        # machine) and retry their registration until the tracker listens.
        for i in range(self.n_servers):
            log = os.path.join(self.log_dir, f"server{i}.log")
            self._logs.append(log)
            sport = _free_port()
            self._servers.append(self._spawn(
                ["tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(sport),
                 "--port-end", str(sport + 1), "--tracker", f"127.0.0.1:{port}",
                 "--key", self.key], log))
        self._wait(lambda: self._ready(config, self.n_servers), deadline,
                   f"{self.n_servers} server(s) to register")
        return self

    def _ready(self, config: RPCConfig, servers: Optional[int]) -> bool:
        for proc in [self._tracker] + self._servers:
            if proc is not None and proc.poll() is not None:
                raise RPCError(f"an RPC process exited with {proc.returncode} at start "
                               f"(logs in {self.log_dir})")
        try:
            if servers is None:
                config.summary()
                return True
            return config.servers() >= servers
        except RPCError:
            return False

    def _wait(self, ready, deadline: float, what: str) -> None:
        while not ready():
            if time.monotonic() > deadline:
                self.close()
                raise RPCError(f"timed out waiting for {what} (logs in {self.log_dir})")
            time.sleep(0.2)

    def config(self, **options) -> RPCConfig:
        """An :class:`RPCConfig` for this cluster (``workers`` defaults to the server count)."""
        options.setdefault("workers", self.n_servers)
        return RPCConfig("127.0.0.1", self.tracker_port, self.key, **options)

    @staticmethod
    def _end(proc: Optional[subprocess.Popen], sig=signal.SIGTERM) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)  # the group this cluster created for it
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def kill_server(self, index: int) -> None:
        """SIGKILL server ``index`` and its session processes (a device that disappears)."""
        self._end(self._servers[index], signal.SIGKILL)

    def close(self) -> None:
        """End every process of the cluster (idempotent)."""
        for proc in self._servers:
            self._end(proc)
        self._end(self._tracker)
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- observation -----------------------------------------------------------------------

    def loads(self) -> Dict[int, int]:
        """Modules loaded (one per measurement session) by each server, from its log."""
        out = {}
        for i, log in enumerate(self._logs):
            try:
                with open(log, encoding="utf-8", errors="replace") as f:
                    out[i] = sum(1 for line in f if "load_module" in line)
            except OSError:
                out[i] = 0
        return out
