"""Where one decode step's time goes: the rollout's step taken apart on a real or preset model.

A batch of `--rows` rows over a KV cache of `--context` positions (prompts prefilled as the rollout does,
`rollout.prefill_plain`), then each part of a decode step timed alone, interleaved, medians in ms:
  step          model forward + sampling, as rollout._generate runs it (models/cpu_kernels.py)
  blocks        the transformer blocks alone (no LM head)
  lm_head       the LM head matmul on [rows, hidden], as the model does it and through a [hidden, vocab]
                copy (which the rollout once made: on this machine it costs more than it saves)
  sample        sampling from [rows, vocab] float32 logits
  attention     every block's attention (with its cache read) alone, as the rollout runs it
                (cpu_kernels.cpu_kernels) and as mlx-lm's attention alone would
  mlp           every block's MLP alone
and the floor a decode step cannot beat on this machine: the weights read once (`weight_bytes` / the
bandwidth `machine.stream_gb_s` measures) next to the matmul FLOPs at `machine.matmul_peak_flops`.

    python benchmarks/decode_profile.py --model-id qwen2.5-coder-0.5b --rows 16 --context 400
    python benchmarks/decode_profile.py --preset qwen2.5-0.5b --layers 2 --rows 8 --context 256
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from mlx_grpo.models.cpu_kernels import cpu_kernels
from mlx_grpo.models.policy import lm_head, project_to_vocab
from mlx_grpo.planning.machine import matmul_peak_flops, stream_gb_s
from mlx_grpo.rollout import prefill_plain
from mlx_grpo.sampling import SamplingSettings, sample_tokens


def load(args: argparse.Namespace):
    if args.preset:
        from mlx_grpo.planning.presets import preset_model

        return preset_model(args.preset, layers=args.layers)
    from mlx_grpo.config.train_config import TrainConfig
    from mlx_grpo.models.policy import load_policy_for_training

    return load_policy_for_training(TrainConfig(model_id=args.model_id, use_lora=args.lora), Path.cwd()).model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-id", default="qwen2.5-coder-0.5b")
    parser.add_argument("--preset", help="a random-weight preset model instead of --model-id")
    parser.add_argument("--layers", type=int)
    parser.add_argument("--lora", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8, help="rows per prompt")
    parser.add_argument("--context", type=int, default=400, help="positions already in the KV cache")
    parser.add_argument("--repetitions", type=int, default=5)
    args = parser.parse_args()
    model = load(args)
    model.eval()
    vocab = lm_head(model).weight.shape[0]
    prompts = [[int(t) for t in mx.random.randint(1, 1000, (args.context,)).tolist()]
               for _ in range(args.rows // args.group_size)]
    rows = mx.repeat(mx.arange(len(prompts)), args.group_size)
    logits, cache = prefill_plain(model, prompts, 0, args.context + 64, __import__("numpy").array(rows.tolist()))
    mx.eval(logits, [c.state for c in cache])
    ids = mx.argmax(logits, axis=-1)[:, None]
    hidden = model.model(ids, cache=cache)
    mx.eval(hidden)
    head = lm_head(model)
    settings = SamplingSettings(temperature=1.0)
    key = mx.random.key(0)
    blocks = model.model.layers
    x = mx.random.normal((args.rows, 1, hidden.shape[-1])) * 0.1
    mask = None

    def rewind(n: int = 1) -> None:
        for c in cache:  # the same context length for every timed call
            c.trim(n)

    head_t = mx.contiguous(head.weight.T)

    def step():
        with cpu_kernels(model):
            mx.eval(sample_tokens(model(ids, cache=cache)[:, -1, :], settings, key))
        rewind()

    def body():
        with cpu_kernels(model):
            mx.eval(model.model(ids, cache=cache))
        rewind()

    def attention(ours: bool = True):
        with cpu_kernels(model) if ours else nullcontext():
            mx.eval([b.self_attn(b.input_layernorm(x), mask, c) for b, c in zip(blocks, cache)])
        rewind()

    def mlp():
        with cpu_kernels(model):
            mx.eval([b.mlp(b.post_attention_layernorm(x)) for b in blocks])

    cases = {"step": step, "blocks": body, "lm_head": lambda: mx.eval(project_to_vocab(head, hidden[:, -1, :])),
             "lm_head ([hidden, vocab] copy)": lambda: mx.eval(hidden[:, -1, :] @ head_t),
             "sample": lambda: mx.eval(sample_tokens(logits, settings, key)), "attention": attention,
             "attention (mlx-lm's)": lambda: attention(ours=False), "mlp": mlp}
    times: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.repetitions + 1):
        for name, run in cases.items():
            start = time.perf_counter()
            run()
            if rep:
                times[name].append((time.perf_counter() - start) * 1000)
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    # a head of its own leaves the embedding table unread but for the step's rows
    read = weights - (model.model.embed_tokens.weight.nbytes if "lm_head" in model else 0)
    kv = sum(c.keys[..., :args.context, :].nbytes + c.values[..., :args.context, :].nbytes for c in cache)
    bandwidth, peak = stream_gb_s(), matmul_peak_flops()
    flops = 2 * args.rows * sum(v.size for _, v in tree_flatten(model.parameters()))
    print(json.dumps({
        "shape": {k: v for k, v in vars(args).items()}, "vocab": vocab,
        "weights_gb": round(weights / 1e9, 3), "read_per_step_gb": round(read / 1e9, 3),
        "kv_cache_gb": round(kv / 1e9, 3),
        "floor_ms": {"read weights + cache once": round((read + kv) / (bandwidth * 1e9) * 1000, 1),
                     "matmul FLOPs at peak": round(flops / peak * 1000, 1),
                     "bandwidth_gb_s": round(bandwidth, 1), "peak_gflops": round(peak / 1e9, 1)},
        "ms": {name: round(statistics.median(t), 1) for name, t in times.items()},
    }, indent=2))


if __name__ == "__main__":
    import sys

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])
    main()
