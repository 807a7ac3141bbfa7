"""A slice of benchmarks/fuzz_readers.py (slow-marked: `pytest -m slow`): mutated run directories, GGUF headers,
configs and alert files through every reader and the MCP read tools; no traceback, hang or silent wrong
result. The full run (2,400 cases) and its figures: docs/RELIABILITY.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_runs import simulate, write_run_dir

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz_readers.py"


@pytest.mark.slow  # 60 forked cases: minutes on a loaded 2-core machine
@pytest.mark.parametrize("seed", [1])
def test_a_slice_of_the_fuzz_finds_nothing(tmp_path, seed):
    # In a fresh process: the script forks a child per case, and a fork of a process that has evaluated
    # anything with MLX (this test worker has) would wait forever on its first evaluation.
    metrics, samples = simulate(steps=12, seed=seed)[:2]
    base = write_run_dir(tmp_path / "base", metrics, samples)
    done = subprocess.run([sys.executable, str(SCRIPT), "--cases", "60", "--seed", str(seed), "--base", str(base),
                           "--keep", str(tmp_path / "fuzz"), "--share", str(12 / 60), str(30 / 60),
                           "--json", str(tmp_path / "fuzz.json")], capture_output=True, text=True, timeout=1800)
    result = json.loads((tmp_path / "fuzz.json").read_text())
    assert done.returncode == 0 and result["findings"] == [], (done.stderr[-2000:], result["findings"][:5])
    assert result["families"] == {"run directory": 12, "GGUF header": 30, "config": 18}
    assert result["totals"].get("refused", 0) > 0 and result["totals"].get("ok", 0) > 0  # both kinds occur
