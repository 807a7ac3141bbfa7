"""Peak memory of loading a GGUF file's weights with the base kept quantized, against the loaded model's size.

The goal: the load holds about the loaded model plus one tensor, at most 1.5x the loaded model. Two figures
for the weights' load (gguf.empty_model + gguf.fill_model, as load_gguf runs them; the tokenizer is built
before and apart): MLX's own peak (its arrays: what Metal memory holds on a Mac) and the process's resident
memory above what it held before, sampled every 5 ms (MLX, numpy's chunk temporaries, the file's pages
read). Byte counts, not times: the same on a busy machine.

    python benchmarks/gguf_load_peak.py                      # gemma-3-270m Q4_K_M (downloaded on first use)
    python benchmarks/gguf_load_peak.py FILE.gguf --dtype float32
"""

from __future__ import annotations

import argparse
import json
import threading
from pathlib import Path

import mlx.core as mx
import psutil

from mlx_grpo.models.gguf import (
    GGUF_ARCHITECTURES,
    _kept_bits,
    _mlx_name,
    empty_model,
    fill_model,
    kept_note,
    read_config,
    read_gguf,
)
from mlx_grpo.models.policy import parameter_bytes


class ResidentPeak(threading.Thread):
    """The process's largest resident size while it runs."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.done = psutil.Process().memory_info().rss, threading.Event()

    def run(self):
        process = psutil.Process()
        while not self.done.wait(0.005):
            self.peak = max(self.peak, process.memory_info().rss)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", help="a .gguf file (default: gemma-3-270m Q4_K_M)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                        help="the run's dtype: scales, biases and plain weights (default: a Mac's, bfloat16)")
    args = parser.parse_args()
    if args.file:
        path = Path(args.file)
    else:
        from mlx_grpo.models.gemma3 import gemma3_path

        path = gemma3_path(download=True)
    header, config = read_gguf(path), read_config(path)  # the header, outside the measured load
    family = GGUF_ARCHITECTURES[header.metadata["general.architecture"]]
    quantized = _kept_bits(header, family)
    names = [_mlx_name(name, family) for name in header.tensors if name != "rope_freqs.weight"]
    plain = {k: v for k, v in config.items() if k != "quantization"}
    mx.reset_peak_memory()
    before = psutil.Process().memory_info().rss
    sampler = ResidentPeak()
    sampler.start()
    model = empty_model(plain, names, quantized)
    errors = fill_model(model, path, header, config, quantized, getattr(mx, args.dtype))
    sampler.done.set()
    sampler.join()
    resident_peak = sampler.peak - before
    note = kept_note(sorted({k[1] for k in errors}), errors, getattr(mx, args.dtype))
    loaded = parameter_bytes(model)
    print(json.dumps({"file": str(path), "file_mb": round(path.stat().st_size / 1e6, 1), "dtype": args.dtype,
                      "loaded_model_mb": round(loaded / 1e6, 1),
                      "mlx_peak_mb": round(mx.get_peak_memory() / 1e6, 1),
                      "mlx_peak_over_model": round(mx.get_peak_memory() / loaded, 2),
                      "process_peak_above_start_mb": round(resident_peak / 1e6, 1),
                      "process_peak_over_model": round(resident_peak / loaded, 2), "note": note}, indent=1))


if __name__ == "__main__":
    main()
