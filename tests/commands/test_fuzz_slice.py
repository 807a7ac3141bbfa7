"""A fast slice of benchmarks/fuzz_readers.py in the default suite: mutated run directories, GGUF headers,
configs and alert files through every reader and the MCP read tools; no traceback, hang or silent wrong
result. The full run (2,400 cases) and its figures: docs/RELIABILITY.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from fuzz_readers import fuzz  # noqa: E402
from synthetic_runs import simulate, write_run_dir  # noqa: E402


@pytest.mark.slow  # 60 forked cases: minutes on a loaded 2-core machine, not yet timed idle
@pytest.mark.parametrize("seed", [1])
def test_a_slice_of_the_fuzz_finds_nothing(tmp_path, seed):
    metrics, samples = simulate(steps=12, seed=seed)[:2]
    base = write_run_dir(tmp_path / "base", metrics, samples)
    result = fuzz(60, seed, base=base, keep=tmp_path / "fuzz", share=(12 / 60, 30 / 60))
    assert result["findings"] == [], result["findings"][:5]
    assert result["families"] == {"run directory": 12, "GGUF header": 30, "config": 18}
    assert result["totals"].get("refused", 0) > 0 and result["totals"].get("ok", 0) > 0  # both kinds occur
