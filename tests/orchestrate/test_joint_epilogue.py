"""Joint selection with folded epilogues: a library alternative of a heavy call is also offered
with its bias/residual/activation consumers folded in (pipeline.joint.offer_folded), as the
sequential build folds them (transform.epilogue.fuse_epilogues)."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_ollie import native
from tvm_ollie.compat import relax, tvm
from tvm_ollie.orchestrate.cost import CostModel
from tvm_ollie.orchestrate.fission import fission
from tvm_ollie.orchestrate.graph import build_graph
from tvm_ollie.orchestrate.joint import AltInfo, Group, JointCost, find_groups, keep_alternatives
from tvm_ollie.orchestrate.pipeline import _drop_crossing, ollie_orchestration
from tvm_ollie.pipeline.joint import offer_alternatives, offer_folded
from tvm_ollie.transform.decide import MARGIN, Alternative, Choice

pytestmark = pytest.mark.skipif(not native.load(), reason="native library not loaded")

X, W = (1, 8, 8, 8), (8, 8, 3, 3)
BIAS = np.linspace(-1.0, 1.0, 8, dtype="float32").reshape(1, 8, 1, 1)


def _module(act: str = "relu", residual: bool = True, extra_reader: bool = False):
    """``act(conv(x, w) + bias [+ x])`` (``extra_reader``: the conv's result is also returned,
    so its consumers must not fold)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(X, "float32"))
    w = relax.Var("w", relax.TensorType(W, "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=(1, 1)), name_hint="y")
            z = bb.emit(relax.op.add(y, relax.const(BIAS)), name_hint="z")
            if residual:
                z = bb.emit(relax.op.add(z, x), name_hint="s")
            fn = {"relu": relax.op.nn.relu, "gelu": relax.op.nn.gelu}[act]
            r = bb.emit(fn(z), name_hint="r")
            out = bb.emit_output(relax.Tuple([r, y]) if extra_reader else r, name_hint="o")
        bb.emit_func_output(out)
    return bb.get()


class _NativeDecider:
    """Offers the original and the library kernel (the Decider's choice), timed as given."""

    def __init__(self, times=None, lib_s: float = 1e-6):
        self.times, self.lib_s = times, lib_s
        self.measures = times is not None

    def decide(self, call, budget_s=None):  # noqa: ARG002
        return Choice(None, ["x", "w"], "fake", 2e-5, 1e-5, impl="native")

    def alternatives(self, call, budget_s):  # noqa: ARG002
        return [Alternative(None, "tvm", 2e-5), Alternative(None, "native", self.lib_s)], 1, ""

    def check(self, call, alt):  # noqa: ARG002
        return True, ""

    def cost(self, call, alt):  # noqa: ARG002
        return self.times[alt.label]


class _LinearCost(CostModel):
    """``linear_s`` per TVM-built linear primitive, 1 us per other primitive, 2 us per kernel
    (library nodes are costed by their estimate in JointCost)."""

    name = "fake"

    def __init__(self, linear_s: float):
        self.linear_s = linear_s

    def kernel_seconds(self, graph, cand):
        return 2e-6 + sum(self.linear_s if graph.nodes[i].kind == "linear" else 1e-6
                          for i in cand.nodes)


def _offered(mod, decider=None):
    """What the joint build hands to the orchestration: alternatives, folded ones, fission."""
    mod, table, _ = offer_alternatives(mod, decider or _NativeDecider())
    mod = offer_folded(mod, table)
    with tvm.target.Target("llvm"):
        mod = keep_alternatives(lambda m: fission(m)[0])(mod)
    return mod, table


def _compile(mod, cost, decider=None):
    offered, table = _offered(mod, decider)
    reports: list = []
    ex = tvm.compile(offered, "llvm", relax_pipeline=ollie_orchestration(
        "llvm", cost=cost, reports=reports, joint=table))
    return ex, table, reports[-1]


def _check_numerics(ex, mod):
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal(s).astype("float32")) for s in (X, W)]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    want = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](*args).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_folded_alternative_follows_the_epilogue_guards():
    _, table = _offered(_module("relu"))
    labels = [a.label for a in table.alts["y"]]
    assert labels == ["original", "original [native]", "original [native] + bias+res+relu"]
    folded = table.alts["y"][2]
    assert (folded.base, folded.stands_for, folded.native) == (1, "r", True)
    assert folded.sequential  # the sequential build folds the Decider's choice
    # the conv's result is read twice: nothing folds, as in fuse_epilogues
    _, table = _offered(_module("relu", extra_reader=True))
    assert [a.label for a in table.alts["y"]] == ["original", "original [native]"]


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_selection_takes_the_folded_library_call(act):
    """The library conv is cheaper than TVM's: the folded call is chosen and is the only
    kernel (the epilogue no longer pays its own kernel); fission's split gelu folds too."""
    mod = _module(act)
    ex, table, report = _compile(mod, _LinearCost(1e-3))
    assert table.chosen["y"] == f"original [native] + bias+res+{act}"
    part = report.partitions[0]
    assert "(sequential)" in part.choices[0]
    kernels = [k.primitives for k in part.kernels if k.kinds != ["opaque"]]  # (o = r: glue)
    assert kernels == [["tvm_ollie.cpu.conv2d"]]
    _check_numerics(ex, mod)


def test_original_with_its_fused_epilogue_wins_when_cheaper():
    """TVM's conv fused with its epilogue (5.1 us) beats the library call (10 us)."""
    mod = _module("relu")
    ex, table, report = _compile(mod, _LinearCost(1e-7), _NativeDecider(lib_s=1e-5))
    assert table.chosen["y"] == "original"
    kernels = [k.primitives for k in report.partitions[0].kernels]
    assert not any("tvm_ollie.cpu.conv2d" in k for k in kernels)
    _check_numerics(ex, mod)


def test_folded_alternative_crossing_a_partition_is_dropped():
    infos = [AltInfo("original", 1.0), AltInfo("lib", 1.0, native=True),
             AltInfo("lib + bias", 1.0, native=True, base=1, stands_for="c")]

    def group():
        return Group("v", [[0], [1], [5]], [0, 1, 5], list(infos), ["v", "v", "c"],
                     [[], [], [2, 3]], [None, None, 1])

    g, dead = group(), []
    assert _drop_crossing([[0, 1, 2, 3, 5], [4]], [g], dead) == [[0, 1, 2, 3, 5], [4]]
    assert len(g.nodes) == 3 and not dead
    g, dead = group(), []
    assert _drop_crossing([[0, 1, 2, 5], [3, 4]], [g], dead) == [[0, 1, 2], [3, 4]]
    assert g.lasts == [0, 1] and dead == [5]
    assert g.covering(0) == [0, 1] and g.covering(3) == []


@pytest.mark.parametrize("t_lib, lib_cheaper", [(9.8e-6, False), (9.5e-6, True)])
def test_joint_cost_compares_measured_times_as_the_decider(t_lib, lib_cheaper):
    """Alone, each alternative costs its measured time plus MARGIN x the original's for a
    non-original one: the library (3% margin) is cheaper only when the Decider would take it;
    the folded call costs what the call it extends costs."""
    times = {"original": 1e-5, "original [native]": t_lib}
    mod, table = _offered(_module("relu"), _NativeDecider(times))
    with tvm.target.Target("llvm"):
        mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                        relax.transform.AnnotateTIROpPattern()])(mod)
    graph = build_graph(mod["main"].body.blocks[0], mod)
    (group,) = find_groups(graph, table)
    assert group.extends == [None, None, 1]
    cost = JointCost(_LinearCost(0.0), [group], graph, table.margin)

    def alone(k):
        return cost.correction[group.lasts[k]] + sum(
            cost._seconds(graph, _single(graph, i)) for i in group.nodes[k])  # noqa: SLF001

    diff = alone(1) - alone(0)
    assert diff == pytest.approx(t_lib - 1e-5 + MARGIN * 1e-5, abs=1e-12)
    assert (diff < 0) == lib_cheaper
    assert cost.correction[group.lasts[2]] == cost.correction[group.lasts[1]]


def _single(graph, i):
    from tvm_ollie.orchestrate.candidates import make_candidate  # pylint: disable=C0415

    return make_candidate(graph, 1 << i)


class _ScaledCost(CostModel):
    """A profiled model's two scales: a candidate holding a linear primitive costs
    ``single_s`` alone (as if measured) and ``fused_s`` fused with others (as if its estimate
    times a class ratio); ``analytic`` is the estimate both come from."""

    name = "scaled"

    def __init__(self, single_s: float, fused_s: float, analytic: CostModel):
        self.single_s, self.fused_s, self.analytic = single_s, fused_s, analytic

    def kernel_seconds(self, graph, cand):
        if any(graph.nodes[i].kind == "linear" for i in cand.nodes):
            return self.single_s if cand.size == 1 else self.fused_s
        return 2e-6


def test_measured_alternatives_compare_on_one_scale():
    """The Decider measured the library call 100x faster than TVM's conv; the inner model
    prices TVM's conv alone at its measured 1 ms but fused with its epilogue at 10 us (a
    scaled estimate). The corrections come from the singletons, so the fused candidate must
    be priced on their scale (the analytic one) or the original wins by the scale's error."""
    times = {"original": 1e-3, "original [native]": 1e-5}
    cost = _ScaledCost(1e-3, 1e-5, _LinearCost(1e-3))
    _, table, report = _compile(_module("relu"), cost, _NativeDecider(times))
    assert table.chosen["y"].startswith("original [native]")
    assert "(sequential" in report.partitions[0].choices[0]
