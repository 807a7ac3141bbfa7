"""A run's multi-turn setting, built once from its config: what answers the model's turns (tools or an
environment), the tool schemas the chat template shows, and the budgets; and the texts rewards read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .calls import call_format
from .environments import ToolEnvironment, environment_factory
from .tools import ToolRunner
from .trajectories import Trajectory, TurnBudgets


@dataclass
class MultiTurn:
    make_env: Callable[[], Any]
    tools: list[dict] | None  # the tools' JSON schemas (None: an environment without tools)
    budgets: TurnBudgets
    runner: ToolRunner | None = None

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


def load_multiturn(config: Any, base_dir: Path, tokenizer: Any) -> MultiTurn | None:
    """None for a single-turn run (no tools, no environment)."""
    if not config.tools and not config.environment:
        return None
    budgets = TurnBudgets(config.max_turns, config.max_turn_tokens or config.max_generation_steps,
                          config.max_generation_steps)
    if config.tools:
        runner = ToolRunner(list(config.tools), base_dir, config.tool_timeout, config.tool_result_max_chars)
        fmt = call_format(tokenizer)
        return MultiTurn(lambda: ToolEnvironment(runner, fmt), runner.schemas, budgets, runner)
    return MultiTurn(environment_factory(config.environment, base_dir), None, budgets)


def final_turn(text_of: Callable[[list[int]], str], completion: list[int], trajectory: Trajectory) -> str:
    """The model's answer: its last turn, which correctness checks and answer rewards read (a tool's result
    before it must not count as the model's answer). Whatever its form: a small model often restates the
    result it read as one more call (`{"name": "calculator", "arguments": {"expression": "37570053"}}`)."""
    _, start, end = [s for s in trajectory.segments if s[0] == "assistant"][-1]
    return text_of(completion[start:end])


def reward_columns(trajectories: list[Trajectory], texts: list[str]) -> dict[str, list]:
    """Columns every reward function may take by name: the whole trajectory's text, its environment reward,
    its tool calls and failed calls, its turns."""
    return {"trajectory": texts,
            "environment_reward": [t.reward for t in trajectories],
            "tool_calls": [len(t.calls) for t in trajectories],
            "tool_failures": [sum(failed for _, failed in t.calls) for t in trajectories],
            "turns_taken": [t.turns for t in trajectories]}


def trajectory_records(text_of: Callable[[list[int]], str], completions: list[list[int]],
                       trajectories: list[Trajectory]) -> list[dict]:
    """Each trajectory as the run directory keeps it: its turns as text, its answer and its tool counts."""
    return [{"turns": [{"role": role, "text": text_of(ids[start:end])} for role, start, end in t.segments],
             "answer_text": final_turn(text_of, ids, t), "tool_calls": len(t.calls),
             "tool_failures": sum(failed for _, failed in t.calls), "environment_reward": t.reward,
             "turns_taken": t.turns}
            for ids, t in zip(completions, trajectories)]
