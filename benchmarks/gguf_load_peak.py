"""Peak memory of loading a GGUF file with its base kept quantized, against the loaded model's size.

The goal (issue 47): the load holds about the loaded model plus one tensor, at most 1.5x the loaded model.
Two figures: MLX's own peak (the arrays, what Metal memory would hold on a Mac) and the process's resident
peak above what it held before the load (MLX, numpy's chunk temporaries and the tokenizer together).
Exact on any machine load: these are byte counts, not times.

    python benchmarks/gguf_load_peak.py                      # gemma-3-270m Q4_K_M (downloaded on first use)
    python benchmarks/gguf_load_peak.py FILE.gguf --dtype float32
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

import mlx.core as mx
import psutil

from mlx_grpo.gguf import load_gguf, read_gguf
from mlx_grpo.models import parameter_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="a .gguf file (default: gemma-3-270m Q4_K_M)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="the run's dtype: scales, biases and plain weights (default: a Mac's, bfloat16)")
    args = parser.parse_args()
    if args.file:
        path = Path(args.file)
    else:
        from mlx_grpo.gemma3 import gemma3_path

        path = gemma3_path(download=True)
    read_gguf(path)  # the header, outside the measured load
    mx.reset_peak_memory()
    before = psutil.Process().memory_info().rss
    model, _, _, note = load_gguf(path, keep_quantized=True, dtype=getattr(mx, args.dtype))
    resident_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before  # Linux: KiB
    loaded = parameter_bytes(model)
    print(json.dumps({"file": str(path), "file_mb": round(path.stat().st_size / 1e6, 1), "dtype": args.dtype,
                      "loaded_model_mb": round(loaded / 1e6, 1),
                      "mlx_peak_mb": round(mx.get_peak_memory() / 1e6, 1),
                      "mlx_peak_over_model": round(mx.get_peak_memory() / loaded, 2),
                      "process_peak_above_start_mb": round(resident_peak / 1e6, 1),
                      "process_peak_over_model": round(resident_peak / loaded, 2), "note": note}, indent=1))


if __name__ == "__main__":
    main()
