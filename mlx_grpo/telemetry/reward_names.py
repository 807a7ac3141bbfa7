"""How a reward is written and what it is called.

A reward is written as a built-in name (`answer_check`), as `path/to/file.py:function`, as TRL's dotted
`module.function` (read as `module.py:function`, the file relative to the config's folder) or as one of TRL's
built-in names (`accuracy_reward`, read as our nearest built-in with a note). Whatever the spelling, a reward
has one name: the built-in's name, or the function's name for a user function. That name is its metric
(`rewards/<name>/mean`), what `compare`, `replay --without` and the dashboard show, and what run.json
lists under `reward_names`; the file stays beside it in the spec. Imports nothing heavy.
"""

from __future__ import annotations

import re

# TRL's built-in reward functions (trl.rewards) -> (our nearest built-in, how they differ).
TRL_BUILTINS: dict[str, tuple[str, str]] = {
    "accuracy_reward": ("answer_check", "TRL's compares a LaTeX-parsed answer with the solution column; "
                                        "answer_check compares the answer block with the answer field and "
                                        "scores -1 to +3"),
    "think_format_reward": ("format_exact", "TRL's checks <think>...</think>; format_exact checks this task's "
                                            "reasoning block then answer block, and scores 0 or 3"),
}
# mlx-lm-lora's built-in GRPO rewards (its answer format: <think>...</think><answer>...</answer>) -> ours.
MLX_LM_LORA_BUILTINS: dict[str, tuple[str, str]] = {
    "r1_accuracy_reward_func": ("answer_check", "both compare the answer block with the answer field; "
                                                "answer_check scores -1 to +3"),
    "r1_int_reward_func": ("number_check", "number_check scores 1.5 when the answer block's first number is the "
                                           "answer's"),
    "r1_strict_format_reward_func": ("format_exact", "format_exact checks this task's reasoning block then answer "
                                                     "block, and scores 0 or 3"),
    "r1_soft_format_reward_func": ("format_approx", "format_approx gives partial credit per tag"),
}
# TRL's reward factories and rewards with no counterpart here: what to do instead.
TRL_NO_EQUIVALENT: dict[str, str] = {
    "get_soft_overlong_punishment": "there is no built-in length penalty; write one as a function in a .py file "
                                    "(configs/rewards_example.py:brevity is an example)",
    "reasoning_accuracy_reward": "use answer_check (the answer block) or last_number_check (a reply's last "
                                 "number)",
}

# `module.function` or `package.module.function`: Python identifiers joined by dots, no path, no colon.
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def reward_name(spec: str) -> str:
    """The one name of the reward written as `spec`: the function's name after the colon, else `spec`."""
    return spec.rpartition(":")[2] if ":" in spec else spec


def reward_names(specs) -> list[str]:
    """The names of a list of specs (strings, or mappings with a `name`), in order."""
    return [reward_name(s.get("name", "") if isinstance(s, dict) else str(s)) for s in specs]


def reward_file(spec: str) -> str | None:
    """The file part of `file.py:function` (None for a built-in)."""
    return spec.rpartition(":")[0] or None if ":" in spec else None


def dotted_as_file(spec: str) -> str | None:
    """TRL's `module.function` as `module.py:function` (`pkg.mod.fn` as `pkg/mod.py:fn`); None when `spec`
    is not in that form. `my_rewards.py` alone (a file without its function) is not read as one."""
    if ":" in spec or not _DOTTED.fullmatch(spec):
        return None
    module, _, function = spec.rpartition(".")
    if function == "py":
        return None
    return module.replace(".", "/") + ".py:" + function


def translate_reward(spec: str) -> tuple[str, str | None]:
    """(the spec as we read it, a note saying how, or None when it was already ours). TRL's built-in names
    become our nearest built-in, the dotted form a file spec; names TRL has but we do not stay as they are
    (the loader refuses them with `no_equivalent_reason`)."""
    if spec.startswith("trl.") and spec.rpartition(".")[2] in TRL_BUILTINS:  # trl.rewards.accuracy_reward
        spec = spec.rpartition(".")[2]
    if spec in TRL_BUILTINS:
        ours, how = TRL_BUILTINS[spec]
        return ours, f"'{spec}' (TRL's built-in reward) is read as '{ours}': {how}"
    if spec in MLX_LM_LORA_BUILTINS:
        ours, how = MLX_LM_LORA_BUILTINS[spec]
        return ours, f"'{spec}' (mlx-lm-lora's built-in reward) is read as '{ours}': {how}"
    as_file = dotted_as_file(spec)
    if as_file is not None:
        return as_file, f"'{spec}' (TRL's module.function form) is read as '{as_file}'"
    return spec, None
