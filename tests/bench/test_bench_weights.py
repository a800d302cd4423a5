"""``--weights constants``: every TVM-based system gets the weights bound as constants, as a TVM
user importing a model normally does (the default); ``params`` keeps them runtime parameters."""

import pytest

pytest.importorskip("torch")

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_ollie.bench import __main__ as cli  # noqa: E402
from tvm_ollie.bench.harness import run_bench  # noqa: E402
from tvm_ollie.bench.roofline import count_module  # noqa: E402
from tvm_ollie.bench.systems import BenchContext  # noqa: E402
from tvm_ollie.models import get_model, to_relax  # noqa: E402


def _constant_elements(mod) -> int:
    """Elements of the distinct non-scalar constants of ``main``."""
    found = {}

    def visit(e):
        if isinstance(e, tvm.ir.expr.GenericConst) and e.value.numpy().size > 1:
            found[hash(e)] = e.value.numpy().size

    relax.analysis.post_order_visit(mod["main"], visit)
    return sum(found.values())


def test_weights_bound_as_constants_or_parameters(tmp_path):
    spec = get_model("infogan", quick=True)
    mod_p, params = to_relax(spec)
    ctx = BenchContext(work_dir=str(tmp_path), weights="constants")
    mod_c, none, _ = ctx.relax_module(spec)
    n_in = len(spec.example_inputs)
    assert params and none == []
    assert len(mod_p["main"].params) == n_in + len(params)
    assert len(mod_c["main"].params) == n_in
    weights = sum(p.numpy().size for p in params)
    assert _constant_elements(mod_c) >= weights + _constant_elements(mod_p)
    # the roofline's compulsory bytes count bound weights as they count weight parameters
    cp, cc = count_module(mod_p), count_module(mod_c)
    assert cc.bytes_min == pytest.approx(cp.bytes_min, rel=1e-3) and cc.flops == cp.flops
    # tuning records of the two modules stay apart
    assert ctx.model_dir(spec, "tvm") != BenchContext(work_dir=str(tmp_path)).model_dir(
        spec, "tvm")
    with pytest.raises(ValueError):
        to_relax(spec, weights="bogus")
    with pytest.raises(ValueError):
        BenchContext(weights="bogus")


@pytest.mark.slow
def test_tvm_with_constant_weights_agrees_through_the_harness(tmp_path):
    results = run_bench(models=["infogan"], quick=True, systems=["tvm", "torch"],
                        reference="tvm", out_dir=str(tmp_path), time_budget_s=0.05, plot=False,
                        log=lambda _: None, weights="constants", mode="interleaved")  # fmt: skip
    assert results["config"]["weights"] == "constants"
    systems = results["models"]["infogan"]["systems"]
    assert systems["tvm"]["status"] == "ok", systems["tvm"]
    assert systems["tvm"]["rel_err"] < 1e-4
    assert "weights as constants" in (tmp_path / "results.md").read_text()


def test_cli_weights_option():
    parser = cli.build_parser()
    assert parser.parse_args([]).weights == "constants"
    assert parser.parse_args(["--weights", "params"]).weights == "params"
    with pytest.raises(SystemExit):
        parser.parse_args(["--weights", "bogus"])

