"""OllieConfig: defaults in one place, overrides, validation, and every entry point passing it."""

import importlib
import inspect
import types

import pytest
import tvm
from tvm import relax

from tvm_ollie import cli, demo
from tvm_ollie.config import DEFAULTS, ConfigError, OllieConfig, config_scope, current_config, \
    resolve_config
from tvm_ollie.codegen.builder import single_function_module, tensor_var
from tvm_ollie.config import OrchestrateConfig
from tvm_ollie.transform import decide, optimize
from tvm_ollie.transform.report import OptimizeReport
from tvm_ollie.tune.calibrate import EFFICIENCY, Calibration

build_mod = importlib.import_module("tvm_ollie.pipeline.build")
joint_plans = importlib.import_module("tvm_ollie.pipeline.joint_plans")

#: A fixed calibration (deciders built here measure nothing).
LLVM_CALIB = Calibration("llvm", 1e11, 2e10, dict(EFFICIENCY["cuda"]), "given")


def _tiny():
    return single_function_module([tensor_var("x", (2, 3))],
                                  lambda bb, x: relax.op.add(x, x))


#: Every entry point that takes the options: ``config=`` and keyword overrides of its fields.
ENTRY_POINTS = {
    "optimize_module": lambda **kw: optimize.optimize_module(_tiny(), **kw),
    "OllieOptimize": lambda **kw: optimize.OllieOptimize(**kw),
    "Decider": lambda **kw: decide.Decider("llvm", **kw),
    "build": lambda **kw: build_mod.build(_tiny(), "llvm", **kw),
    "ollie_pipeline": lambda **kw: build_mod.ollie_pipeline(**kw),
    "joint_build": lambda **kw: joint_plans.joint_build(_tiny(), "llvm", **kw),
    "run_demo": lambda **kw: demo.run_demo(**kw),
}


def test_defaults_live_in_one_place():
    """The command line takes its defaults from DEFAULTS; no entry point restates a config
    field as a parameter (each takes ``config=`` and the fields as ``**options``), so that a
    new field needs no edit in their signatures."""
    assert DEFAULTS == OllieConfig() and current_config() is DEFAULTS
    args = cli.build_parser().parse_args(["explain", "m.onnx"])
    assert (args.trials, args.max_depth, args.search_time) == \
        (DEFAULTS.trials, DEFAULTS.max_depth, DEFAULTS.search_time_s)
    fields = set(OllieConfig.__dataclass_fields__) - {"target"}
    torch_entry = importlib.import_module("tvm_ollie.frontend.torch_entry")
    for func in (optimize.optimize_module, optimize.OllieOptimize, decide.Decider,
                 build_mod.build, build_mod.ollie_pipeline, joint_plans.joint_build,
                 demo.run_demo, torch_entry.compile_torch):
        params = inspect.signature(func).parameters
        assert not fields & set(params), (func, fields & set(params))
        assert "config" in params, func
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), func


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_entry_points_reject_an_unknown_option(entry):
    with pytest.raises(ConfigError, match="unknown OllieConfig option 'depth'"):
        ENTRY_POINTS[entry](config=OllieConfig(max_depth=2), depth=3)


def test_entry_point_overrides_win_over_the_config(monkeypatch):
    """``optimize_module``, ``Decider`` and ``joint_build``: a keyword beats ``config``."""
    seen = []
    monkeypatch.setattr(optimize, "_optimize", lambda mod, cfg, tgt, budget, **hooks:
                        seen.append(cfg) or (mod, OptimizeReport()))
    optimize.optimize_module(_tiny(), "llvm", config=OllieConfig(max_depth=2), max_depth=4)
    assert seen[-1].max_depth == 4 and seen[-1].target == "llvm"

    class Stop(Exception):
        pass

    def stop(mod, cfg, budget, hooks):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(joint_plans, "_rewrite_regions", stop)
    with pytest.raises(Stop):
        joint_plans.joint_build(_tiny(), "llvm", config=OllieConfig(region_calls=2),
                                region_calls=3, trials=4)
    assert seen[-1].region_calls == 3 and seen[-1].trials == 0  # not tuned: no budget given
    dec = decide.Decider("llvm", OllieConfig(max_measured=1, search_time_s=5.0),
                         max_measured=2, calibration=LLVM_CALIB, library=False)
    assert (dec.max_measured, dec.search_time_s, dec.library) == (2, 5.0, False)


def test_former_option_names_warn_and_still_work(monkeypatch, capsys):
    """``time_budget_s=`` / ``search_budget_s=`` and ``--time-budget``: the former names of
    ``search_time_s`` and ``--search-time``, accepted with a DeprecationWarning."""
    with pytest.warns(DeprecationWarning, match="time_budget_s= is deprecated"):
        assert resolve_config(time_budget_s=2.5).search_time_s == 2.5  # former name
    with pytest.warns(DeprecationWarning, match="search_budget_s= is deprecated"):
        dec = decide.Decider("llvm", calibration=LLVM_CALIB, library=False,
                             search_budget_s=3.0)  # former name
    assert dec.search_time_s == 3.0
    with pytest.warns(DeprecationWarning, match="time_budget_s= is deprecated"):
        pipe = optimize.OllieOptimize(time_budget_s=1.5)  # former name
        assert resolve_config(pipe.config, **pipe.overrides).search_time_s == 1.5
    seen = {}
    monkeypatch.setattr(cli, "_load", lambda args: _tiny())
    monkeypatch.setattr(cli, "_transform", lambda: types.SimpleNamespace(
        optimize_module=lambda mod, config=None: seen.update(cfg=config) or
        (mod, OptimizeReport())))
    with pytest.warns(DeprecationWarning, match="--time-budget is deprecated"):
        assert cli.main(["explain", "m.onnx", "--time-budget", "1.5"]) == 0  # former name
    assert seen["cfg"].search_time_s == 1.5
    assert "--time-budget is deprecated; use --search-time" in capsys.readouterr().err
    assert "--time-budget" not in cli.build_parser().format_help()  # (former name: hidden)


def test_replace_from_dict_and_overrides():
    cfg = OllieConfig(trials=8, max_depth=3)
    assert cfg.replace(max_depth=5) == OllieConfig(trials=8, max_depth=5)
    assert cfg.max_depth == 3  # frozen: replace returns a copy
    with pytest.raises(Exception):
        cfg.trials = 1  # pylint: disable=assigning-non-slot
    got = OllieConfig.from_dict({"ollie.max_depth": 2, "targets": ["relax.matmul"],
                                 "orchestration": {"max_kernel_size": 4}})
    assert got.max_depth == 2 and got.targets == ("relax.matmul",)
    assert got.orchestration == OrchestrateConfig(max_kernel_size=4)
    assert got.orchestrate_config().max_kernel_size == 4
    assert DEFAULTS.orchestrate_config() == OrchestrateConfig()
    # keywords override the config when given; None means "from the config"
    merged = resolve_config(cfg, max_depth=None, search_time_s=2.5, library=False)
    assert (merged.max_depth, merged.search_time_s, merged.library) == (3, 2.5, False)
    assert resolve_config({"trials": 2}).trials == 2


@pytest.mark.parametrize("changes, message", [
    (dict(trials=-1), "OllieConfig.trials must be an int >= 0, not -1"),
    (dict(max_depth=1.5), "OllieConfig.max_depth must be an int >= 0"),
    (dict(search_time_s=0), "OllieConfig.search_time_s must be a number > 0"),
    (dict(max_states=0), "OllieConfig.max_states must be an int >= 1 or None"),
    (dict(region_calls=0), "OllieConfig.region_calls must be an int >= 1"),
    (dict(derive="yes"), "OllieConfig.derive must be True or False"),
    (dict(library=1.0), "OllieConfig.library must be None, True or False"),
    (dict(depth=3), "unknown OllieConfig option 'depth'"),
])
def test_validation_errors_are_one_line(changes, message):
    with pytest.raises(ConfigError) as err:
        DEFAULTS.replace(**changes)
    assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError):
        OllieConfig.from_dict(changes)


def test_pass_context_rejects_ollie_keys():
    """Why config_scope exists: TVM 0.27 rejects unregistered PassContext keys, and Python
    cannot register one (if this starts passing, PassContext can carry the config)."""
    with pytest.raises(AttributeError, match="Invalid config option 'ollie.max_depth'"):
        with tvm.transform.PassContext(config={"ollie.max_depth": 3}):
            pass


def test_config_scope_nests():
    with config_scope(OllieConfig(max_depth=2)) as outer:
        assert current_config() is outer
        with config_scope(trials=4) as inner:
            assert (inner.max_depth, inner.trials) == (2, 4)
            assert resolve_config(max_depth=1).max_depth == 1
        assert current_config() is outer
    assert current_config() is DEFAULTS


@pytest.fixture
def fake_pass(monkeypatch):
    """optimize_module inside the pass records its config and changes nothing."""
    seen = []

    def fake(mod, config=None, **hooks):
        seen.append((config, hooks))
        return mod, OptimizeReport()

    monkeypatch.setattr(optimize, "optimize_module", fake)
    return seen


def test_pipeline_and_pass_read_the_config(fake_pass):
    mod = _tiny()
    cfg = OllieConfig(max_depth=2, trials=0, library=False)
    tvm.compile(mod, "llvm", relax_pipeline=relax.get_pipeline("ollie", config=cfg,
                                                                 search_time_s=3.0))
    got, _ = fake_pass[-1]
    assert (got.max_depth, got.search_time_s, got.library) == (2, 3.0, False)
    assert got.target.kind.name == "llvm"
    with config_scope(OllieConfig(max_depth=4, max_states=50)):
        tvm.compile(mod, "llvm", relax_pipeline="ollie")
        optimize.OllieOptimize(max_depth=1)(mod)
    assert (fake_pass[-2][0].max_depth, fake_pass[-2][0].max_states) == (4, 50)
    assert (fake_pass[-1][0].max_depth, fake_pass[-1][0].max_states) == (1, 50)
    with pytest.raises(ConfigError, match="max_depth"):
        optimize.OllieOptimize(max_depth=-2)
    with pytest.raises(ConfigError, match="trials"):
        relax.get_pipeline("ollie", trials=-1)


def test_build_passes_config_and_one_budget(monkeypatch):
    seen = {}

    def fake_optimize(mod, config=None, budget=None, **hooks):
        seen.update(config=config, budget=budget, hooks=hooks)
        return mod, OptimizeReport()

    def fake_compile(mod, target, tuner, trials, orchestrate, orchestrate_config=None):
        seen.update(trials=trials, orchestrate=orchestrate, orch=orchestrate_config)
        return "EX"

    monkeypatch.setattr(build_mod, "optimize_module", fake_optimize)
    monkeypatch.setattr(build_mod, "compile_module", fake_compile)
    orch = OrchestrateConfig(max_kernel_size=3)
    cfg = OllieConfig(max_depth=2, orchestrate=True, orchestration=orch)
    chooser = lambda sig, alts: None  # noqa: E731
    ex, report = build_mod.build(_tiny(), "llvm", config=cfg, max_states=10, chooser=chooser)
    assert ex == "EX" and seen["hooks"] == {"chooser": chooser}
    got = seen["config"]
    assert (got.max_depth, got.max_states, got.orchestrate) == (2, 10, True)
    assert got.target.kind.name == "llvm"
    assert seen["orch"] is orch and seen["orchestrate"] is True
    assert report.budget is seen["budget"] and report.trials_budget == 0 and seen["trials"] == 0


def test_cli_flags_build_one_config(monkeypatch, capsys):
    seen = {}

    def fake_optimize(mod, config=None):
        seen["config"] = config
        return mod, OptimizeReport()

    monkeypatch.setattr(cli, "_load", lambda args: _tiny())
    monkeypatch.setattr(cli, "_transform",
                        lambda: types.SimpleNamespace(optimize_module=fake_optimize))
    assert cli.main(["explain", "m.onnx", "--trials", "3", "--max-depth", "2",
                     "--search-time", "1.5", "--max-states", "40", "--no-library"]) == 0
    cfg = seen["config"]
    assert isinstance(cfg, OllieConfig)
    assert (cfg.trials, cfg.max_depth, cfg.search_time_s, cfg.max_states, cfg.library) == \
        (3, 2, 1.5, 40, False)
    assert cfg.target.kind.name == "llvm"
    assert cli.main(["explain", "m.onnx", "--max-states", "0"]) == cli.EXIT_USER_ERROR
    assert "--max-states must be >= 1" in capsys.readouterr().err



def test_no_library_turns_the_cached_memory_off():
    """The planned memory is cached per VM by default, through a builtin of the native library;
    library=False promises an executable without that library, so it turns the cache off."""
    assert OllieConfig().cached_alloc and OllieConfig(library=True).cached_alloc
    assert not OllieConfig(library=False).cached_alloc
    assert not OllieConfig(library=False, cached_alloc=True).cached_alloc
    assert not OllieConfig().replace(library=False).cached_alloc
    assert not OllieConfig(cached_alloc=False).cached_alloc

def test_orchestrate_config_lives_in_config():
    """``OrchestrateConfig`` is defined in ``tvm_ollie.config`` (floor 0) and still importable
    from ``tvm_ollie.orchestrate``; ``OllieConfig.orchestration`` holds one."""
    from tvm_ollie import orchestrate  # pylint: disable=import-outside-toplevel

    assert orchestrate.OrchestrateConfig is OrchestrateConfig
    assert OllieConfig.__dataclass_fields__["orchestration"].type == \
        "Optional[OrchestrateConfig]"
    cfg = OllieConfig.from_dict({"orchestration": {"max_kernel_size": 3}})
    assert cfg.orchestrate_config() == OrchestrateConfig(max_kernel_size=3)
    assert OllieConfig().orchestrate_config() == OrchestrateConfig()


def test_transform_build_is_a_deprecated_alias():
    """``tvm_ollie.transform.build`` & co. moved to ``tvm_ollie.pipeline``: the old names still
    work for one release, with a DeprecationWarning, and ``"ollie"`` is registered."""
    import tvm_ollie  # pylint: disable=import-outside-toplevel
    from tvm_ollie import pipeline  # pylint: disable=import-outside-toplevel

    assert tvm_ollie.build is pipeline.build
    for name in ("build", "cuda_source", "ollie_pipeline", "PIPELINE_NAME"):
        with pytest.warns(DeprecationWarning, match=f"tvm_ollie.pipeline.{name}"):
            assert getattr(tvm_ollie.transform, name) is getattr(pipeline, name)
    assert importlib.import_module("tvm_ollie.transform.build") is build_mod
    assert pipeline.PIPELINE_NAME in relax.pipeline.PIPELINE_MAP
