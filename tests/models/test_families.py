"""One home per model family (mlx_grpo/models/families.py): what it says of each family, and that the memory
plan reads it without loading mlx or any model code."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from structure.test_layering import import_graph

from mlx_grpo.models import families
from mlx_grpo.models.families import FAMILIES, GGUF_ARCHITECTURES, plain_cache, plain_head, sliding, sliding_window
from mlx_grpo.planning.plan import ModelShape

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import mlx_grpo.models.families, mlx_grpo.planning.plan
loaded = sorted(m for m in sys.modules if m == "mlx" or m.startswith("mlx.") or m.startswith("mlx_lm"))
assert not loaded, loaded
print("ok")
"""


def test_families_and_the_plan_load_without_mlx():
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_plan_imports_no_model_code_but_the_families():
    graph, _ = import_graph()
    reached, todo = set(), ["mlx_grpo.planning.plan"]
    while todo:
        for target in graph[todo.pop()] - reached:
            reached.add(target)
            todo.append(target)
    assert sorted(m for m in reached if m.startswith("mlx_grpo.models.")) == ["mlx_grpo.models.families"]
    assert not reached & {"mlx_grpo.update", "mlx_grpo.head_scores", "mlx_grpo.rollout"}


def test_every_family_is_a_model_type_mlx_lm_builds():
    from mlx_lm.utils import MODEL_REMAPPING  # mistral is built by llama's module

    for model_type in {*FAMILIES, *(layout.model_type for layout in GGUF_ARCHITECTURES.values())}:
        module = MODEL_REMAPPING.get(model_type, model_type)
        assert importlib.util.find_spec(f"mlx_lm.models.{module}") is not None, model_type


def test_heads_and_caches_by_family():
    assert plain_head("qwen2") and plain_head("gemma3_text")
    assert not plain_head("lfm2") and not plain_head("gemma2") and not plain_head(None)
    assert plain_cache({"model_type": "llama"}) and not plain_cache({"model_type": "lfm2"})
    # gemma3_text's sliding layers are mlx-lm's default when the config does not say
    assert sliding({"model_type": "gemma3_text"}) and not sliding({"model_type": "qwen2"})
    assert not sliding({"model_type": "gemma3_text", "sliding_window_pattern": 1})
    assert sliding({"model_type": "qwen2", "layer_types": ["full_attention", "sliding_attention"]})
    assert sliding_window({"model_type": "gemma3_text", "sliding_window": 512}) == 512
    assert sliding_window({"model_type": "lfm2", "sliding_window": 512, "sliding_window_pattern": 2}) == 0
    # a GGUF gemma3 file is given the family's pattern, written once
    assert GGUF_ARCHITECTURES["gemma3"].extra["sliding_window_pattern"] == FAMILIES["gemma3_text"].sliding_pattern


def test_a_family_entry_changes_what_the_plan_predicts(monkeypatch):
    shape = {"model_type": "newfamily", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 1000,
             "num_hidden_layers": 2, "intermediate_size": 128}
    assert not ModelShape.from_config(shape).plain_head
    monkeypatch.setitem(FAMILIES, "newfamily", families.Family())
    assert ModelShape.from_config(shape).plain_head and ModelShape.from_config(shape).plain_cache
