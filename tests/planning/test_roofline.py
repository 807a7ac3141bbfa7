"""The roofline's FLOP counts (mlx_grpo/planning/roofline.py) against the real model's shapes, the two ceilings, and
perf/mfu in the step record."""

import json

import pytest
from mlx.utils import tree_flatten
from step_data_builder import make_step_data
from tiny_models import make_model_dir

from mlx_grpo.planning import roofline
from mlx_grpo.planning.plan import ModelShape
from mlx_grpo.telemetry.metrics.names import MFU
from mlx_grpo.telemetry.metrics.step_data import step_record


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_forward_flops_are_two_per_weight_of_the_built_model(tmp_path, model_type):
    from mlx_lm import load

    path = make_model_dir(tmp_path, model_type)
    shape = ModelShape.from_config(json.loads((path / "config.json").read_text()))
    model, _ = load(str(path))
    blocks = sum(v.size for name, v in tree_flatten([layer.parameters() for layer in model.model.layers])
                 if v.ndim == 2)  # the matrices: norms and biases add no multiply-adds
    # one position with no context: every block weight once, and the head (tied or not) once
    assert roofline.forward(shape, 1, 0, 1) == 2 * blocks + 2 * shape.vocab * shape.hidden


def test_update_backward_stops_at_the_first_adapted_block():
    shape = ModelShape(vocab=1000, hidden=64, layers=4, heads=4, kv_heads=2, head_dim=16, intermediate=128, tied=True)

    def update(layers, use_lora=True):
        return roofline.update(shape, roofline.Training(use_lora, 8, layers), 2, 8, 10, 20, 20, 1).flops

    one_block = update(2) - update(1)
    assert one_block > 0 and update(4) - update(3) == pytest.approx(one_block)
    # full fine-tuning also computes every weight's gradient: more than LoRA on every block
    assert update(-1, use_lora=False) > update(4) > update(1)
    # two passes, twice the work
    twice = roofline.update(shape, roofline.Training(True, 8, 2), 2, 8, 10, 20, 20, 2).flops
    assert twice == pytest.approx(2 * update(2))


def test_frozen_prefix_reuse_takes_the_frozen_blocks_forward_out_of_the_reference_and_the_update():
    """LoRA on 2 of 6 blocks: the reference pass and the update's forward start at block 4 (frozen_prefix.py),
    so the 4 frozen blocks' forward over the batch leaves both counts, once per update pass; the rollout,
    which computes those states, keeps its count."""
    shape = ModelShape(vocab=1000, hidden=64, layers=6, heads=4, kv_heads=2, head_dim=16, intermediate=128, tied=True)
    prompts, rows, p, t, passes = 2, 8, 10, 20, 2

    def phases(reuse):
        return roofline.step_work(shape, roofline.Training(True, 8, 2, reuse), prompts, rows, p, t, t, passes, True)

    full, reused = phases(False), phases(True)
    frozen = (prompts * roofline.forward(shape, p, roofline.causal_context(0, p), 0, 4)
              + rows * roofline.forward(shape, t - 1, roofline.causal_context(p, t - 1), 0, 4))
    assert full["reference"].flops - reused["reference"].flops == pytest.approx(frozen)
    assert full["update"].flops - reused["update"].flops == pytest.approx(passes * frozen)
    assert full["rollout"] == reused["rollout"]
    # full fine-tuning trains every block: nothing to reuse
    everything = roofline.Training(False, frozen_prefix=True)
    assert everything.scored_layers(shape) == 6


def test_decode_is_memory_bound_when_few_rows_read_the_weights():
    shape = ModelShape(vocab=151936, hidden=896, layers=2, heads=14, kv_heads=2, head_dim=64, intermediate=4864,
                       tied=True)
    decode = roofline.rollout_decode(shape, rows=8, prompt_length=21, completion_length=256, dtype_bytes=4)
    # each of the 255 passes reads every weight once (the tied head included)
    assert decode.bytes >= 255 * shape.weight_bytes(4)
    limits = roofline.Limits(flops_per_s=200e9, bytes_per_s=8e9)
    assert limits.bound(decode) == "memory"
    assert limits.attainable(decode) == pytest.approx(decode.flops / decode.bytes * 8e9)
    # many rows per pass: the same weights feed more arithmetic, and the matmul peak binds
    wide = roofline.rollout_decode(shape, rows=512, prompt_length=21, completion_length=16, dtype_bytes=4)
    assert limits.bound(wide) == "compute" and limits.attainable(wide) == 200e9
    shares = roofline.share(decode, decode.flops / limits.attainable(decode), limits)
    assert shares["share_of_attainable"] == pytest.approx(1.0) and shares["share_of_peak"] < 1.0


def test_step_record_has_perf_mfu_only_with_a_measured_peak():
    data = make_step_data(flops=3e12, peak_flops_per_s=200e9)
    data.seconds["step"] = 20.0
    assert step_record(data)[MFU] == pytest.approx(3e12 / 20.0 / 200e9)
    assert MFU not in step_record(make_step_data())
