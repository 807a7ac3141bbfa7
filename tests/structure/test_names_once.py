"""Names once: a run directory's files are spelled only by RunPaths (telemetry/rundir/layout.py), and the
per-step names (`step_<N>`) only there and in checkpoint.py. Read from the code's syntax tree, so a comment or
a docstring may still name a file; a string that builds a path may not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mlx_grpo.telemetry.rundir.layout import RunPaths

PACKAGE = Path(__file__).resolve().parents[2] / "mlx_grpo"
LAYOUT = "telemetry/rundir/layout.py"
STEP_NAME_HOMES = {LAYOUT, "checkpoint.py"}
STEP_NAME = re.compile(r"\.?step_(\Z|[\d*(\\{])")  # step_4, step_*, step_(\d+), an f-string's step_{...}


def run_file_names() -> set[str]:
    """Every name RunPaths gives, read from RunPaths itself (a new file is covered the day it is added)."""
    root = Path("/run")
    paths = RunPaths(root)
    names = set()
    for attribute, value in vars(RunPaths).items():
        if isinstance(value, property) and isinstance(path := getattr(paths, attribute), Path) and path != root:
            names.add(path.relative_to(root).as_posix())
    return names


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def path_parts(tree: ast.AST) -> set[int]:
    """The string constants a path is built from: `x / "name"`, `Path(x, "name")`, `x.joinpath("name")`."""
    parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            parts.update({id(node.left), id(node.right)})
        elif isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr in ("joinpath", "join")
                    or isinstance(func, ast.Name) and func.id == "Path"):
                parts.update(id(arg) for arg in node.args)
    return parts


def spelled_names(source: str, where: str, names: set[str]) -> list[str]:
    """Run-file names and step-name formats `source` spells outside their homes."""
    tree = ast.parse(source)
    skip, in_paths, found = docstrings(tree), path_parts(tree), []
    for node in ast.walk(tree):
        # an f-string's literal parts are constants too: f"step_{n}" is the constant "step_" then n
        if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in skip:
            continue
        text = node.value
        if where != LAYOUT and text in names and ("." in text or id(node) in in_paths):
            found.append(f"{where}:{node.lineno}: run file {text!r} (use RunPaths)")
        if where not in STEP_NAME_HOMES and STEP_NAME.match(text):
            found.append(f"{where}:{node.lineno}: step name {text!r} (use layout.checkpoint_name/RunPaths)")
    return sorted(found)


def test_run_files_and_step_names_are_spelled_once():
    names = run_file_names()
    assert {"run.json", "metrics.jsonl", "checkpoints", "completions"} <= names
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += spelled_names(path.read_text(encoding="utf-8"), path.relative_to(PACKAGE).as_posix(), names)
    assert found == []


def test_the_scan_catches_a_spelled_file_and_a_step_name():
    names = run_file_names()
    source = ('"""Reads run.json."""\n'
              'def f(run_dir, step):\n'
              '    """The checkpoints/step_<N> folder."""\n'
              '    a = run_dir / "checkpoints" / f"step_{step}"\n'
              '    b = open(run_dir + "/" + "run.json")\n'
              '    c = glob.glob(".step_*.tmp")\n'
              '    return {"checkpoints": 1, "completions": [], "timing": "step_s"}\n')
    found = spelled_names(source, "run/loop.py", names)
    assert found == [
        "run/loop.py:4: run file 'checkpoints' (use RunPaths)",
        "run/loop.py:4: step name 'step_' (use layout.checkpoint_name/RunPaths)",
        "run/loop.py:5: run file 'run.json' (use RunPaths)",
        "run/loop.py:6: step name '.step_*.tmp' (use layout.checkpoint_name/RunPaths)",
    ]
    assert spelled_names(source, LAYOUT, names) == []  # their home
    in_checkpoint = spelled_names(source, "checkpoint.py", names)  # the step name's other home
    assert [line.replace("checkpoint.py", "run/loop.py") for line in in_checkpoint] == [found[0], found[2]]
