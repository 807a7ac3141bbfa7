"""The step at which rldoctor first names each pathology against the step at which our alert rules do.

    pip install rldoctor
    python benchmarks/rldoctor_steps.py RUN_DIR_OR_METRICS_JSONL ... [--markdown]
    python benchmarks/rldoctor_steps.py --pathology-runs DIR   # writes the synthetic pathology runs first

rldoctor judges a whole log after the fact, so "first names it" is measured the way a user watching a run
would meet it: rldoctor is run on every prefix of the log (steps 1..k) and the first k whose finding for a
detector is WARNING or CRITICAL is its step. It reads our metric names through its own aliases and misses
some (rewards/total/mean, rewards/zero_std_group_frac); to give it every chance, each prefix is also given
to it with our names translated to TRL's (`mlx-grpo metrics --other-names`), and the earlier of the two
counts. Our step is the first alert of the built-in rules (any level) that covers the pathology, replaying
the same records through the alert engine, with the action that rule would take.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlx_grpo.telemetry.alerts.config import default_rules
from mlx_grpo.telemetry.alerts.engine import AlertEngine
from mlx_grpo.telemetry.metrics.other_names import OTHER_NAMES, canonical_record

# rldoctor's nine detectors and the built-in rules of ours that name the same pathology.
COVERS = {
    "advantage_collapse": ("zero_std_groups",),
    "entropy_collapse": ("entropy_collapse",),
    "reward_hacking": ("reward_hacking", "heldout_accuracy_drop", "reward_takeover"),
    "length_pathology": ("length_growth", "completions_truncated"),
    "clip_saturation": ("clip_saturation",),
    "kl_drift": ("kl_drift", "kl_high", "kl_flat"),
    "gradient_pathology": ("non_finite", "zero_gradient", "vanishing_gradient", "grad_norm_spike"),
    "reward_composition": ("reward_dominance", "constant_reward", "reward_takeover"),
    "plateau": ("kl_flat", "not_learning", "reward_stagnation"),
}

TO_TRL = {o.answers[0]: o.name for o in OTHER_NAMES if o.source == "trl" and len(o.answers) == 1
          and "<" not in o.answers[0] and "{" not in o.name}


def read_records(path: Path) -> list[dict]:
    if path.is_dir():
        path = path / "metrics.jsonl"
    records = [canonical_record(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if isinstance(r.get("step"), int)]


def to_trl(record: dict) -> dict:
    return {TO_TRL.get(k, k): v for k, v in record.items()}


def rldoctor_first(records: list[dict]) -> dict[str, tuple[int, str]]:
    """detector -> (first step with WARNING or CRITICAL, its severity) over every prefix of the records."""
    from rl_doctor.detectors.base import Severity
    from rl_doctor.diagnosis import diagnose
    from rl_doctor.ingest.base import run_from_records

    first: dict[str, tuple[int, str]] = {}
    for k in range(1, len(records) + 1):
        step = records[k - 1]["step"]
        for variant in (records[:k], [to_trl(r) for r in records[:k]]):
            try:
                diagnosis = diagnose(run_from_records(variant))
            except ValueError:
                continue
            for finding in diagnosis.findings:
                if finding.severity >= Severity.WARNING and finding.detector not in first:
                    first[finding.detector] = (step, finding.severity.name)
    return first


def ours_first(records: list[dict]) -> dict[str, tuple[int, str, str, str]]:
    """rule -> (first step it fires, level, action, message)."""
    first: dict[str, tuple[int, str, str, str]] = {}
    for alert in AlertEngine(default_rules()).check_all(records):
        first.setdefault(alert.rule, (alert.step, alert.level, alert.action, alert.message))
    return first


def compare(path: Path, cache: dict) -> list[dict]:
    records = read_records(path)
    key = f"{path.resolve()}:{len(records)}:{records[-1]['step']}"
    if key not in cache:  # rldoctor's answer depends on the records only: computed once
        cache[key] = rldoctor_first(records)
    theirs, ours = {k: tuple(v) for k, v in cache[key].items()}, ours_first(records)
    rows = []
    for detector, rules in COVERS.items():
        fired = sorted((ours[r][0], r) for r in rules if r in ours)
        if detector not in theirs and not fired:
            continue
        step, rule = fired[0] if fired else (None, None)
        rows.append({"run": path.name if path.is_dir() else path.stem, "pathology": detector,
                     "rldoctor": theirs.get(detector), "ours": (step, rule, *ours[rule][1:3]) if rule else None})
    return rows


def write_pathology_runs(out: Path) -> list[Path]:
    """Synthetic run directories (tests/synthetic_runs.py, 90 steps, the fault from step 40) for the
    pathologies no real short run provokes."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic_runs import Faults, simulate

    made = []
    for fault in ("entropy_collapse", "kl_blowup", "takeover", "collapse", "nan_loss", "clip_saturation",
                  "zero_gradient", "constant_reward"):
        records = simulate(90, 1, Faults(fault_step=40, **{fault: True}))[0]
        run = out / f"synthetic_{fault}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        made.append(run)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path)
    parser.add_argument("--pathology-runs", type=Path, help="write the synthetic pathology runs here and compare them")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--cache", type=Path, help="a JSON file keeping rldoctor's steps between invocations")
    args = parser.parse_args()
    runs = (write_pathology_runs(args.pathology_runs) if args.pathology_runs else []) + list(args.runs)
    cache = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
    rows = []
    for path in runs:
        rows += compare(path, cache)
        if args.cache:
            args.cache.write_text(json.dumps(cache))
    if not args.markdown:
        print(json.dumps(rows, indent=1))
        return
    print("| run | pathology | rldoctor first names it | we first name it (rule, level) | our action | |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        theirs = f"step {row['rldoctor'][0]} ({row['rldoctor'][1]})" if row["rldoctor"] else "never"
        ours = row["ours"]
        mine = f"step {ours[0]} (`{ours[1]}`, {ours[2]})" if ours else "never"
        action = ours[3] if ours else ""
        verdict = ("" if not row["rldoctor"] else "**later**" if ours is None or ours[0] > row["rldoctor"][0]
                   else "same" if ours[0] == row["rldoctor"][0] else "earlier")
        print(f"| {row['run']} | {row['pathology']} | {theirs} | {mine} | {action} | {verdict} |")


if __name__ == "__main__":
    main()
