"""``tvm-ollie bundle``: its user errors and the model list (no build)."""

from __future__ import annotations

from tvm_ollie.cli import main


def test_list_models(capsys):
    assert main(["bundle", "--list-models"]) == 0
    names = capsys.readouterr().out.split()
    assert names[-2:] == ["conv3x3_512", "convtranspose"] and "resnet18" in names


def test_user_errors(capsys, tmp_path):
    assert main(["bundle", "--target", "cuda"]) == 2
    assert "--out DIR is required" in capsys.readouterr().err
    assert main(["bundle", "--out", str(tmp_path / "b"), "--models", "nosuch"]) == 2
    assert "unknown models ['nosuch']" in capsys.readouterr().err
    assert main(["bundle", "--out", str(tmp_path / "b"), "--trials", "8"]) == 2
    assert "--trials needs --work-dir" in capsys.readouterr().err
