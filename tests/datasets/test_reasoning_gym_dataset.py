"""reasoning-gym tasks as datasets (`dataset: reasoning-gym:TASK`, the `reasoning-gym` extra) and Hugging Face
datasets names (`dataset: hf:NAME`): rows drawn from the generator with a seed, a held-out split apart from
training, the task's own score_answer as the correctness check and the task_score reward."""

from __future__ import annotations

import json

import pytest

from mlx_grpo.cli import main
from mlx_grpo.common.errors import UserError
from mlx_grpo.config.train_config import load_config
from mlx_grpo.data import extra_columns, load_datasets
from mlx_grpo.rewards.builtin import task_score
from mlx_grpo.rewards.correctness import load_correctness

pytest.importorskip("reasoning_gym")

OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_a_task_gives_seeded_training_rows_and_a_held_out_split_apart(tmp_path):
    config = load_config(None, {"dataset": "reasoning-gym:chain_sum", "dataset_options": OPTIONS,
                                "train_size": 60, "eval_size": 30, "seed": 3})
    train, heldout = load_datasets(config, tmp_path)
    again, _ = load_datasets(config, tmp_path)
    assert len(train) == 60 and [r["prompt"] for r in train] == [r["prompt"] for r in again]  # the seed decides
    assert 0 < len(heldout) <= 30
    assert not {r["prompt"] for r in heldout} & {r["prompt"] for r in train}  # never a training question
    assert all(r["reasoning_gym"]["num_terms"] == 2 for r in train + heldout)  # the generator's options
    other, _ = load_datasets(load_config(None, {"dataset": "reasoning-gym:chain_sum", "dataset_options": OPTIONS,
                                                "train_size": 60, "seed": 4}), tmp_path)
    assert [r["prompt"] for r in other] != [r["prompt"] for r in train]


def test_the_tasks_own_checker_scores_answer_blocks_and_prose(tmp_path):
    config = load_config(None, {"dataset": "reasoning-gym:chain_sum", "dataset_options": OPTIONS, "train_size": 4})
    rows = load_datasets(config, tmp_path)[0][:2]
    answers = [r["answer"] for r in rows]
    completions = [f"<reasoning>add</reasoning><answer>{answers[0]}</answer>",
                   f"The sum is {int(answers[1]) + 1}."]
    columns = extra_columns(rows)
    assert task_score([r["prompt"] for r in rows], completions, answers, **columns) == [2.0, 0.0]
    check = load_correctness("auto", config.dataset, [r.name for r in config.rewards], tmp_path)
    prose_right = [f"<answer>{answers[0]}</answer>", f"So {rows[1]['reasoning_gym']['expression']} = {answers[1]}."]
    assert check([r["prompt"] for r in rows], prose_right, answers, **columns) == [True, True]


def test_a_task_trains_a_step_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(["train", "--dataset", "reasoning-gym:chain_sum", "--dataset-options", json.dumps(OPTIONS),
                 "--train-size", "40", "--eval-size", "4", "--rewards", "format_exact", "task_score",
                 "--num-steps", "1", "--batch-size", "2", "--num-generations", "2", "--max-generation-steps", "8",
                 "--eval-every", "1", "--run-name", "rg", "--no-tensorboard"])
    err = capsys.readouterr().err
    assert code == 0, err
    records = [json.loads(line) for line in (tmp_path / "runs" / "rg" / "metrics.jsonl").read_text().splitlines()]
    assert any("rewards/task_score/mean" in r for r in records)
    assert any("eval/accuracy" in r for r in records)  # held out, scored by the task's checker


def test_an_unknown_task_or_option_is_named(tmp_path):
    with pytest.raises(UserError, match="reasoning-gym:no_such_task: the generator refused"):
        load_datasets(load_config(None, {"dataset": "reasoning-gym:no_such_task"}), tmp_path)
    with pytest.raises(UserError, match="reasoning-gym:chain_sum: the generator refused"):
        load_datasets(load_config(None, {"dataset": "reasoning-gym:chain_sum",
                                         "dataset_options": {"min_terms": 5, "max_terms": 2}}), tmp_path)
    with pytest.raises(UserError, match="expected a mapping"):
        load_config(None, {"dataset_options": "min_terms=2"})


def test_task_score_on_rows_of_another_dataset_says_so():
    with pytest.raises(UserError, match="read a reasoning-gym dataset's rows"):
        task_score(["1+1="], ["<answer>2</answer>"], ["2"])


def test_an_hf_name_is_read_from_the_local_cache_first(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    import huggingface_hub.constants as hub

    asked = []

    def cached_only(repo, subset=None, split=None, **kw):
        asked.append((repo, subset, split, datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE))
        if not datasets.config.HF_HUB_OFFLINE:
            raise ConnectionError("Couldn't reach the Hub")
        return datasets.Dataset.from_dict({"question": ["1+1?"], "solution": ["2"]}) if repo == "mine" else \
            (_ for _ in ()).throw(FileNotFoundError(f"{repo} is not cached"))

    monkeypatch.setattr(datasets, "load_dataset", cached_only)
    before = datasets.config.HF_HUB_OFFLINE
    rows, _ = load_datasets(load_config(None, {"dataset": "hf:mine", "prompt_field": "question"}), tmp_path)
    assert rows[0]["answer"] == "2" and asked[0][3:] == (True, True)  # read offline, from the cache
    assert datasets.config.HF_HUB_OFFLINE == before  # put back as it was
    with pytest.raises(UserError, match=r"hf:owner/gone: is not in the local datasets cache, and loading its "
                                        r"'train' split from the Hugging Face Hub failed"):
        load_datasets(load_config(None, {"dataset": "hf:owner/gone"}), tmp_path)
