"""The measuring wing: how fast and how right this install trains, measured on this machine.

`benchmark` times a step's phases on a `workload` (`mlx-grpo bench`), `selftest` checks the trainer against
reference computations on a real model (`mlx-grpo selftest`, with `tf32_child` its TF32 child process), `sweep`
runs a grid of configs (`mlx-grpo sweep`).
"""
