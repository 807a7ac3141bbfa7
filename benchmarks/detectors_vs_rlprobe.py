"""format_gaming, repetition and bimodal_reward against rlprobe's and rldoctor's detectors on the same runs.

    python -m venv /tmp/oracle && /tmp/oracle/bin/pip install rlprobe rldoctor   # outside oracles, not dependencies
    python benchmarks/detectors_vs_rlprobe.py --oracle-python /tmp/oracle/bin/python [--markdown]

Runs: rlprobe's own synthetic generator (healthy, format_gaming, repetition_spiral; 200 steps, onset at 100),
our synthetic runs (tests/synthetic_runs.py: healthy, a graded reward, format gaming, a repetition spiral and a
bimodal split; 120 steps, the fault from step 40) and the measured runs in tests/data. Each run is read by our
built-in rules (the first alert of each of the three detectors), by rlprobe's doctor (FORMAT_GAMING,
REPETITION_SPIRAL, with the step it says the pathology began) and by rldoctor (every WARNING or CRITICAL
detector, whole log, our names and TRL's). The oracles run in their own interpreter (`--oracle-python`),
this script's second mode (`--oracle`), so neither is imported by mlx-grpo.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DETECTORS = ("format_gaming", "repetition", "bimodal_reward")
PROBE_IDS = ("FORMAT_GAMING", "REPETITION_SPIRAL")

# rlprobe's step fields and ours
PROBE_TO_OURS = {"reward_mean": "rewards/total/mean", "reward_std": "rewards/total/std",
                 "repetition_rate": "completions/repetition_rate", "entropy_mean": "policy/entropy",
                 "kl_mean": "policy/kl", "grad_norm": "policy/grad_norm",
                 "completion_len_mean": "completions/length/mean",
                 "clip_fraction": "policy/clip_frac", "truncation_rate": "completions/truncated_frac",
                 "zero_variance_group_frac": "rewards/zero_std_group_frac"}


# ----------------------------------------------------------------------------- the oracles' side (their venv)

def _probe_view(records: list[dict]):
    from rlprobe.doctor.runview import RunView
    from rlprobe.schemas import RunManifest, StepRecord

    ours_to_probe = {v: k for k, v in PROBE_TO_OURS.items()}
    steps = []
    for r in records:
        fields = {ours_to_probe[k]: v for k, v in r.items() if k in ours_to_probe and v is not None}
        components = {k.split("/")[1]: v for k, v in r.items()
                      if k.startswith("rewards/") and k.endswith("/mean") and k.count("/") == 2
                      and k != "rewards/total/mean" and v is not None}
        steps.append(StepRecord(step=int(r["step"]), timestamp=float(r["step"]), reward_components=components,
                                **fields))
    manifest = RunManifest(run_id="x", created_at="2026-01-01T00:00:00+00:00", algorithm="grpo", model_name="m",
                           trainer_config={}, environment={}, notes="")
    return RunView(manifest, steps)


def _probe_findings(records: list[dict]) -> dict[str, int | None]:
    from rlprobe.doctor.engine import diagnose_view

    return {f.signature_id: f.first_step for f in diagnose_view(_probe_view(records)) if f.signature_id in PROBE_IDS}


def _rldoctor_findings(variants: list[list[dict]]) -> list[str]:
    from rl_doctor.detectors.base import Severity
    from rl_doctor.diagnosis import diagnose
    from rl_doctor.ingest.base import run_from_records

    found: set[str] = set()
    for records in variants:
        try:
            findings = diagnose(run_from_records(records)).findings
            found |= {f.detector for f in findings if f.severity >= Severity.WARNING}
        except ValueError:
            pass
    return sorted(found)


def oracle_main() -> None:
    """Read {"cases": [{name, records, trl}]} on stdin; generate rlprobe's own runs; print every verdict."""
    import tempfile

    from rlprobe.doctor.runview import RunView
    from rlprobe.testing.synth import generate_run

    cases = json.load(sys.stdin)["cases"]
    with tempfile.TemporaryDirectory() as tmp:
        for pathology in (None, "format_gaming", "repetition_spiral"):
            view = RunView.load(generate_run(Path(tmp) / str(pathology), pathology, n_steps=200, seed=0))
            records = []
            for i in range(view.n):
                record = {"step": view.step_at(i) + 1}
                for field, ours in PROBE_TO_OURS.items():
                    value = view.series(field)[i]
                    if value == value:  # not NaN
                        record[ours] = float(value)
                for name in view.component_names:
                    record[f"rewards/{name}/mean"] = float(view.component(name)[i])
                records.append(record)
            cases.append({"name": f"rlprobe synthetic: {pathology or 'healthy'} (onset 101)", "records": records,
                          "trl": None})
    out = []
    for case in cases:
        variants = [case["records"]] + ([case["trl"]] if case["trl"] else [])
        out.append({"name": case["name"], "records": case["records"], "rlprobe": _probe_findings(case["records"]),
                    "rldoctor": _rldoctor_findings(variants)})
    json.dump(out, sys.stdout)


# ----------------------------------------------------------------------------- our side

def our_cases() -> list[dict]:
    sys.path.insert(0, str(REPO / "tests"))
    from synthetic_runs import Faults, simulate

    from mlx_grpo.telemetry.metrics.other_names import OTHER_NAMES

    to_trl = {o.answers[0]: o.name for o in OTHER_NAMES if o.source == "trl" and len(o.answers) == 1
              and "<" not in o.answers[0] and "{" not in o.name}
    cases = []
    for label, shape in (("healthy", {}), ("healthy, graded reward", {"graded": True}),
                         ("format gaming", {"format_gaming": True}), ("repetition spiral", {"repetition": True}),
                         ("bimodal split, graded reward", {"graded": True, "bimodal": True})):
        records = simulate(120, 0, Faults(fault_step=40, **shape), shape_metrics=True)[0]
        cases.append({"name": f"our synthetic: {label}" + (" (fault from 40)" if label[:7] != "healthy" else ""),
                      "records": records})
    for path in sorted((REPO / "tests" / "data").glob("run_*.jsonl")):
        cases.append({"name": f"measured: {path.stem}",
                      "records": [json.loads(line) for line in path.read_text().splitlines()]})
    for case in cases:
        case["trl"] = [{to_trl.get(k, k): v for k, v in r.items()} for r in case["records"]]
    return cases


def ours_first(records: list[dict]) -> dict[str, int]:
    from mlx_grpo.telemetry.alerts.config import default_rules
    from mlx_grpo.telemetry.alerts.engine import AlertEngine

    first: dict[str, int] = {}
    for alert in AlertEngine(default_rules()).check_all(records):
        if alert.rule in DETECTORS:
            first.setdefault(alert.rule, alert.step)
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oracle", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--oracle-python", help="an interpreter with rlprobe and rldoctor installed")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if args.oracle:
        return oracle_main()
    if not args.oracle_python:
        parser.error("--oracle-python is required (an interpreter with rlprobe and rldoctor)")
    result = subprocess.run([args.oracle_python, __file__, "--oracle"], input=json.dumps({"cases": our_cases()}),
                            capture_output=True, text=True, check=True)
    rows = []
    for case in json.loads(result.stdout):
        ours = ours_first(case["records"])
        rows.append((case["name"], ", ".join(f"`{r}` {s}" for r, s in ours.items()) or "none",
                     ", ".join(f"{i} (onset {s})" for i, s in case["rlprobe"].items())
                     or "none", ", ".join(case["rldoctor"]) or "none"))
    if args.markdown:
        print("| run | ours: first step of each detector | rlprobe 0.1 (FORMAT_GAMING, REPETITION_SPIRAL) "
              "| rldoctor 0.2 (every WARNING+ detector, whole log) |\n|---|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in rows:
            print(" | ".join(row))


if __name__ == "__main__":
    main()
