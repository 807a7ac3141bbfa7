"""docs/MONITORING_API.md's example runs as written and leaves a run directory the report reads."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "MONITORING_API.md"


def test_the_documented_loop_runs_and_its_run_directory_reports(tmp_path):
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    (tmp_path / "loop.py").write_text(code)
    result = subprocess.run([sys.executable, "loop.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "reward functions' quality" in result.stdout and "hacking:" in result.stdout
    run_dir = tmp_path / "runs" / "my-loop"
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 60
    assert any((run_dir / "tensorboard").iterdir())
    report = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "report", str(run_dir), "--no-write"],
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0 and "training accuracy" in report.stdout
