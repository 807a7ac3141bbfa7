"""Summarise a run's per-token entropy dumps (`<run dir>/entropy/step_<N>.npz`).

    python -m mlx_grpo.tools.summarize_entropy runs/my-run            # one line per dumped step
    python -m mlx_grpo.tools.summarize_entropy runs/my-run --json     # the same numbers as JSON
    python -m mlx_grpo.tools.summarize_entropy runs/my-run --positions 12

Per step: rows, completion tokens, entropy and varentropy mean / median / p90 / max over
real completion tokens; then the mean entropy at each completion position over all dumps
(where in a completion the policy is unsure). File format: mlx_grpo/extras/entropy_dump.py.
Needs only numpy.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from mlx_grpo.extras.entropy_dump import list_dumps, read_dump


def _describe(values: np.ndarray, prefix: str) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {f"{prefix}_mean": float(values.mean()), f"{prefix}_median": float(np.median(values)),
            f"{prefix}_p90": float(np.percentile(values, 90)), f"{prefix}_max": float(values.max())}


def summarize_dump(arrays: dict[str, np.ndarray]) -> dict[str, float]:
    """Statistics of one dump over its real completion tokens."""
    mask = arrays["response_mask"].astype(bool)
    return {"step": int(arrays["step"]), "rows": int(mask.shape[0]), "tokens": int(mask.sum()),
            **_describe(arrays["entropy"][mask], "entropy"), **_describe(arrays["varentropy"][mask], "varentropy")}


def entropy_by_position(dumps: list[dict[str, np.ndarray]], positions: int) -> list[float | None]:
    """Mean entropy at completion positions 0..positions-1 over every dump (None where no token sits)."""
    totals, counts = np.zeros(positions), np.zeros(positions)
    for arrays in dumps:
        width = min(positions, arrays["entropy"].shape[1])
        mask = arrays["response_mask"][:, :width].astype(bool)
        totals[:width] += np.where(mask, arrays["entropy"][:, :width], 0.0).sum(axis=0)
        counts[:width] += mask.sum(axis=0)
    return [float(t / c) if c else None for t, c in zip(totals, counts)]


def summarize_run(run_dir: Path, positions: int = 16) -> dict:
    paths = list_dumps(run_dir)
    if not paths:
        raise FileNotFoundError(f"{run_dir}: no entropy dumps (train with entropy_logging.enable: true)")
    dumps = [read_dump(p) for p in paths]
    return {"steps": [summarize_dump(d) for d in dumps], "entropy_by_position": entropy_by_position(dumps, positions)}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(summary: dict) -> str:
    columns = ("step", "rows", "tokens", "entropy_mean", "entropy_median", "entropy_p90", "entropy_max",
               "varentropy_mean", "varentropy_median", "varentropy_p90")
    lines = ["  ".join(f"{c:>17}" if i > 2 else f"{c:>6}" for i, c in enumerate(columns))]
    for row in summary["steps"]:
        cells = [f"{row[c]:>6}" for c in columns[:3]] + [f"{_fmt(row.get(c)):>17}" for c in columns[3:]]
        lines.append("  ".join(cells))
    lines.append("")
    lines.append("mean entropy (nats) by completion position: "
                 + " ".join(_fmt(v) for v in summary["entropy_by_position"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--positions", type=int, default=16, help="completion positions in the by-position line")
    args = parser.parse_args(argv)
    try:
        summary = summarize_run(args.run_dir, args.positions)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
