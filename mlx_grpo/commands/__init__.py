"""One module per `mlx-grpo` subcommand."""
