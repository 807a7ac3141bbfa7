"""`mlx-grpo compare A B --diverge`: the first step two runs part beyond their noise, and which metric first."""

from __future__ import annotations

import pytest
from synthetic_runs import Faults, simulate, write_run_dir

from mlx_grpo.cli import main
from mlx_grpo.telemetry.analysis.divergence import divergence


@pytest.mark.parametrize("faults, metric", [
    (Faults(fault_step=50, entropy_collapse=True), "policy/entropy"),
    (Faults(fault_step=50, kl_blowup=True), "policy/kl"),
    (Faults(fault_step=50, collapse=True), "rewards/format_exact/mean"),
])
def test_the_metric_that_moved_first_and_its_step(faults, metric):
    a, b = simulate(100, 0)[0], simulate(100, 0, faults)[0]  # the same run until step 50
    first = divergence(a, b)[0]
    assert first.metric == metric and 50 <= first.step <= 57


def test_two_healthy_seeds_do_not_part():
    for seed in (0, 2, 4, 6):
        assert divergence(simulate(100, seed)[0], simulate(100, seed + 1)[0]) == []


def test_the_command(tmp_path, capsys):
    a = write_run_dir(tmp_path / "a", *simulate(100, 0), name="a")
    b = write_run_dir(tmp_path / "b", *simulate(100, 0, Faults(fault_step=50, entropy_collapse=True)), name="b")
    assert main(["compare", str(a), str(b), "--diverge"]) == 0
    assert capsys.readouterr().out.startswith("a and b part at step 51: policy/entropy moved first")
    assert main(["compare", str(a), str(b), str(a), "--diverge"]) != 0
    assert "--diverge compares exactly two runs; got 3" in capsys.readouterr().err
