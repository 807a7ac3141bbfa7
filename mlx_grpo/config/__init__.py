"""The config wing: what a run is told, and how it is read.

`train_config` declares the keys (`TrainConfig`, each key's default, help and bounds) and reads a YAML file or
`--set` overrides into them through `typed_yaml` (a mapping read into declared dataclasses); `aliases`
translates other tools' key names, `paths` resolves a config's relative paths, `run_code` and `name_clash`
guard the user code a config names. `load_config` and `TrainConfig` are importable from here, as they were
before the wing (`from mlx_grpo.config import load_config`).
"""

from .train_config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config"]
