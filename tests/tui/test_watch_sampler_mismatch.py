"""The dashboard's policy view shows how far the update's log-probs are from the sampler's: a tile with the last
sampling/logp_diff/max and a chart of its mean and max."""

from __future__ import annotations

import pytest
from run_writer import RunWriter, metric_record
from screen_text import settle

from mlx_grpo.tui.app import WatchApp
from mlx_grpo.tui.chart import MetricChart
from mlx_grpo.tui.tile import MetricTile

pytestmark = pytest.mark.anyio


async def test_the_policy_view_has_a_tile_and_a_chart_of_the_sampler_mismatch(tmp_path):
    run = RunWriter(tmp_path / "run", total_steps=20)
    run.start()
    for step in range(1, 6):
        run.append("metrics.jsonl", {**metric_record(step, run.time_of(step)),
                                     "sampling/logp_diff/mean": 1e-7 * step, "sampling/logp_diff/max": 2e-6 * step})
    app = WatchApp([run.run_dir], refresh=3600, clock=lambda: run.time_of(5) + 1.0)
    async with app.run_test(size=(140, 45)) as pilot:
        await settle(pilot, keys=["2"])
        view = app.active_view()
        tile = next((t for t in view.query(MetricTile) if t.metric == "sampling/logp_diff/max"), None)
        assert tile is not None and tile.border_title == "sampler logp diff"
        assert tile._shown.split()[0] == "1e-05"  # step 5's max
        chart = next((c for c in view.query(MetricChart) if c.chart_title == "sampler vs update log-probs"), None)
        assert chart is not None
        assert [(label, value) for label, _, value in chart.legend] == [("mean", pytest.approx(5e-7)),
                                                                        ("max", pytest.approx(1e-5))]
