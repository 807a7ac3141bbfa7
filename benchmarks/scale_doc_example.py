"""Regenerate docs/SCALE.md's example `mlx-grpo plan` output from the command itself, so it cannot go stale.

    python benchmarks/scale_doc_example.py          # rewrite the block in docs/SCALE.md
    python benchmarks/scale_doc_example.py --check  # exit 1 when the block differs from today's output

The block is the fenced one right after the "## `mlx-grpo plan`" heading: its first line is the command
(`$ mlx-grpo plan ...`, with a continuation line), the rest is what that command prints.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
from pathlib import Path

SCALE = Path(__file__).resolve().parent.parent / "docs" / "SCALE.md"
ARGS = ["--set", "model_id=preset:qwen2.5-1.5b", "--set", "use_lora=true", "--set", "lora_rank=16",
        "--set", "batch_size=4", "--set", "max_generation_steps=1024", "--set", "dtype=bfloat16", "--memory", "16GB"]
BLOCK = re.compile(r"(## `mlx-grpo plan`\n\n```\n)(.*?)(```\n)", re.S)


def example() -> str:
    output = subprocess.run([sys.executable, "-m", "mlx_grpo.cli", "plan", *ARGS], capture_output=True, text=True)
    if output.returncode not in (0, 1):  # 1: the configured settings do not fit
        raise SystemExit(f"mlx-grpo plan failed ({output.returncode}):\n{output.stderr}")
    words = shlex.join(ARGS).split(" --set batch_size")
    command = f"$ mlx-grpo plan {words[0]} \\\n    --set batch_size{words[1]}\n"
    return command + output.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = SCALE.read_text()
    match = BLOCK.search(text)
    if match is None:
        raise SystemExit(f"{SCALE}: no fenced block after the '## `mlx-grpo plan`' heading")
    fresh = example()
    if args.check:
        same = match.group(2) == fresh
        print("up to date" if same else f"stale; today's output:\n{fresh}")
        return 0 if same else 1
    SCALE.write_text(text[:match.start(2)] + fresh + text[match.end(2):])
    print(fresh, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
