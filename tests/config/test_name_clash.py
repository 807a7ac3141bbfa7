"""PyPI's mlx-guided-grpo installs the same import name and command as ours: detected, never silent."""

from __future__ import annotations

import sys

import pytest

from mlx_grpo.cli import main
from mlx_grpo.config.name_clash import clashing_packages


@pytest.fixture
def other_package_installed(tmp_path, monkeypatch):
    info = tmp_path / "mlx_guided_grpo-2.1.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlx-guided-grpo\nVersion: 2.1.1\n")
    (info / "entry_points.txt").write_text("[console_scripts]\nmlx-grpo = mlx_grpo.cli:main\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])


def test_nothing_is_reported_without_the_other_package():
    assert clashing_packages() == []


def test_the_other_package_is_named_by_every_command_and_by_doctor(other_package_installed, capsys):
    assert clashing_packages() == ["mlx-guided-grpo 2.1.1"]
    assert main(["metrics", "policy/kl"]) == 0
    err = capsys.readouterr().err
    assert "mlx-guided-grpo 2.1.1 is also installed" in err and "pip uninstall mlx-guided-grpo" in err
    from mlx_grpo.commands.doctor import diagnose

    rows, fixes = diagnose(None)
    assert ("name clash", "mlx-guided-grpo 2.1.1") in rows
    assert any("same import name (mlx_grpo) and command (mlx-grpo)" in fix for fix in fixes)
