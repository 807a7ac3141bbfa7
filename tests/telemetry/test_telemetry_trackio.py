"""Trackio as a third sink: local and offline, and never able to stop or slow a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from run_writer import start_sinks

from mlx_grpo.config.train_config import load_config
from mlx_grpo.telemetry.events import Scalars
from mlx_grpo.telemetry.sinks import make_sinks
from mlx_grpo.telemetry.sinks.trackio import TrackioOptions


def test_report_to_turns_each_of_the_three_trackers_on():
    config = load_config(None, {"report_to": ["tensorboard", "wandb", "trackio"]})
    assert (config.tensorboard, config.wandb, config.trackio) == (True, True, True)
    config = load_config(None, {"report_to": "trackio"})
    assert (config.tensorboard, config.wandb, config.trackio) == (False, False, True)


def test_a_two_step_run_reaches_trackio_s_local_store(tmp_path):
    pytest.importorskip("trackio")
    (tmp_path / "run.yaml").write_text(textwrap.dedent("""\
        num_steps: 2
        batch_size: 2
        num_generations: 2
        max_generation_steps: 4
        train_size: 64
        eval_every: 0
        run_name: tracked
        report_to: [trackio]
        learning_rate: 0.0001
        """))
    store = tmp_path / "trackio_home"
    # Trackio reads TRACKIO_DIR once, when imported: a new process per look. A Space named in the
    # environment is not used: the sink stays local.
    env = {**os.environ, "TRACKIO_DIR": str(store), "TRACKIO_SPACE_ID": "nobody/never-used",
           "WANDB_MODE": "disabled"}
    run = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "run.yaml"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"trackio: run tracked of project mlx-grpo, stored offline in {store}" in run.stdout
    assert "* Trackio" not in run.stdout + run.stderr  # trackio's own console lines are held back
    read = subprocess.run([sys.executable, "-c", textwrap.dedent("""\
        import json
        from trackio import Api
        from trackio.sqlite_storage import SQLiteStorage
        (run,) = Api().runs("mlx-grpo")
        print(json.dumps({"name": run.name, "config": run.config,
                          "logs": SQLiteStorage.get_logs("mlx-grpo", "tracked")}))
        """)], capture_output=True, text=True, env=env, timeout=120)
    assert read.returncode == 0, read.stderr
    stored = json.loads(read.stdout.strip().splitlines()[-1])
    assert stored["name"] == "tracked" and stored["config"]["learning_rate"] == 0.0001
    logs = stored["logs"]
    assert [log["step"] for log in logs if "rewards/total/mean" in log] == [1, 2]  # every step's scalars
    assert {"policy/loss", "throughput/gen_tokens_per_s"} <= set(logs[0])
    assert any("final/total/mean" in log for log in logs)  # the final metrics, at the last step
    assert "trackio logging failed" not in run.stdout + run.stderr


def test_a_failing_trackio_is_turned_off_with_one_warning_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio_home"))  # in case this is the first import
    trackio = pytest.importorskip("trackio")

    def unreachable(**kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(trackio, "init", unreachable)
    warnings = []
    sinks = make_sinks(tmp_path / "run", tensorboard=False, trackio=TrackioOptions(), warn=warnings.append)
    start_sinks(sinks, tmp_path / "run")
    sinks.handle(Scalars(1, {"policy/loss": 1.0}))
    sinks.handle(Scalars(2, {"policy/loss": 0.5}))
    sinks.close()
    assert sinks.active == [] and len(warnings) == 1
    assert "trackio logging failed in start (OSError: disk full)" in warnings[0]
    alerts = [json.loads(line) for line in (tmp_path / "run" / "alerts.jsonl").read_text().splitlines()]
    assert [a["rule"] for a in alerts] == ["sink_failed"]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == 2


def test_without_trackio_installed_training_logs_locally_with_one_warning(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "trackio", None)  # makes `import trackio` raise ImportError
    warnings = []
    sinks = make_sinks(tmp_path / "run", tensorboard=False, trackio=TrackioOptions(), warn=warnings.append)
    start_sinks(sinks, tmp_path / "run")
    sinks.handle(Scalars(1, {"policy/loss": 1.0}))
    sinks.close()
    assert sinks.active == [] and len(warnings) == 1
    assert "Trackio logging is off" in warnings[0] and "pip install -e '" in warnings[0] and "[trackio]'" in warnings[0]
