"""Maintenance scripts run by developers (not part of the `mlx-grpo` command)."""
