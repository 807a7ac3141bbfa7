"""Timing a peer trainer's phases from inside its process (run by both comparisons with mlx-lm-lora, in the
peer's own venv: MLX only, no mlx_grpo)."""

import time

import mlx.core as mx


def timed_phase(seconds: list, function):
    """`function` with each call's seconds appended to `seconds`, its lazy results evaluated first."""
    def wrapped(*a, **k):
        start = time.perf_counter()
        result = function(*a, **k)
        mx.eval(result)
        seconds.append(time.perf_counter() - start)
        return result
    return wrapped
