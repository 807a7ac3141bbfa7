"""What sampling costs per decode step at a real vocabulary, next to the LM head's own matmul.

For N rows of V logits (float32): plain sampling (log-softmax + categorical), top-k by a full sort
against a partition, top-p (a full sort is needed: the kept mass depends on the order), min-p; and the
LM head of the decode step that produced the logits (N x hidden @ hidden x V). Interleaved repetitions,
medians in milliseconds.

    python benchmarks/sampling_cost.py --rows 32 --vocab 151936 --hidden 1536
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlx.core as mx

from mlx_grpo.sampling import SamplingSettings, sample_tokens


def top_k_by_sort(logits: mx.array, k: int) -> mx.array:
    kth = mx.sort(logits, axis=-1)[..., -k][..., None]
    return mx.where(logits < kth, -mx.inf, logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--repetitions", type=int, default=7)
    args = parser.parse_args()
    hidden = mx.random.normal((args.rows, args.hidden))
    head = mx.random.normal((args.vocab, args.hidden)) * 0.02
    # A trained LM's next-token distribution is peaked (its top thousand tokens hold nearly all the mass);
    # random weights give a flat one. Both are timed: top-p sorts only the top candidates on the first.
    flat = hidden @ head.T
    logits = flat * 8.0
    key = mx.random.key(0)
    mx.eval(hidden, head, logits, flat)

    cases = {
        "LM head matmul (the decode step's last layer)": lambda: hidden @ head.T,
        "sample (no filter)": lambda: sample_tokens(logits, SamplingSettings(temperature=1.0), key),
        "sample, top_k 50 (partition)": lambda: sample_tokens(logits, SamplingSettings(1.0, top_k=50), key),
        "top_k 50 by a full sort (before)": lambda: top_k_by_sort(logits, 50),
        "sample, top_p 0.9 (peaked logits)": lambda: sample_tokens(logits, SamplingSettings(1.0, top_p=0.9), key),
        "sample, top_p 0.9 (flat logits: full sort)": lambda: sample_tokens(flat, SamplingSettings(1.0, top_p=0.9),
                                                                            key),
        "sample, min_p 0.05": lambda: sample_tokens(logits, SamplingSettings(1.0, min_p=0.05), key),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.repetitions + 1):
        for name, run in cases.items():
            start = time.perf_counter()
            mx.eval(run())
            if rep:  # the first round compiles and fills caches
                times[name].append((time.perf_counter() - start) * 1000)
    print(json.dumps({"shape": vars(args),
                      "median_ms": {name: round(statistics.median(t), 2) for name, t in times.items()}}, indent=2))


if __name__ == "__main__":
    import sys
    from pathlib import Path

    from mlx_grpo.planning.blas import reexec_with_openblas

    reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])  # OpenBLAS on Linux: ~20x the matmuls
    main()
