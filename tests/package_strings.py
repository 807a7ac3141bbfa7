"""The string literals of the package's source, for tests that check a name or tag is spelled in one place."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

PACKAGE = Path(__file__).resolve().parents[1] / "mlx_grpo"


def string_literals() -> Iterator[tuple[str, int, str]]:
    """(module path relative to the repository, line, value) of every string constant in mlx_grpo/ that is
    not a docstring: docstrings may name things, code must not spell them."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        where = str(path.relative_to(PACKAGE.parent))
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                yield where, node.lineno, node.value
