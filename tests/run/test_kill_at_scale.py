"""The kill test at scale (benchmarks/kill_test.py): a small default-model run SIGKILLed 20 times at random
moments (while loading, mid-step, while a checkpoint is written, around an evaluation, as a run started
through the MCP server), resumed each time, ends bit for bit as the run nobody interrupted: weights,
optimiser state, metrics, samples, completions, final metrics."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from kill_test import run  # noqa: E402


@pytest.mark.slow
def test_twenty_kills_at_random_moments_then_resume_is_the_uninterrupted_run_bit_for_bit(tmp_path):
    code = run(kills=20, steps=10, seed=1, keep=tmp_path / "kills", json_path=tmp_path / "kills.json")
    result = json.loads((tmp_path / "kills.json").read_text())
    assert result["differences"] == [] and result["kills"] == 20, result
    assert all(result["moments"][m] >= 3 for m in ("load", "step", "checkpoint", "evaluation", "mcp"))
    assert code == 0
