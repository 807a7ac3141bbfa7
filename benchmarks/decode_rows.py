"""Would decoding only the unfinished rows pay? Decode-step time against the number of rows.

When most completions of a rollout have ended, the batch keeps decoding every row (finished rows are
masked, not removed). Dropping finished rows saves what the step time saves when the batch shrinks: this
script times one decode step of a preset's model at N = 32, 16, 8, 4 rows over a KV cache of the same
length, and prints the ratio to the full batch. float32; interleaved repetitions, medians.

    python benchmarks/decode_rows.py --preset qwen2.5-0.5b --layers 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlx_grpo.planning.presets import preset_model
from mlx_grpo.sampling import SamplingSettings, sample_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--context", type=int, default=320, help="tokens already in the KV cache")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repetitions", type=int, default=3)
    args = parser.parse_args()
    model = preset_model(args.preset, layers=args.layers)
    vocab = model.args.vocab_size
    runners = {}
    for rows in (32, 16, 8, 4):
        cache = make_prompt_cache(model)
        prompt = mx.random.randint(1, vocab, (rows, args.context))
        logits = model(prompt, cache=cache)[:, -1, :]
        mx.eval(logits, [c.state for c in cache])

        def decode(rows=rows, cache=cache, logits=logits) -> float:
            start = time.perf_counter()
            step_logits = logits
            for t in range(args.steps):
                ids, _ = sample_tokens(step_logits, SamplingSettings(temperature=1.0), mx.random.key(t))
                step_logits = model(ids[:, None], cache=cache)[:, -1, :]
                mx.eval(step_logits)
            for c in cache:  # back to the same context length for the next repetition
                c.offset -= args.steps
            return (time.perf_counter() - start) / args.steps

        decode()  # warm-up
        runners[rows] = decode
    seconds: dict[int, list[float]] = {rows: [] for rows in runners}
    for _ in range(args.repetitions):
        for rows, run in runners.items():
            seconds[rows].append(run())
    full = statistics.median(seconds[32])
    print(json.dumps({"shape": vars(args), "decode_step_ms": {
        rows: {"ms": round(statistics.median(s) * 1000, 1), "vs_32_rows": round(statistics.median(s) / full, 2)}
        for rows, s in seconds.items()}}, indent=2))


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux: ~20x the matmuls
    main()
