"""The quick suite: every model at quick size, every baseline, outputs agree (slow)."""

import pytest

pytest.importorskip("torch")

from tvm_ollie.bench.harness import DEFAULT_SYSTEMS, run_bench  # noqa: E402
from tvm_ollie.models import list_models  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_every_system_agrees_on_quick_model(name, tmp_path):
    results = run_bench(models=[name], quick=True, systems=DEFAULT_SYSTEMS, out_dir=str(tmp_path),
                        time_budget_s=0.1, plot=False, log=lambda _: None)  # fmt: skip
    for system, result in results["models"][name]["systems"].items():
        assert result["status"] in ("ok", "skipped"), (system, result)
        if result["status"] == "ok":
            assert result["median_s"] > 0
