"""The command line when things go wrong: a work dir cut short by a crash, Ctrl-C during tuning,
two compiles sharing a work dir, a clean exit after tuning, and bad input of every kind.

The fast tests build their tuning database directly (no MetaSchedule search) and drive
``cli.main`` in this process; the ``tuning`` ones run real compiles with 1 trial in subprocesses.
"""

import contextlib
import glob
import io
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from test_cli import FAST, cli, in_process, in_process_error, ok  # noqa: E402
import tiny_models  # noqa: E402  pylint: disable=wrong-import-order

from tvm_ollie.cli import main
from tvm_ollie.tune import workdir

# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """``tiny.onnx``, an input ``x.npy`` and the expected output."""
    path = tmp_path_factory.mktemp("reliab")
    w, b = tiny_models.write_onnx(str(path / "tiny.onnx"))
    x = np.random.default_rng(3).uniform(-1, 1, tiny_models.X_SHAPE).astype("float32")
    np.save(path / "x.npy", x)
    return path, tiny_models.reference(x, w, b)


def _vm_output(lib, x):
    import tvm  # pylint: disable=import-outside-toplevel
    from tvm import relax  # pylint: disable=import-outside-toplevel

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def assert_library_correct(lib, x, expected):
    np.testing.assert_allclose(_vm_output(lib, x), expected, rtol=1e-4, atol=1e-5)


def _no_leftovers(folder):
    """No temporary library, signature or output file of ours is left in ``folder``."""
    return [f for f in os.listdir(folder) if ".tmp" in f]


def _synthetic_database(work_dir):
    """Records (untuned schedules) for every kernel of the tiny model, without any search."""
    # pylint: disable=import-outside-toplevel
    import tvm
    from tvm.relax.frontend.onnx import from_onnx
    import onnx

    from tvm_ollie.compat import meta_schedule
    from tvm_ollie.tune.metaschedule import Tuner, legalize_and_fuse

    ms = meta_schedule()
    mod = from_onnx(onnx.load(str(work_dir.parent / "tiny.onnx")), keep_params_in_input=False)
    tuner = Tuner("llvm", str(work_dir))
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    for task in tuner.tasks(legalize_and_fuse(mod, tuner.target)):
        kernel = task.dispatched[0]
        workload = db.commit_workload(kernel)
        db.commit_tuning_record(ms.database.TuningRecord(
            tvm.s_tir.Schedule(kernel).trace, workload, run_secs=[1e-4], target=tuner.target,
            args_info=ms.arg_info.ArgInfo.from_prim_func(kernel["main"])))
    (work_dir / workdir.MEASURE_FILE).write_text('{"a": 0.001, "b": 0.002}')


def _cut(path, keep_fraction):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep_fraction)])


CORRUPTIONS = {
    "workload-cut-short": lambda wd: _cut(wd / workdir.WORKLOAD_FILE, 0.5),
    "record-cut-short": lambda wd: _cut(wd / workdir.RECORD_FILE, 0.7),
    "garbage-bytes": lambda wd: (wd / workdir.RECORD_FILE).write_bytes(bytes(range(11, 256))),
    "empty-workload-file": lambda wd: (wd / workdir.WORKLOAD_FILE).write_bytes(b""),
    "measurements-cut-short": lambda wd: _cut(wd / workdir.MEASURE_FILE, 0.6),
}


# ---------------------------------------------------------------------------------------------
# A work dir cut short
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_compile_recovers_a_damaged_work_dir(model, capsys, caplog, damage):
    """What a crash or a full disk leaves: the compile warns once, builds, and is correct."""
    path, expected = model
    work_dir = path / f"wd-{damage}"
    shutil.rmtree(work_dir, ignore_errors=True)
    _synthetic_database(work_dir)
    CORRUPTIONS[damage](work_dir)
    out = f"{damage}.so"
    with caplog.at_level(logging.WARNING, logger="tvm_ollie"):
        proc = in_process(capsys, ["compile", "tiny.onnx", "-o", out, "--work-dir", work_dir,
                                   *FAST], path)  # fmt: skip
    ok(proc)
    warnings = [r.getMessage() for r in caplog.records if "cut short or corrupt" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert glob.glob(str(work_dir / "*.corrupt-*"))
    assert_library_correct(path / out, np.load(path / "x.npy"), expected)
    # what is left in the work dir loads as it is now
    from tvm_ollie.compat import meta_schedule  # pylint: disable=import-outside-toplevel

    meta_schedule().database.JSONDatabase(work_dir=str(work_dir))
    assert workdir.prepare_work_dir(str(work_dir)) == []


# ---------------------------------------------------------------------------------------------
# Bad input: one line, status 2, no traceback, no partial output
# ---------------------------------------------------------------------------------------------


def _onnx(path, nodes, inputs, outputs, initializers=()):
    import onnx  # pylint: disable=import-outside-toplevel
    from onnx import helper  # pylint: disable=import-outside-toplevel

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("damage, message", [
    ("cut", "cannot read ONNX file bad.onnx: Error parsing message"),
    ("noise", "cannot read ONNX file bad.onnx: Error parsing message"),
    ("empty", "cannot import ONNX file bad.onnx: Model IR version 0"),
])
def test_malformed_onnx_file(model, capsys, damage, message):
    path, _ = model
    data = (path / "tiny.onnx").read_bytes()
    content = {"cut": data[: len(data) // 2], "noise": np.random.default_rng(0).bytes(600),
               "empty": b""}[damage]  # fmt: skip
    (path / "bad.onnx").write_bytes(content)
    line = in_process_error(capsys, ["compile", "bad.onnx", "-o", "bad.so"], path)
    assert message in line
    assert not (path / "bad.so").exists() and not _no_leftovers(path)


def test_unsupported_operator_names_op_and_node(tmp_path, capsys):
    from onnx import TensorProto, helper  # pylint: disable=import-outside-toplevel

    _onnx(tmp_path / "odd.onnx",
          [helper.make_node("Relu", ["x"], ["r"], name="first"),
           helper.make_node("FancyOp", ["r"], ["y"], name="the_fancy_node")],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])  # fmt: skip
    line = in_process_error(capsys, ["compile", "odd.onnx"], tmp_path)
    assert "operator FancyOp (node 'the_fancy_node') is not supported" in line
    assert not (tmp_path / "odd.so").exists()


def test_operator_that_fails_to_convert_names_op_and_node(tmp_path, capsys):
    """A supported operator whose conversion fails (here: channels that do not match)."""
    from onnx import TensorProto, helper, numpy_helper  # pylint: disable=C0415

    w = np.zeros((4, 2, 3, 3), "float32")
    _onnx(tmp_path / "conv.onnx", [helper.make_node("Conv", ["x", "w"], ["y"], name="conv_a")],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", 6, 6])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
          [numpy_helper.from_array(w, "w")])  # fmt: skip
    line = in_process_error(capsys, ["compile", "conv.onnx", "--shape", "x=1,3,6,6"], tmp_path)
    assert "cannot import ONNX file conv.onnx (operator Conv, node 'conv_a'): The channel" in line
    assert not (tmp_path / "conv.so").exists() and not _no_leftovers(tmp_path)


@pytest.mark.parametrize("shape", ["x=1,2", "x=1,2,6,6,1"])
def test_shape_of_the_wrong_rank(model, capsys, shape):
    path, _ = model
    line = in_process_error(capsys, ["compile", "tiny.onnx", "--shape", shape, "-o", "r.so"],
                            path)  # fmt: skip
    assert f"--shape {shape} has" in line and "input x of tiny.onnx has 4" in line
    assert not (path / "r.so").exists()


def test_output_path_that_is_a_directory(model, capsys):
    path, _ = model
    (path / "outdir.so").mkdir(exist_ok=True)
    line = in_process_error(capsys, ["compile", "tiny.onnx", "-o", "outdir.so"], path)
    assert "cannot write outdir.so: it is a directory" in line


def test_output_path_not_writable(model, capsys):
    """Refused before anything is built (root may write anywhere but /proc)."""
    path, _ = model
    if os.geteuid() == 0:
        target = "/proc/ollie-test.so"
    else:
        locked = path / "locked"
        locked.mkdir(exist_ok=True)
        locked.chmod(0o500)
        target = str(locked / "x.so")
    line = in_process_error(capsys, ["compile", "tiny.onnx", "-o", target], path)
    assert f"cannot write {target}" in line
    assert not os.path.exists(target)


@pytest.fixture(scope="module")
def lib(model):
    """``tiny.onnx`` compiled (no tuning) in its folder, by ``main`` in this process: the tests
    that use it check ``run``'s errors (``test_cli.py`` compiles in a real process)."""
    path, _ = model
    old = os.getcwd()
    os.chdir(path)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            assert main(["compile", "tiny.onnx", "-o", "tiny.so", *FAST]) == 0
    finally:
        os.chdir(old)
    assert "wrote tiny.so" in out.getvalue()
    return path / "tiny.so"


def test_run_with_a_wrong_dtype(model, lib, capsys):
    path, _ = model
    np.save(path / "xc.npy", np.zeros(tiny_models.X_SHAPE, "complex64"))
    line = in_process_error(capsys, ["run", lib.name, "--input", "x=xc.npy"], path)
    assert "input 'x' has dtype complex64, the model expects float32" in line


def test_run_a_file_that_is_no_library(model, capsys):
    path, _ = model
    (path / "noise.so").write_bytes(np.random.default_rng(0).bytes(4096))
    line = in_process_error(capsys, ["run", "noise.so", "--random-inputs"], path)
    assert "noise.so is not a compiled library" in line


def test_run_output_not_writable(model, lib, capsys):
    path, _ = model
    line = in_process_error(capsys, ["run", lib.name, "--random-inputs", "--repeat", "0",
                                     "--output", "/proc/ollie-out.npz"], path)  # fmt: skip
    assert "cannot write /proc/ollie-out.npz" in line
    assert not _no_leftovers(path)


# ---------------------------------------------------------------------------------------------
# With tuning (real MetaSchedule trials, in subprocesses)
# ---------------------------------------------------------------------------------------------


def clean_exit(proc):
    """Exit 0 without a crash at interpreter exit (tvm-ffi teardown) or a traceback."""
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "Segmentation fault" not in proc.stderr and "Traceback" not in proc.stderr
    return proc.stdout


def _matmul_onnx(path):
    """``relu(x @ w)``, x: 2x8, w: 8x3 (kernels other than the conv model's)."""
    from onnx import TensorProto, helper, numpy_helper  # pylint: disable=C0415

    w = np.random.default_rng(5).uniform(-1, 1, (8, 3)).astype("float32")
    _onnx(path, [helper.make_node("MatMul", ["x", "w"], ["m"]),
                 helper.make_node("Relu", ["m"], ["y"])],
          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
          [numpy_helper.from_array(w, "w")])  # fmt: skip
    return w


@pytest.mark.tuning
def test_ctrl_c_during_tuning(model):
    """Ctrl-C (to the whole process group, as a terminal sends it) while MetaSchedule tunes:
    one line, status 130, no partial library; the next compile in that work dir succeeds."""
    path, expected = model
    work_dir = path / "wd-interrupted"
    shutil.rmtree(work_dir, ignore_errors=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tvm_ollie.cli", "compile", "tiny.onnx", "-o", "int.so",
         "--trials", "2", "--work-dir", str(work_dir), *FAST],
        cwd=path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        # MetaSchedule writes the workloads when it starts tuning them
        while not (work_dir / workdir.WORKLOAD_FILE).exists():
            assert proc.poll() is None and time.monotonic() < deadline, "tuning never started"
            time.sleep(0.2)
        time.sleep(2.0)
        assert proc.poll() is None, "tuning was over before Ctrl-C"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "tvm-ollie: interrupted", err
    assert not (path / "int.so").exists() and not _no_leftovers(path)
    again = cli("compile", "tiny.onnx", "-o", "int.so", "--trials", "1", "--work-dir", work_dir,
                *FAST, cwd=path)  # fmt: skip
    assert "wrote int.so" in clean_exit(again)
    assert_library_correct(path / "int.so", np.load(path / "x.npy"), expected)


@pytest.mark.tuning
def test_two_compiles_share_a_work_dir(model):
    """Started together on one work dir: one waits for the other, both libraries are right, and
    the database holds the kernels of both models."""
    path, expected = model
    work_dir = path / "wd-shared"
    shutil.rmtree(work_dir, ignore_errors=True)
    w = _matmul_onnx(path / "mm.onnx")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "tvm_ollie.cli", "compile", name, "-o", out, "--trials", "1",
         "--work-dir", str(work_dir), *FAST],
        cwd=path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) for name, out in (("tiny.onnx", "shared_conv.so"), ("mm.onnx", "shared_mm.so"))]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    for res in results:
        clean_exit(res)
    assert sum("waiting for another process" in r.stderr for r in results) == 1
    assert_library_correct(path / "shared_conv.so", np.load(path / "x.npy"), expected)
    x = np.random.default_rng(9).uniform(-1, 1, (2, 8)).astype("float32")
    np.testing.assert_allclose(_vm_output(path / "shared_mm.so", x), np.maximum(x @ w, 0),
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    from tvm_ollie.compat import meta_schedule  # pylint: disable=import-outside-toplevel

    db = meta_schedule().database.JSONDatabase(work_dir=str(work_dir))  # loads as it is
    names = {r.workload.mod.script() for r in db.get_all_tuning_records()}
    assert any("conv2d" in text for text in names) and any("matmul" in text for text in names)
    assert not glob.glob(str(work_dir / "*.corrupt-*"))


_API_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    import tiny_models
    from tvm_ollie.pipeline import build
    from tvm_ollie.tune import STATS

    ex, report = build(tiny_models.relax_module(), "llvm", trials=1, work_dir=sys.argv[1],
                       search_time_s=2.0)
    assert STATS.calls >= 1, "nothing was tuned"
    print("built", flush=True)
""")


@pytest.mark.tuning
def test_clean_exit_after_tuning_through_the_api(tmp_path):
    """``tvm_ollie.pipeline.build`` with trials, then an ordinary interpreter exit."""
    frontend_tests = os.path.join(os.path.dirname(__file__), "frontend")
    proc = subprocess.run(
        [sys.executable, "-c", _API_SCRIPT, str(tmp_path / "wd"), frontend_tests],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert "built" in clean_exit(proc)
