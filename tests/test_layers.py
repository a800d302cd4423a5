"""The floors of DESIGN.md's layout hold: no module imports from a floor above its own, and
transform/ and orchestrate/ (side by side on floor 6) never import each other.

The scan and the one table of floors are in ``tests/import_graph.py`` (``python
tests/import_graph.py`` prints the graph by floor); it reads the sources with :mod:`ast`, so
top-level imports, imports inside functions and relative imports all count.
"""

from __future__ import annotations

import import_graph as ig


def test_every_module_has_a_floor():
    missing = []
    for module in ig.modules():
        try:
            ig.floor(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"modules without a floor (add them to FLOORS): {missing}"


def test_no_import_goes_up_a_floor_or_across_transform_and_orchestrate():
    edges, _ = ig.scan()
    bad = ig.offending(edges)
    assert not bad, "imports against the floors:\n" + "\n".join(f"  {e}" for e in bad)


def test_the_scan_sees_every_kind_of_import(tmp_path, monkeypatch):
    """A fake package: an upward import inside a function, a relative one at the top level and
    a transform -> orchestrate one are all reported."""
    pkg = tmp_path / "tvm_ollie"
    for sub in ("tune", "transform", "orchestrate", "pipeline"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "tune" / "measure.py").write_text(
        "def f():\n    from ..pipeline import build\n    return build\n")
    (pkg / "transform" / "build.py").write_text("from ..orchestrate import joint\n")
    (pkg / "orchestrate" / "joint.py").write_text("from .. import tune\n")
    (pkg / "pipeline" / "build.py").write_text("from ..transform import build\n")
    monkeypatch.setattr(ig, "ROOT", pkg)
    edges, deferred = ig.scan()
    bad = {(e.src, e.dst, e.deferred) for e in ig.offending(edges)}
    assert bad == {("tvm_ollie.tune.measure", "tvm_ollie.pipeline.build", True),
                   ("tvm_ollie.transform.build", "tvm_ollie.orchestrate.joint", False)}
    assert deferred["tvm_ollie.tune.measure"] == 1
