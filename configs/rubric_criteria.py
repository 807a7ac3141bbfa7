"""Rule criteria for configs/rubric_code.yaml.

Each function has the reward-function signature
    fn(prompts, completions, answers, **columns) -> list[float | None]
and returns one score in 0..1 per completion (None = cannot be scored). Only the standard
library is used, so the file works wherever the rubric is loaded.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

TEST_TIMEOUT_S = 5.0
_FENCED = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

# Runs in a separate interpreter: defines the answer's code, then runs each test on its own so
# one failing assert does not hide the others. The answer's own prints go to /dev/null; the
# result goes to the real stdout as the last line.
_HARNESS = r"""
import json, os, sys
job = json.loads(sys.stdin.read())
out = sys.stdout
sys.stdout = open(os.devnull, "w")
namespace = {"__name__": "__answer__"}
passed = 0
try:
    exec(compile(job["code"], "<answer>", "exec"), namespace)
except BaseException:
    pass
else:
    for test in job["tests"]:
        try:
            exec(compile(test, "<test>", "exec"), namespace)
            passed += 1
        except BaseException:
            pass
out.write("\n" + json.dumps({"passed": passed}) + "\n")
out.flush()
"""


def extract_code(completion: str) -> str:
    """The code of an answer: first fenced block, else the <answer> tag's content, else everything."""
    fenced = _FENCED.search(completion)
    if fenced:
        return fenced.group(1)
    tagged = _ANSWER.search(completion)
    return tagged.group(1) if tagged else completion


def tests_passed(prompts, completions, answers, tests=None, **columns):
    """Fraction of the `tests` column's asserts that pass against the answer's code.

    This RUNS MODEL-WRITTEN CODE: in a separate `python -I -S` process, in an empty temporary
    directory, with a minimal environment and a time limit. That stops accidents (infinite loops,
    stray prints, a crash), not a hostile program; use it on your own machine for your own data.
    """
    if tests is None:
        raise ValueError("the dataset has no 'tests' column (assert statements for each prompt)")
    jobs = [(extract_code(c), _test_list(t)) for c, t in zip(completions, tests)]
    # Each check waits on a child process, so threads overlap them even on few cores.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return list(pool.map(lambda job: _run_tests(*job), jobs))


def loop_nesting(prompts, completions, answers, **columns):
    """1 when loops nest at most once, 0.5 at two levels, 0 at three or more; 0 for code that does not parse.

    A rough proxy for efficiency: deep nesting is the usual sign of a quadratic-or-worse approach.
    """
    scores = []
    for completion in completions:
        tree = _parse(extract_code(completion))
        if tree is None:
            scores.append(0.0)
            continue
        depth = _loop_depth(tree)
        scores.append(1.0 if depth <= 1 else 0.5 if depth == 2 else 0.0)
    return scores


def docstrings(prompts, completions, answers, **columns):
    """Fraction of function and class definitions with a docstring; 0 when there are none or it does not parse."""
    scores = []
    for completion in completions:
        tree = _parse(extract_code(completion))
        definitions = [] if tree is None else [
            node for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        if not definitions:
            scores.append(0.0)
            continue
        documented = sum(ast.get_docstring(node) is not None for node in definitions)
        scores.append(documented / len(definitions))
    return scores


def _test_list(tests) -> list[str]:
    if tests is None:
        return []
    if isinstance(tests, str):
        return [line for line in tests.splitlines() if line.strip()]
    return [str(t) for t in tests if str(t).strip()]


def _run_tests(code: str, tests: list[str]) -> float | None:
    if not tests:
        return None  # nothing to check this answer against
    job = json.dumps({"code": code, "tests": tests})
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONHASHSEED": "0"}
    with tempfile.TemporaryDirectory(prefix="rubric-tests-") as workdir:
        try:
            done = subprocess.run([sys.executable, "-I", "-S", "-c", _HARNESS], input=job, capture_output=True,
                                  text=True, timeout=TEST_TIMEOUT_S, cwd=workdir, env=env)
        except subprocess.TimeoutExpired:
            return 0.0
    lines = done.stdout.strip().splitlines()
    try:
        passed = json.loads(lines[-1])["passed"]
    except (IndexError, ValueError, KeyError, TypeError):
        return 0.0  # the answer killed the interpreter (os._exit, a segfault...) before the report
    return passed / len(tests)


def _parse(code: str) -> ast.AST | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _loop_depth(node: ast.AST, depth: int = 0) -> int:
    """Deepest loop nesting below `node`: statements in a loop body count one level deeper."""
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
        # The header and the else branch run outside the loop body, so they stay at this depth.
        header = [node.iter] if isinstance(node, (ast.For, ast.AsyncFor)) else [node.test]
        outer = [_loop_depth(n, depth) for n in header + node.orelse]
        inner = [_loop_depth(n, depth + 1) for n in node.body]
        return max([depth + 1] + outer + inner)
    if isinstance(node, _COMPREHENSIONS):
        depth += len(node.generators)  # [.. for a in x for b in y] nests two loops
    return max([depth] + [_loop_depth(child, depth) for child in ast.iter_child_nodes(node)])
