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
    before it must not count as the model's answer). Empty when the environment did not end the trajectory: a
    model still calling tools when its turns ran out gave no answer (a call's arguments are not one)."""
    if not trajectory.done:
        return ""
    _, start, end = [s for s in trajectory.segments if s[0] == "assistant"][-1]
    return text_of(completion[start:end])


def reward_columns(trajectories: list[Trajectory], texts: list[str]) -> dict[str, list]:
    """Columns every reward function may take by name: the whole trajectory's text, its environment reward,
    its tool calls and failed calls, its turns."""
    return {"trajectory": texts,
            "environment_reward": [t.reward for t in trajectories],
            "tool_calls": [len(t.calls) for t in trajectories],
            "tool_failures": [sum(failed for _, failed in t.calls) for t in trajectories],
            "turns": [t.turns for t in trajectories]}
