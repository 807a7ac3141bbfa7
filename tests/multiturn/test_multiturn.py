"""Multi-turn rollouts with tools and environments: the model's tokens are the only ones trained, a trajectory
continued from the cache scores as one prefilled from scratch, a tool that hangs, raises, floods or is called
badly never stops the run, and a multi-turn run resumes exactly."""

import json
import os
import signal
import subprocess
import sys
import time

import mlx.core as mx
import numpy as np
import pytest
import yaml
from kept_states import kept_state_error
from tiny_models import make_model_dir

from mlx_grpo import grpo
from mlx_grpo.multiturn.calculator import calculator, evaluate_expression
from mlx_grpo.multiturn.calls import CallFormat, Malformed, ToolCall, parse_calls
from mlx_grpo.multiturn.environments import NumberGuess, ToolEnvironment, Turn
from mlx_grpo.multiturn.metrics import trajectory_metrics
from mlx_grpo.multiturn.tools import ToolRunner
from mlx_grpo.multiturn.trajectories import TurnBudgets, generate_trajectories
from mlx_grpo.rollout import generate
from mlx_grpo.sampling import SamplingSettings
from mlx_grpo.update import build_train_batch, completion_scores

HERMES = CallFormat("<tool_call>", "</tool_call>", lambda body, tools: json.loads(body))
TOOLS_FILE = '''
import time

def echo(text: str) -> str:
    """Say it back.

    Args:
        text: what to say
    """
    return text

def hang(text: str) -> str:
    """Never answers.

    Args:
        text: ignored
    """
    time.sleep(60)
    return text

def boom(text: str) -> str:
    """Raises.

    Args:
        text: ignored
    """
    raise RuntimeError("the tool broke")

def huge(text: str) -> str:
    """A flood.

    Args:
        text: ignored
    """
    print("noise on stdout " * 1000)
    return "x" * 10_000_000
'''


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


# ----------------------------------------------------------------------------- the calculator and call parsing

def test_calculator_computes_arithmetic_and_refuses_everything_else():
    assert calculator("4821 * 7793") == "37570053"
    assert calculator("(12 + 3) / 4") == "3.75"
    assert calculator("2 ^ 10") == "1024" and calculator("1,250 - 50") == "1200"
    for bad in ["__import__('os').system('true')", "open('/etc/passwd')", "9**9**9**9", "1/0", "x + 1",
                "(1).__class__", "[1] * 10**9", "1" * 300]:
        with pytest.raises(ValueError):
            evaluate_expression(bad)


def test_calls_are_read_in_the_template_format_and_untagged_json_naming_a_tool():
    tools = [{"function": {"name": "calculator"}}]
    assert parse_calls(call("calculator", expression="1+2"), HERMES, tools) == [ToolCall("calculator", {"expression": "1+2"})]
    fenced = '```json\n{"name": "calculator", "arguments": {"expression": "3*4"}}\n```'
    assert parse_calls(fenced, HERMES, tools) == [ToolCall("calculator", {"expression": "3*4"})]
    assert parse_calls("The answer is 12.", HERMES, tools) == []
    assert parse_calls('{"name": "weather", "arguments": {}}', HERMES, tools) == []  # not a tool of this run
    bad = parse_calls("<tool_call>{not json</tool_call>", HERMES, tools)
    assert len(bad) == 1 and isinstance(bad[0], Malformed)
    unclosed = parse_calls('<tool_call>{"name": "calculator"', HERMES, tools)
    assert isinstance(unclosed[0], Malformed) and "closing" in unclosed[0].reason


# ----------------------------------------------------------------------------- failing tools never stop a run

@pytest.fixture
def runner(tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS_FILE)
    runner = ToolRunner(["calculator", "my_tools.py:echo", "my_tools.py:hang", "my_tools.py:boom",
                         "my_tools.py:huge"], tmp_path, timeout=1.0, max_chars=100)
    yield runner
    runner.close()


def test_tools_get_their_schema_from_type_hints_and_docstring(runner):
    names = [s["function"]["name"] for s in runner.schemas]
    assert names == ["calculator", "echo", "hang", "boom", "huge"]
    echo = runner.schemas[1]["function"]
    assert echo["parameters"]["properties"]["text"] == {"type": "string", "description": "what to say"}


def test_hanging_raising_flooding_and_malformed_calls_are_answered_and_counted(runner):
    env = ToolEnvironment(runner, HERMES)
    started = time.monotonic()
    turn = env.step(call("hang", text="a") + call("echo", text="still here"))
    assert time.monotonic() - started < 50  # the tool sleeps 60 s: cut at 1 s, its worker restarted
    assert turn.calls == [("hang", True), ("echo", False)]
    assert "took longer than 1 s" in turn.messages[0]["content"] and turn.messages[1]["content"] == "still here"
    turn = env.step(call("boom", text="a"))
    assert turn.calls == [("boom", True)] and "RuntimeError: the tool broke" in turn.messages[0]["content"]
    turn = env.step(call("huge", text="a"))
    assert turn.calls == [("huge", False)] and len(turn.messages[0]["content"]) < 200
    assert "cut to 100 characters" in turn.messages[0]["content"]
    turn = env.step("<tool_call>{oops</tool_call>")
    assert turn.calls == [("malformed", True)] and "malformed" in turn.messages[0]["content"]
    turn = env.step(call("nope", text="a"))
    assert turn.calls == [("nope", True)] and "unknown tool" in turn.messages[0]["content"]
    assert env.step("The answer is 4.").done
    assert runner.call("calculator", {"expression": "6*7"}).text == "42"  # the runner still works


def test_failed_calls_show_in_the_step_metrics():
    from mlx_grpo.multiturn.trajectories import Trajectory
    stories = [Trajectory([("assistant", 0, 3), ("environment", 3, 5), ("assistant", 5, 7)],
                          [("calculator", False), ("hang", True)]),
               Trajectory([("assistant", 0, 4)], [])]
    metrics = trajectory_metrics(stories, [[1, 1, 1, 0, 0, 1, 1], [1, 1, 1, 1]])
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failure_frequency"] == 0.5
    assert metrics["tools/hang/failures"] == 1.0 and metrics["tools/calculator/calls"] == 1.0
    assert metrics["multiturn/turns_mean"] == 1.5 and metrics["multiturn/environment_tokens_mean"] == 1.0


# ----------------------------------------------------------------------------- the trajectories and their loss

class Counter:
    """Answers every turn with the same digits and never ends: every trajectory runs all its turns."""

    def reset(self, row):
        self.row = row

    def step(self, text):
        return Turn([{"role": "user", "content": "12"}])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from mlx_lm import load
    model, tokenizer = load(str(make_model_dir(tmp_path_factory.mktemp("mt") / "model", "llama")))
    return model, tokenizer


def trajectories(tiny, seed=0):
    model, tokenizer = tiny
    prompts = [tokenizer.encode("1+2="), tokenizer.encode("12+345=")]  # different lengths: a left-padded cache
    return generate_trajectories(model, tokenizer, prompts, [{"answer": "3"}, {"answer": "357"}], 3,
                                 TurnBudgets(3, 5, 40), set(), 0, SamplingSettings(1.0), mx.random.key(seed),
                                 Counter, None)


def test_a_trajectory_continued_from_the_cache_scores_as_one_prefilled_from_scratch(tiny):
    rollout = trajectories(tiny)
    assert all(t.turns == 3 for t in rollout.trajectories)
    assert all(0 in mask for mask in rollout.model_mask)  # environment tokens sit between the turns
    batch = build_train_batch(rollout, 0)
    scored = np.array(completion_scores(tiny[0], batch, 1.0, gradient=False).logp)
    for i, (mask, sampled) in enumerate(zip(rollout.model_mask, rollout.logprobs)):
        own = np.array(mask, dtype=bool)
        np.testing.assert_allclose(scored[i, :len(mask)][own], np.array(sampled)[own], atol=1e-4)


def test_one_turn_without_tools_is_the_single_turn_rollout(tiny):
    model, tokenizer = tiny

    class Done:
        def reset(self, row):
            pass

        def step(self, text):
            return Turn(done=True)

    prompts = [tokenizer.encode("1+2="), tokenizer.encode("12+345=")]
    multi = generate_trajectories(model, tokenizer, prompts, [{}, {}], 2, TurnBudgets(1, 6, 6), set(), 0,
                                  SamplingSettings(1.0), mx.random.key(3), Done, None)
    single = generate(model, prompts, 2, 6, set(), 0, SamplingSettings(1.0), mx.random.split(mx.random.key(3), 1)[0])
    assert multi.completions == single.completions


def test_environment_tokens_get_no_gradient(tiny):
    rollout = trajectories(tiny, seed=1)
    batch = build_train_batch(rollout, 0)
    own = np.zeros(batch.mask.shape, dtype=bool)
    for i, mask in enumerate(rollout.model_mask):
        own[i, :len(mask)] = np.array(mask, dtype=bool)
    logp = mx.array(np.random.default_rng(0).normal(-2.0, 0.5, batch.mask.shape).astype(np.float32))
    ref = logp - 0.3
    advantages = mx.array([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    options = grpo.LossOptions(beta=0.04, loss_type="grpo")
    grad = np.array(mx.grad(lambda lp: grpo.grpo_loss(lp, None, ref, advantages, batch.mask, options))(logp))
    inside = np.zeros_like(own)
    for i, mask in enumerate(rollout.model_mask):
        inside[i, :len(mask)] = True
    assert np.all(grad[inside & ~own] == 0.0)  # tool and environment tokens: no loss, no KL
    assert np.all(grad[own] != 0.0)  # the model's own tokens all learn
    assert batch.num_tokens == int(own.sum())


def test_the_frozen_blocks_output_is_kept_at_every_position_through_turns_and_tool_answers(tmp_path):
    """The reference pass and the update start at the first adapted block on what the rollout kept: the prompt
    from the prefill, each turn from its decode steps, the rest of the turn and the answer from the pass that
    runs them on the row's cache. A state from the wrong position or row moves log-probs by ~1."""
    from dataclasses import replace

    from mlx_lm import load

    from mlx_grpo import frozen_prefix
    from mlx_grpo.config.train_config import TrainConfig
    from mlx_grpo.models.policy import apply_adapters

    model, tokenizer = load(str(make_model_dir(tmp_path / "model", "llama", num_hidden_layers=4)))
    apply_adapters(model, TrainConfig(use_lora=True, lora_layers=2))
    for _, module in model.named_modules():
        if hasattr(module, "lora_b"):  # adapters off zero: the policy differs from the frozen blocks' model
            module.lora_b = mx.random.normal(module.lora_b.shape, key=mx.random.key(1)) * 0.05
    assert frozen_prefix.install(model) is None and frozen_prefix.first_block(model) == 2
    prompts = [tokenizer.encode("1+2="), tokenizer.encode("12+345=")]
    rollout = generate_trajectories(model, tokenizer, prompts, [{"answer": "3"}, {"answer": "357"}], 3,
                                    TurnBudgets(3, 5, 40), set(), 0, SamplingSettings(1.0), mx.random.key(0),
                                    Counter, None, capture=True)
    assert all(t.turns == 3 for t in rollout.trajectories)
    assert max(kept_state_error(model, rollout, row) for row in range(6)) < 1e-4
    batch = build_train_batch(rollout, 0)
    started = np.array(completion_scores(model, batch, 1.0, gradient=False).logp)
    full = np.array(completion_scores(model, replace(batch, prefix=None), 1.0, gradient=False).logp)
    np.testing.assert_allclose(started[np.array(batch.mask) > 0], full[np.array(batch.mask) > 0], atol=1e-4)


# ----------------------------------------------------------------------------- a multi-turn run, killed and resumed

ENV_FILE = '''
from mlx_grpo.multiturn.environments import Turn

class Countdown:
    """Answers twice with digits, then ends; rewards a turn holding the digit 3."""

    def reset(self, row):
        self.left = 2

    def step(self, text):
        self.left -= 1
        return Turn([{"role": "user", "content": "1" + str(self.left)}], reward=float("3" in text), done=self.left < 0)
'''


def _train(root, name, *extra):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    return subprocess.Popen([sys.executable, "-m", "mlx_grpo.cli", "train", str(root / "config.yaml"), "--run-name", name,
                             "--monitoring-dir", str(root / "runs"), *extra], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_multi_turn_run_killed_mid_run_resumes_to_the_same_run(tmp_path):
    model = make_model_dir(tmp_path / "model", "llama")
    (tmp_path / "countdown.py").write_text(ENV_FILE)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({
        "model_id": str(model), "environment": "countdown.py:Countdown", "max_turns": 3, "max_turn_tokens": 4,
        "max_generation_steps": 24, "num_steps": 6, "batch_size": 2, "num_generations": 4, "train_size": 8,
        "eval_every": 3, "eval_size": 4, "checkpoint_every": 2, "learning_rate": 0.01, "seed": 5,
        "rewards": ["environment", "answer_check"], "wandb": False, "samples_per_step": 2,
        "on_alert": "warn"}))  # a random model's rewards swing: alerts report, never stop it
    reference = _train(tmp_path, "reference")
    out, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err
    killed = _train(tmp_path, "killed")
    metrics = tmp_path / "runs" / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (metrics.exists() and metrics.read_bytes().count(b"\n") >= 4):
        time.sleep(0.01)
    killed.send_signal(signal.SIGKILL)
    killed.communicate()
    resumed = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "train", "--resume", str(tmp_path / "runs" / "killed")],
                             cwd=tmp_path, env={**os.environ, "WANDB_MODE": "disabled"}, capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr

    def records(name):
        rows = [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        clock = ("timing/", "system/", "throughput/", "perf/", "memory/")
        return [{k: v for k, v in r.items() if k != "time" and not k.startswith(clock)} for r in rows]

    got, want = records("killed"), records("reference")
    assert [r["step"] for r in got] == list(range(0, 7))
    assert got == want
    assert want[-1]["multiturn/turns_mean"] > 1.0 and want[-1]["multiturn/environment_tokens_mean"] > 0
    final = {name: mx.load(str(tmp_path / "runs" / name / "checkpoints" / "step_6" / "model.safetensors"))
             for name in ("killed", "reference")}
    for key in final["reference"]:
        np.testing.assert_array_equal(np.array(final["killed"][key]), np.array(final["reference"][key]))


def test_number_guess_says_higher_or_lower_and_rewards_the_find():
    game = NumberGuess()
    game.reset({"answer": "42"})
    assert game.step("I guess 10").messages[0]["content"] == "Higher."
    assert game.step("50").messages[0]["content"] == "Lower."
    assert "number" in game.step("hmm").messages[0]["content"]
    found = game.step("It is 42")
    assert found.done and found.reward == 1.0


# ----------------------------------------------------------------------------- alerts on tool use

def _tool_records(calls, failures):
    return [{"step": i + 1, "time": 1000.0 + i, "tools/call_frequency": c, "tools/failure_frequency": f}
            for i, (c, f) in enumerate(zip(calls, failures))]


def test_tool_calls_dying_out_and_every_call_failing_are_named():
    from mlx_grpo.telemetry.alerts.config import default_rules
    from mlx_grpo.telemetry.alerts.engine import AlertEngine

    def fired(records):
        return {a.rule: a.step for a in AlertEngine(default_rules()).check_all(records)}

    healthy = _tool_records([1.0, 1.2, 0.9, 1.1, 1.0, 1.3, 1.1, 1.2, 1.4, 1.2], [0.2, 0.1, 0.3, 0.1, 0.0] * 2)
    assert not {"tool_calls_dying", "tool_calls_failing"} & set(fired(healthy))
    dying = _tool_records([1.0, 1.2, 0.9, 1.1, 1.0, 0.6, 0.2, 0.1, 0.0, 0.0], [0.1] * 10)
    assert fired(dying).get("tool_calls_dying") in (8, 9, 10)
    failing = _tool_records([1.0] * 10, [0.2, 0.1, 0.3, 1.0, 1.0, 1.0, 1.0, 0.5, 0.2, 0.1])
    assert fired(failing).get("tool_calls_failing") == 6
