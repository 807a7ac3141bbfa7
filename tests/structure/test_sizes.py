"""Rooms of a size one can read: no module of the package over 500 lines (the metric catalogue's table
apart: one row a metric, read as a table), no function over 60. Read from the syntax tree, so a function's
length is its `def` line to its last line, docstring and nested functions included.
`python tests/structure/test_sizes.py` prints the largest of each."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "mlx_grpo"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60
LONG_MODULES_ALLOWED = {"telemetry/metrics/catalogue.py"}  # the table of every metric, a row each


def module_lines() -> dict[str, int]:
    return {path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
            for path in sorted(PACKAGE.rglob("*.py"))}


def function_lines(source: str) -> dict[str, int]:
    """Each function's (and method's) length in lines, by its qualified name in the module."""
    found = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found[name] = child.end_lineno - child.lineno + 1
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def long_functions() -> dict[str, int]:
    return {f"{path.relative_to(PACKAGE).as_posix()}:{name}": lines
            for path in sorted(PACKAGE.rglob("*.py"))
            for name, lines in function_lines(path.read_text(encoding="utf-8")).items()
            if lines > MAX_FUNCTION_LINES}


def test_no_module_is_over_500_lines():
    long = {name: lines for name, lines in module_lines().items()
            if lines > MAX_MODULE_LINES and name not in LONG_MODULES_ALLOWED}
    assert long == {}


def test_no_function_is_over_60_lines():
    assert long_functions() == {}


def test_the_scan_measures_functions_methods_and_nested_functions():
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    source = f"def long():\n{body}\n\nclass A:\n    def short(self):\n        def inner():\n            pass\n"
    assert function_lines(source) == {"long": 61, "A.short": 3, "A.short.inner": 2}
    assert len(module_lines()) > 90 and max(module_lines().values()) > MAX_MODULE_LINES  # the catalogue: found


if __name__ == "__main__":
    for name, lines in sorted(module_lines().items(), key=lambda item: item[1])[-10:]:
        print(f"{lines:6d}  {name}")
    for name, lines in sorted(long_functions().items(), key=lambda item: item[1]):
        print(f"{lines:6d}  {name}")
