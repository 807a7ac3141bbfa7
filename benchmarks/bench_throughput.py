"""Throughput benchmark, standalone: the same measurement as `mlx-grpo bench`, printed as a table
and then as JSON (schema: docs/bench_schema.json).

    python benchmarks/bench_throughput.py                       # the shipped model, default shapes
    python benchmarks/bench_throughput.py --model path/to/model --lora --batch-size 8 --output out.json

Takes every flag of `mlx-grpo bench` (see `mlx-grpo bench --help`). On Linux it restarts itself
once with the system OpenBLAS preloaded, as the `mlx-grpo` command does; MLX_GRPO_OPENBLAS=0
keeps MLX's reference BLAS.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlx_grpo.planning import blas


def preload_openblas() -> None:
    """Restart this script with OpenBLAS preloaded (it must be loaded before MLX to take effect)."""
    blas.reexec_with_openblas([str(Path(__file__).resolve()), *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    from mlx_grpo.commands import bench
    from mlx_grpo.common.errors import UserError

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    bench.add_arguments(parser)
    args = parser.parse_args(argv)
    preload_openblas()
    from mlx_grpo.measuring.benchmark import run_bench

    try:
        report = run_bench(bench.options_from_args(args))
    except UserError as err:
        print(f"bench_throughput: error: {err}", file=sys.stderr)
        return 2
    text = json.dumps(report, indent=2)
    if args.output:
        Path(args.output).write_text(text + "\n")
    bench.print_report(report)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
