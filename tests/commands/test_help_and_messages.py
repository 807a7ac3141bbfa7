"""`train --help` that teaches (defaults, typed metavars, the model sources named), and the small messages a new
user reads: the offline hub, `finished 1 step`, plan's parameter count, `watch --web` without its extra."""

from __future__ import annotations

import re
import sys

import pytest

from mlx_grpo.cli import main


def test_train_help_shows_defaults_typed_metavars_and_every_model_source(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--num-steps N" in text and "(default: 200)" in text
    assert "--learning-rate FLOAT" in text and "(default: 5e-05)" in text
    assert "--loss-type {grpo,bnpo,dr_grpo,dapo}" in text
    assert "--model-id MODEL" in text and "smollm2" in text and ".gguf" in text
    assert "--rewards [REWARD ...]" in text and "format_exact format_approx answer_check" in text
    assert not re.search(r"--[a-z-]+ \[?VALUE", text) and "None:" not in text and "null = false" not in text
    assert "--alerts-file" not in text and "--no-enable-alerts" not in text  # --alerts / --no-alerts say it once
    assert text.startswith("usage: mlx-grpo train [CONFIG] [--resume RUN_DIR] [--KEY VALUE ...]")


def test_an_unreachable_hub_points_to_models_that_need_none(monkeypatch, tmp_path):
    import mlx_lm
    from huggingface_hub.errors import LocalEntryNotFoundError

    from mlx_grpo.common.errors import UserError
    from mlx_grpo.config.train_config import load_config
    from mlx_grpo.models.policy import load_policy

    def offline(path, *args, **kwargs):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache")

    monkeypatch.setattr(mlx_lm, "load", offline)
    with pytest.raises(UserError) as err:
        load_policy(load_config(None, {"model_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}), tmp_path)
    assert "cannot reach the Hugging Face Hub" in str(err.value) and "--model-id smollm2" in str(err.value)


def test_counts_read_as_people_write_them():
    from mlx_grpo.common.units import count_text, gb_text, plural

    assert plural(1, "step") == "1 step" and plural(2, "step") == "2 steps"
    assert count_text(1_052_288) == "1.05M" and count_text(137_120_064) == "137M" and count_text(7.6e9) == "7.6B"
    assert gb_text(0.02e9) == "<0.1 GB" and gb_text(0.7e9) == "0.7 GB"


def test_plan_names_the_default_models_size(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "default: 1.05M parameters" in out and "0.00B" not in out


def test_watch_web_without_its_extra_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "textual_serve", None)  # makes `import textual_serve` raise ImportError
    monkeypatch.setitem(sys.modules, "textual_serve.server", None)
    monkeypatch.delitem(sys.modules, "mlx_grpo.tui.web", raising=False)
    assert main(["watch", "--web", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "watch --web serves the dashboard with textual-serve" in err and "[web]" in err
