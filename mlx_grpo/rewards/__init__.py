"""The rewards wing: what a completion is worth and whether it is correct.

Floors, bottom first: `builtin.py` (the built-in reward functions) and `judge.py` (an OpenAI-compatible
judge); `scoring.py` (RewardFunction, RewardHooks, scoring a batch) and `rubric_scorers.py`; `rubric.py` (a
YAML rubric of weighted criteria); `rubric_reward.py` (the rubric as one reward function with hooks);
`loading.py` (the run's reward functions from its config) and `correctness.py` (which completions are correct).
"""
