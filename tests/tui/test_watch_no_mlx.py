"""The dashboard must work where mlx is not installed: nothing it loads may import mlx."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
from mlx_grpo.cli import build_parser
build_parser()  # imports every subcommand's argument module, as `mlx-grpo watch` does
import mlx_grpo.commands.watch, mlx_grpo.tui.app, mlx_grpo.tui.board
import mlx_grpo.telemetry.rundir.reader, mlx_grpo.telemetry.rundir.history_loader
loaded = sorted(m for m in sys.modules if m == "mlx" or m.startswith("mlx.") or m.startswith("mlx_lm"))
assert not loaded, loaded
print("ok")
"""


def test_watch_command_and_dashboard_do_not_import_mlx():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_watch_runs_where_mlx_cannot_be_imported(tmp_path):
    # A fake `mlx` package that fails on import stands in for a machine without mlx.
    fake = tmp_path / "shadow" / "mlx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('mlx is not installed here')\n")
    code = ("import sys; sys.path.insert(0, %r); from mlx_grpo.cli import main; "
            "sys.exit(main(['watch', '--help']))" % str(fake.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "RUN_DIR" in out.stdout
