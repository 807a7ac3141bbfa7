"""A TRL or mlx-lm user's rewards, datasets and configs, read on the first try: every dataset column reaches a
reward under its own name, TRL's reward spellings are read as ours, a copied config reports every key it
cannot read at once, and translated keys never silently override keys written beside them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.data import extra_columns, load_datasets, read_dataset
from mlx_grpo.rewards.loading import load_reward_functions
from mlx_grpo.rewards.scoring import score_completions
from mlx_grpo.telemetry.reward_names import reward_name

TRL_ACCURACY = ("def accuracy(completions, solution, **kwargs):\n"
                "    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]\n")


def rows_with_answer_field(tmp_path, field):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+{i}?", field: str(2 * i)}) + "\n"
                                                 for i in range(3)))
    config = SimpleNamespace(dataset_format="auto", prompt_field="prompt", answer_field=field)
    return read_dataset("data.jsonl", tmp_path, "train", config)


def test_a_trl_reward_reads_the_answer_field_under_its_own_name(tmp_path):
    """TRL's `def accuracy(completions, solution, **kwargs)` on a dataset whose answer column is `solution`."""
    (tmp_path / "trl_rewards.py").write_text(TRL_ACCURACY)
    rows = rows_with_answer_field(tmp_path, "solution")
    functions = load_reward_functions([("trl_rewards.py:accuracy", 1.0)], tmp_path)
    scores = score_completions(functions, [r["prompt"] for r in rows], ["0", "3", "4"],
                               [r["answer"] for r in rows], extra_columns(rows))
    assert scores.new_errors == []
    assert scores.per_function[0].tolist() == [1.0, 0.0, 1.0]


def test_a_parameter_no_column_fills_is_named_and_stops_the_run(tmp_path):
    (tmp_path / "trl_rewards.py").write_text(TRL_ACCURACY)
    rows = rows_with_answer_field(tmp_path, "answer")  # no `solution` column this time
    functions = load_reward_functions([("trl_rewards.py:accuracy", 1.0)], tmp_path)
    with pytest.raises(UserError) as err:
        score_completions(functions, [r["prompt"] for r in rows], ["0", "3", "4"], [r["answer"] for r in rows],
                          extra_columns(rows))
    message = str(err.value)
    assert "reward function 'accuracy' takes 'solution'" in message and "no column of that name" in message
    assert "positional" not in message and "TypeError" not in message


def test_trl_reward_spellings_are_read_as_ours(tmp_path, capsys):
    (tmp_path / "my_rewards.py").write_text("def brevity(completions, **kw):\n    return [0.0 for _ in completions]\n")
    functions = load_reward_functions([("accuracy_reward", 1.0), ("my_rewards.brevity", 1.0),
                                       ("trl.rewards.think_format_reward", 1.0)], tmp_path)
    assert [f.name for f in functions] == ["answer_check", "brevity", "format_exact"]
    err = capsys.readouterr().err
    assert "'accuracy_reward' (TRL's built-in reward) is read as 'answer_check'" in err
    assert "'my_rewards.brevity' (TRL's module.function form) is read as 'my_rewards.py:brevity'" in err
    with pytest.raises(UserError, match=r"'get_soft_overlong_punishment' \(TRL's\) has no equivalent here"):
        load_reward_functions([("get_soft_overlong_punishment", 1.0)], tmp_path)
    with pytest.raises(UserError, match=r"unknown reward function 'answer_chek' \(did you mean 'answer_check'\?\)"):
        load_reward_functions([("answer_chek", 1.0)], tmp_path)
    with pytest.raises(UserError, match=r"has no function 'brevty' \(did you mean 'brevity'\?\)"):
        load_reward_functions([("my_rewards.py:brevty", 1.0)], tmp_path)


def test_a_config_reads_trl_reward_spellings_relative_to_its_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "my_rewards.py").write_text("def brevity(completions, **kw):\n    return [0.0]\n")
    (tmp_path / "cfg" / "run.yaml").write_text("reward_funcs: [accuracy_reward, my_rewards.brevity]\n")
    monkeypatch.chdir(tmp_path)
    config = load_config(tmp_path / "cfg" / "run.yaml")
    assert [r.name for r in config.rewards] == ["answer_check", f"{tmp_path / 'cfg' / 'my_rewards.py'}:brevity"]
    assert [reward_name(r.name) for r in config.rewards] == ["answer_check", "brevity"]


def test_every_key_a_copied_config_cannot_use_is_listed_at_once(tmp_path, capsys):
    path = tmp_path / "trl.yaml"
    path.write_text("max_steps: 5\noptim: adafactor\nrepetition_penalty: 1.2\nnum_train_epochs: 3\n"
                    "num_generatons: 4\n")
    with pytest.raises(UserError) as err:
        load_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: 3 keys cannot be read here:")
    assert "key 'optim' (TRL) is 'adafactor' and has no equivalent" in message
    assert "key 'repetition_penalty' (TRL) is 1.2 and has no equivalent" in message
    assert "unknown key 'num_generatons' (did you mean 'num_generations'?)" in message
    assert "num_train_epochs" not in message  # beside max_steps it changes nothing, as in TRL


def test_harmless_keys_of_trl_and_mlx_lm_warn_on_one_line_and_the_run_starts(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("max_steps: 5\nnum_train_epochs: 1\ngradient_accumulation_steps: 1\nmax_seq_length: 2048\n"
                    "per_device_eval_batch_size: 8\nuse_vllm: true\nvllm_mode: colocate\npush_to_hub: true\n"
                    "test: false\nlog_level: info\n")
    assert load_config(path).num_steps == 5
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1
    for key in ("num_train_epochs", "max_seq_length", "per_device_eval_batch_size", "use_vllm", "vllm_mode",
                "push_to_hub", "log_level"):
        assert key in warnings[0], key
    assert "test, max_seq_length (mlx-lm)" in warnings[0]
    path.write_text("num_train_epochs: 3\n")  # the only length given: epochs, as TRL reads it
    assert load_config(path).epochs == 3.0
    path.write_text("max_steps: -1\n")  # TRL: train for num_train_epochs, whose default is 3
    assert load_config(path).epochs == 3.0


def test_a_trl_dataset_s_solution_column_is_the_answer_and_prompt_only_data_trains(tmp_path, capsys):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+{i}?", "solution": str(2 * i)}) + "\n"
                                                 for i in range(3)))
    config = SimpleNamespace(dataset_format="auto", prompt_field="prompt", answer_field="answer")  # the default
    rows = read_dataset("data.jsonl", tmp_path, "train", config)
    assert [r["answer"] for r in rows] == ["0", "2", "4"] and rows[0]["solution"] == "0"
    assert "no 'answer' column; 'solution' is read as the reference answer" in capsys.readouterr().err
    (tmp_path / "p.jsonl").write_text('{"prompt": "1+1="}\n' * 30)
    formats_only = load_config(None, {"dataset": str(tmp_path / "p.jsonl"), "rewards": ["format_exact"]})
    train, _ = load_datasets(formats_only, tmp_path)
    assert {r["answer"] for r in train} == {""}
    with pytest.raises(UserError, match="no reference answer .* answer_check, number_check, digit_match compare"):
        load_datasets(load_config(None, {"dataset": str(tmp_path / "p.jsonl")}), tmp_path)
    with pytest.raises(UserError, match=r"missing field 'sol' \(answer_field; the data has 'prompt'\)"):
        load_datasets(load_config(None, {"dataset": str(tmp_path / "p.jsonl"), "answer_field": "sol"}), tmp_path)


def test_an_mlx_lm_data_directory_gives_train_and_held_out(tmp_path):
    data = tmp_path / "mlxdata"
    data.mkdir()
    for name, n in (("train", 30), ("valid", 4)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps({"prompt": f"{name} {i}", "answer": str(i)}) + "\n"
                                                    for i in range(n)))
    (tmp_path / "c.yaml").write_text("data: mlxdata\n")
    config = load_config(tmp_path / "c.yaml")
    train, heldout = load_datasets(config, tmp_path)
    assert len(train) == 30 and [r["prompt"] for r in heldout] == [f"valid {i}" for i in range(4)]
    (data / "train.jsonl").unlink()
    with pytest.raises(UserError, match="read as mlx-lm reads it.*no train.jsonl"):
        load_datasets(config, tmp_path)


def test_hf_style_snake_case_flags_are_read(tmp_path, capsys):
    from mlx_grpo.cli import _dashed_flags, build_parser

    parser = build_parser()
    argv = _dashed_flags(parser, ["train", "--learning_rate", "1e-5", "--num_steps=3",
                                  "--per_device_train_batch_size", "16", "--no_such_flag"])
    assert argv == ["train", "--learning-rate", "1e-5", "--num-steps=3", "--per-device-train-batch-size", "16",
                    "--no_such_flag"]
    assert main(["train", "--learning_rate", "1e-5", "--no_such", "x"]) == 2
    err = capsys.readouterr().err
    assert "--no_such" in err and "--learning_rate" not in err


@pytest.mark.parametrize("text, both", [
    ("batch_size: 4\nper_device_train_batch_size: 16\nnum_generations: 2\n", "'per_device_train_batch_size' (TRL) and 'batch_size'"),
    ("tensorboard: true\nwandb: false\nreport_to: [wandb]\n", "'report_to' (TRL) and 'tensorboard'"),
    ("use_lora: true\nfine_tune_type: full\n", "'fine_tune_type' (mlx-lm) and 'use_lora'"),
    ("monitoring_dir: mine\noutput_dir: runs/other\n", "'output_dir' (TRL) and 'monitoring_dir'"),
    ("rewards: [{name: answer_check, weight: 3}, {name: format_exact, weight: 1}]\nreward_weights: [1, 1]\n",
     "'reward_weights' (TRL) and weights in 'rewards'"),
    ("dtype: float32\nbf16: true\n", "'bf16' (TRL) and 'dtype'"),
])
def test_a_translated_key_never_silently_overrides_a_key_in_the_same_file(tmp_path, text, both):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match="both " + both.replace("(", r"\(").replace(")", r"\)")):
        load_config(path)


def test_a_flag_still_overrides_the_file_it_translates_over(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("wandb: false\ntensorboard: true\n")
    assert load_config(path, {"report_to": ["none"]}).tensorboard is False


def test_compare_names_a_custom_reward_by_its_function_with_its_file_beside_it(tmp_path):
    from rich.console import Console

    from mlx_grpo.telemetry.analysis.compare import comparison_table, load_summary
    from mlx_grpo.telemetry.rundir.writer import RunInfo, write_run_info

    for name, weight in (("a", 1.0), ("b", 0.5)):
        (tmp_path / name).mkdir()
        rewards = [{"name": "answer_check", "weight": 1.0},
                   {"name": f"{tmp_path}/cfg/my_rewards.py:brevity", "weight": weight}]
        write_run_info(tmp_path / name, RunInfo(name=name, status="finished", config={"rewards": rewards}))
    console = Console(width=200, record=True)
    console.print(comparison_table([load_summary(tmp_path / n) for n in ("a", "b")]))
    text = console.export_text()
    assert "answer_check, brevity (my_rewards.py)" in text and "answer_check, brevity x0.5 (my_rewards.py)" in text
    assert str(tmp_path) not in text
