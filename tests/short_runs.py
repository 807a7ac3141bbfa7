"""The short real runs several test modules read: the default config, and the training extras on.

`conftest.py` makes each a session fixture, so a run is trained once however many modules read it.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlx_grpo.config.train_config import load_config
from mlx_grpo.run.loop import train

REPO = Path(__file__).resolve().parent.parent
STEPS, BATCH, GROUP, EXITS = 4, 4, 4, 3  # the extras run's shape


def default_run(tmp: Path) -> tuple[Path, list[dict]]:
    """The default config, shortened; 4 prompts a step from 8 rows make every 2 steps an epoch."""
    config = load_config(REPO / "configs" / "default.yaml", {
        "num_steps": 6, "batch_size": 4, "train_size": 8, "eval_every": 3, "eval_size": 20, "histogram_every": 2,
        "checkpoint_every": 3, "monitoring_dir": str(tmp / "runs"), "wandb": False})
    result = train(config, tmp)
    assert result["status"] == "finished"
    run_dir = Path(result["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, records


def run(tmp_path: Path, name: str, **overrides) -> Path:
    config = load_config(None, {"num_steps": STEPS, "batch_size": BATCH, "num_generations": GROUP, "num_iterations": 1,
                                "train_size": 200, "eval_size": 40, "eval_every": STEPS, "checkpoint_every": 0,
                                "monitoring_dir": str(tmp_path), "run_name": name, **overrides})
    result = train(config, tmp_path)
    assert result["status"] == "finished"
    return Path(result["run_dir"])


def extras_run(tmp: Path) -> Path:
    """Every training extra on: adaptive window, S-GRPO, entropy dumps, a rubric and dynamic sampling."""
    return run(tmp, "extras", **{
        "adaptive_window.enable": True, "adaptive_window.epsilon": 0.25,
        "adaptive_window.percentile": 95, "adaptive_window.margin": 4,  # p95 is logged: the test can recompute
        "sgrpo.enable": True, "sgrpo.num_exits": EXITS, "entropy_logging.enable": True,
        "rubric_file": str(REPO / "configs" / "rubric_math.yaml"), "dynamic_sampling": True,
        "dynamic_sampling_max_rounds": 1})
