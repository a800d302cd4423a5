"""The ``tvm-ollie`` command line, driven as a user drives it: in a subprocess.

Each subprocess pays the TVM import (about 3-5 s), so the compiled libraries are shared by the
tests of one module (``scope="module"`` fixtures), the error cases are small, and a real process
is started only where the process is what a test checks: ``python -m tvm_ollie.cli``'s exit
codes and output, Ctrl-C, and the derivation cache read back by a new process. The other
commands run ``main(args)`` in this process (:func:`in_process`), the same code below the
import.
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "frontend"))

import tiny_models  # noqa: E402  pylint: disable=wrong-import-position


#: A short derivation search: the tiny models need no more, and each test stays a few seconds.
FAST = ("--search-time", "3")


def cli(*args, cwd=None, timeout=300):
    """Run ``python -m tvm_ollie.cli ARGS``; returns the completed process (text output)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "tvm_ollie.cli", *map(str, args)], cwd=cwd, env=env,
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def ok(proc):
    """Assert a zero exit; returns stdout."""
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    assert "Traceback" not in proc.stderr
    return proc.stdout


def one_line_error(proc, expected_code=2):
    """Assert a failed run that printed one error line and no traceback; returns that line."""
    assert proc.returncode == expected_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tvm-ollie: error: ")
    return lines[0]


def in_process(capsys, args, cwd):
    """Run ``main(args)`` in this process (no TVM import to pay); returns a CompletedProcess."""
    from tvm_ollie.cli import main  # pylint: disable=import-outside-toplevel

    old = os.getcwd()
    os.chdir(cwd)
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors exit
        code = exc.code
    finally:
        os.chdir(old)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def in_process_error(capsys, args, cwd, expected_code=2):
    """Run ``main(args)`` in this process; returns its one error line."""
    return one_line_error(in_process(capsys, args, cwd), expected_code)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder with the tiny model as ONNX, .json and .py, an input and its expected output."""
    path = tmp_path_factory.mktemp("cli")
    w, b = tiny_models.write_onnx(str(path / "tiny.onnx"))
    from tvm import ir  # pylint: disable=import-outside-toplevel

    (path / "tiny.json").write_text(ir.save_json(tiny_models.relax_module()))
    tiny_models.write_python_model(str(path / "tiny_model.py"))
    x = np.random.default_rng(1).uniform(-1, 1, tiny_models.X_SHAPE).astype("float32")
    np.save(path / "x.npy", x)
    np.save(path / "x_bad.npy", np.zeros((1, 2, 5, 6), "float32"))
    return path, tiny_models.reference(x, w, b)


@pytest.fixture(scope="module")
def onnx_lib(work):
    """``tiny.onnx`` compiled for llvm."""
    path, _ = work
    out = ok(cli("compile", "tiny.onnx", "-t", "llvm", "-o", "tiny.so", *FAST, cwd=path))
    assert "wrote tiny.so" in out
    return path / "tiny.so"


def _run_and_compare(path, lib, expected):
    out = ok(cli("run", lib, "--input", "x=x.npy", "--output", "y.npz", "--repeat", "2", cwd=path))
    assert "output 0: float32[1, 4, 6, 6]" in out and "latency:" in out
    got = np.load(path / "y.npz")["output_0"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_compile_onnx_and_run(work, onnx_lib):
    path, expected = work
    assert os.path.getsize(onnx_lib) > 0
    _run_and_compare(path, onnx_lib, expected)


def _load_and_compare(path, lib, expected):
    """The library is an ordinary TVM artifact: load_module + the Relax VM run it."""
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path / lib)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(np.load(path / "x.npy"))).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_library_loads_in_plain_tvm(work, onnx_lib):
    path, expected = work
    _load_and_compare(path, onnx_lib.name, expected)


def test_compile_json_module(work, capsys):
    path, expected = work
    ok(in_process(capsys, ["compile", "tiny.json", "-o", "tiny_json.so", *FAST], path))
    _load_and_compare(path, "tiny_json.so", expected)


def test_compile_with_orchestration(work, capsys):
    path, expected = work
    ok(in_process(capsys, ["compile", "tiny.json", "-o", "tiny_orch.so", "--orchestrate", *FAST],
                  path))
    _load_and_compare(path, "tiny_orch.so", expected)


def test_compile_python_function_binds_params(work, capsys):
    path, expected = work
    ok(in_process(capsys, ["compile", "tiny_model.py:make", "-o", "tiny_py.so", *FAST], path))
    _load_and_compare(path, "tiny_py.so", expected)


def test_run_random_inputs(work, onnx_lib, capsys):
    path, _ = work
    proc = in_process(capsys, ["run", onnx_lib.name, "--random-inputs", "--repeat", "1"], path)
    out = ok(proc)
    assert "output 0: float32[1, 4, 6, 6]" in out and "latency:" in out
    assert "random input x: float32[1, 2, 6, 6]" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["run", "tiny.so"], "missing input x"),
    (["run", "tiny.so", "--input", "y=x.npy"], "unknown input y"),
    (["run", "tiny.so", "--input", "x=x_bad.npy"], "has shape [1, 2, 5, 6]"),
    (["run", "tiny.so", "--input", "x=none.npy"], "no such input file"),
    (["run", "tiny.onnx", "--random-inputs"], "not a compiled library"),
    (["run", "none.so"], "no such library"),
    (["run", "tiny.so", "--random-inputs", "--output", "y.txt"], "expected a .npz"),
])
def test_run_errors(work, onnx_lib, capsys, args, message):
    path, _ = work
    assert onnx_lib.exists()
    assert message in in_process_error(capsys, args, path)


@pytest.mark.parametrize("args, message", [
    (["compile", "tiny.onnx", "-t", "llvmx"], "bad target 'llvmx'"),
    (["explain", "tiny.onnx", "-t", "llvm -mcpu=znver3"], "JSON form"),
    (["compile", "tiny.onnx", "-t", '{"kind": "llvm", "cores": 2}'], "Unknown config option"),
    (["compile", "tiny_model.py:nope"], "no function 'nope'"),
    (["compile", "tiny.onnx", "--shape", "q=1,2"], "not inputs"),
    (["compile", "tiny.onnx", "-o", "no/such/dir/x.so"], "output directory does not exist"),
    (["compile", "tiny.onnx", "--trials", "-1"], "--trials"),
    (["lift", "x_bad.npy"], "unsupported model format"),
    (["demo", "--channels", "0"], "--channels"),
    (["compile", "tiny.onnx", "--rpc-key", "k"], "need --rpc-tracker HOST:PORT"),
    (["explain", "tiny.onnx", "--rpc-tracker", "127.0.0.1:9190"], "needs --rpc-key"),
    (["compile", "tiny.onnx", "--rpc-tracker", "nohost", "--rpc-key", "k"], "expected HOST:PORT"),
    (["explain", "tiny.onnx", "--rpc-tracker", "h:1", "--rpc-key", "k", "--rpc-workers", "0"],
     "--rpc-workers must be >= 1"),
])
def test_user_errors_are_one_line(work, capsys, args, message):
    path, _ = work
    assert message in in_process_error(capsys, args, path)


def test_errors_in_a_real_process(work, capsys):
    """The same errors end to end: a missing file (in a real process: exit code and one line,
    no traceback) and an unknown command (argparse's exit, caught in this process)."""
    path, _ = work
    assert "no such model file" in one_line_error(cli("compile", "missing.onnx", cwd=path))
    line = in_process_error(capsys, ["frobnicate"], path)
    assert "invalid choice: 'frobnicate'" in line


def _closed_port() -> int:
    import socket  # pylint: disable=import-outside-toplevel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens there once the block ends


def test_unreachable_rpc_tracker_is_one_line(work, capsys):
    """No tracker at the address: one line and exit 1 before any search, in a real process too."""
    path, _ = work
    tracker = f"127.0.0.1:{_closed_port()}"
    proc = cli("compile", "tiny.onnx", "--rpc-tracker", tracker, "--rpc-key", "k", "-o", "r.so",
               *FAST, cwd=path)
    line = one_line_error(proc, expected_code=1)
    assert f"cannot reach the RPC tracker at {tracker}" in line
    assert not (path / "r.so").exists()
    line = in_process_error(capsys, ["explain", "tiny.onnx", "--trials", "2", "--rpc-tracker",
                                     tracker, "--rpc-key", "k", *FAST], path, expected_code=1)
    assert "cannot reach the RPC tracker" in line


@pytest.mark.tuning
def test_compile_tunes_through_rpc(work, tmp_path):
    """``--rpc-*`` with trials: the measurements happen on the server, the library is right."""
    from tvm_ollie.tune.rpc import LocalCluster  # pylint: disable=import-outside-toplevel

    path, expected = work
    with LocalCluster(1, key="cli-test", log_dir=str(tmp_path)) as cluster:
        out = ok(cli("compile", "tiny.onnx", "--trials", "2", "--work-dir", tmp_path / "db",
                     "--rpc-tracker", f"127.0.0.1:{cluster.tracker_port}", "--rpc-key",
                     "cli-test", "-o", "tiny_rpc.so", *FAST, cwd=path))
        assert "wrote tiny_rpc.so" in out
        assert cluster.loads()[0] >= 2  # at least the trials ran there
    _load_and_compare(path, "tiny_rpc.so", expected)


def test_unsupported_onnx_operator(tmp_path, capsys):
    import onnx  # pylint: disable=import-outside-toplevel
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "bad.onnx"))
    line = in_process_error(capsys, ["compile", "bad.onnx"], tmp_path)
    assert "operator NoSuchOp (node #0) is not supported by TVM's ONNX importer" in line


def _assert_lists_each_operator(out):
    # conv2d is derivable and gets a decision; the others are listed as kept.
    for op in ("relax.nn.conv2d", "relax.nn.relu", "relax.add"):
        assert op in out
    for column in ("binding", "operator", "before", "after", "chosen"):
        assert column in out
    assert "rule path:" in out


def test_explain_lists_each_operator_and_twice_reuses_the_derivations(work, monkeypatch, capsys):
    """A cold ``explain`` in a real process lists every operator; a second process reads its
    derivations back from the disk cache and profiles the stages; then (in this process) the
    remembered decisions and ``--no-derivation-cache``."""
    path, _ = work
    counts = re.compile(r"derivations: (\d+) cached, (\d+) searched")
    first = ok(cli("explain", "tiny.onnx", *FAST, cwd=path))
    _assert_lists_each_operator(first)
    cached, searched = map(int, counts.search(first).groups())
    assert cached == 0 and searched >= 1
    # the decisions remembered per machine are read back first; without them, the
    # derivations are
    monkeypatch.setenv("TVM_OLLIE_REMEASURE", "1")
    second = ok(cli("explain", "tiny.onnx", *FAST, cwd=path))
    assert counts.search(second).groups() == (str(searched), "0")
    profile = next(line for line in second.splitlines() if line.startswith("compile profile:"))
    for name in ("import", "lift", "derivation cache", "verify", "total"):
        assert name in profile
    monkeypatch.delenv("TVM_OLLIE_REMEASURE")
    third = ok(in_process(capsys, ["explain", "tiny.onnx", *FAST], path))
    assert counts.search(third).groups() == ("0", "0")
    assert re.search(r", [1-9]\d* signatures decided before", third)
    off = ok(in_process(capsys, ["explain", "tiny.onnx", "--no-derivation-cache", *FAST], path))
    assert counts.search(off).groups() == ("0", str(searched))


def test_compile_explain_prints_the_report_and_profile(work, capsys):
    path, _ = work
    out = ok(in_process(capsys, ["compile", "tiny.onnx", "-o", "tiny_explained.so", "--explain",
                                 *FAST], path))
    assert "calls rewritten" in out and "derivations:" in out
    assert "compile profile: import" in out and "tvm build" in out


def test_compile_for_cuda_without_running(work, capsys):
    """A GPU target builds anywhere: without a GPU the library holds CUDA source."""
    path, expected = work
    ok(in_process(capsys, ["compile", "tiny.onnx", "-t", "nvidia/nvidia-h100", "-o",
                           "tiny_cuda.so", *FAST], path))
    assert os.path.getsize(path / "tiny_cuda.so") > 0
    import tvm  # pylint: disable=import-outside-toplevel

    if tvm.cuda(0).exist:
        _run_and_compare(path, "tiny_cuda.so", expected)
    else:
        line = in_process_error(capsys, ["run", "tiny_cuda.so", "--random-inputs"], path)
        assert "CUDA" in line


def test_demo_passes(capsys):
    out = ok(in_process(capsys, ["demo", "--channels", "4", "--size", "8", "--repeat", "3",
                                 *FAST], os.getcwd()))
    assert "demo passed" in out
    assert "speedup" in out and "relax.nn.conv2d" in out


def test_roundtrip_and_lift(work, capsys):
    path, _ = work
    out = ok(in_process(capsys, ["roundtrip", "--channels", "4", "--size", "6", "--filters", "4"],
                        path))
    assert "demo passed" in out
    out = ok(in_process(capsys, ["lift", "tiny.onnx"], path))
    assert "relax.nn.conv2d: L<" in out


def test_bench_is_forwarded(capsys):
    out = ok(in_process(capsys, ["bench", "--list"], os.getcwd()))
    assert out.startswith("models: ") and "systems: " in out


def test_interrupt_exits_130(work):
    path, _ = work
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvm_ollie.cli", "demo", "--channels", "8", "--size", "16"],
        cwd=path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = proc.stdout.readline()  # printed once TVM is imported and the model is built
        assert first.startswith("demo model:"), first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "tvm-ollie: interrupted" in err and "Traceback" not in err


def test_dtype_option_reaches_build():
    from tvm_ollie.cli import build_parser  # pylint: disable=import-outside-toplevel

    parser = build_parser()
    assert parser.parse_args(["compile", "m.json"]).dtype == "float32"
    assert parser.parse_args(["compile", "m.json", "--dtype", "float16"]).dtype == "float16"
    with pytest.raises(SystemExit):  # TVM's ToMixedPrecision makes float16 only
        parser.parse_args(["compile", "m.json", "--dtype", "bfloat16"])


def test_no_blocked_layout_option():
    from tvm_ollie.cli import _config, build_parser  # pylint: disable=import-outside-toplevel

    parser = build_parser()
    for argv, want in ((["compile", "m.json"], True),
                       (["compile", "m.json", "--no-blocked-layout"], False)):
        args = parser.parse_args(argv)
        assert _config(args, "llvm", blocked_layout=not args.no_blocked_layout
                       ).blocked_layout is want



def test_cached_alloc_options():
    """Planned memory cached per VM by default; --no-cached-alloc turns it off, --cached-alloc
    (the old opt-in) is still accepted."""
    from tvm_ollie.cli import _config, build_parser  # pylint: disable=import-outside-toplevel

    parser = build_parser()
    for argv, want in ((["compile", "m.json"], True),
                       (["compile", "m.json", "--cached-alloc"], True),
                       (["compile", "m.json", "--no-cached-alloc"], False)):
        args = parser.parse_args(argv)
        assert args.cached_alloc is want
        assert _config(args, "llvm", cached_alloc=args.cached_alloc).cached_alloc is want

@pytest.mark.slow
def test_compile_float16_takes_the_same_inputs(work, capsys):
    """--dtype float16 converts the model inside; the library keeps its float32 signature."""
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    path, expected = work
    ok(in_process(capsys, ["compile", "tiny.json", "-o", "tiny16.so", "--dtype", "float16",
                           *FAST], path))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(path / "tiny16.so")), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(np.load(path / "x.npy"))).numpy()
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2 * np.abs(expected).max())
