"""Multi-turn rollouts: the model calls tools or acts in an environment, reads the answer and goes on.

- `calculator.py`: the built-in `calculator` tool (a safe arithmetic evaluator, never `eval`).
- `tools.py`: tool functions (built-in names or `file.py:function`), their JSON schemas, and the runner that
  calls them in a worker process (`tool_worker.py`) with a time limit and a size limit.
- `calls.py`: tool calls parsed out of a model turn, in the model's own format.
- `environments.py`: the environment protocol, the tool environment, the built-in `number_guess` game.
- `chat.py`: the tokens appended after a model turn, through the chat template.
- `trajectories.py`: batched decoding turn after turn, continuing from the KV cache.

This package's top level imports no mlx.
"""
