"""mlx-grpo: GRPO fine-tuning on MLX with local-first monitoring.

This package's top level imports no mlx, so the dashboard and the telemetry
readers work in an environment that only watches runs.
"""

__version__ = "0.1.0"
