"""The declared floors of mlx and mlx-lm are versions that have what the code uses.

`scripts/test_at_floor.sh` runs the fast suite at the floors; this test keeps the floors from falling
below a feature the code needs (a user meeting every declared requirement must be able to train)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"

# (package, first version that has it, what the code uses)
FEATURES = [
    # rollout.unbatchable_caches: a model whose caches cannot merge is refused; KVCache.merge is first
    # in mlx-lm 0.30.4, so before it every model is refused, the shipped one too
    ("mlx-lm", "0.30.4", "KVCache.merge (batched rollout)"),
    # 0.30.4 and 0.30.5 pin transformers 5.0.0rc1/rc3, whose decode drops the shipped tokenizer's answer
    # tags (tests/models/test_default_model.py fails at them): the format reward would never pay
    ("mlx-lm", "0.30.6", "a released transformers 5"),
    # 0.30.6-0.30.7: BatchRotatingKVCache.merge fails once a prompt is longer than the sliding window
    # (gemma3's rollout raises); 0.31.0 is yanked (batched KV cache cross contamination)
    ("mlx-lm", "0.31.2", "sliding-window caches that merge"),
    ("mlx", "0.30.4", "mx.device_info; mlx-lm 0.30.6's own requirement"),
]


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def declared_floors() -> dict[str, set[str]]:
    floors: dict[str, set[str]] = {}
    for dep in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        if match := re.match(r"([A-Za-z0-9_-]+)(?:\[[^\]]*\])?>=([0-9.]+)", dep):
            floors.setdefault(match.group(1), set()).add(match.group(2))
    return floors


@pytest.mark.parametrize("package, first, feature", FEATURES)
def test_the_declared_floor_has_every_feature_the_code_uses(package, first, feature):
    floors = declared_floors()[package]
    assert len(floors) == 1, f"{package}: one floor for every platform, found {sorted(floors)}"
    assert version_tuple(floors.pop()) >= version_tuple(first), f"{package} needs >= {first} for {feature}"


def test_the_installed_mlx_lm_batches_the_shipped_model():
    from mlx_lm.models.cache import KVCache

    assert hasattr(KVCache, "merge")
