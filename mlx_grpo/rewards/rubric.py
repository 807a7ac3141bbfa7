"""Rubric files: a named set of weighted criteria that score completions.

A rubric is read from YAML (safe-loaded only), validated completely on load, and every mistake is a
one-line `UserError` naming the file, the line, the criterion and the key. The format is documented
in docs/RUBRICS.md. Scoring a batch gives a `RubricScores`: one 0..1 score per criterion and sample
(NaN where a criterion could not score) and the weighted rubric score per sample.

No mlx here: rubrics are plain Python so tests, tools and the dashboard can load them anywhere.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from ..common.errors import UserError
from ..common.secrets import register_secret
from ..common.user_files import parse_yaml, read_user_text
from .judge import PLACEHOLDERS, Judge, JudgeConfig, JudgeError, chat_completions_url
from .rubric_scorers import (
    CriterionFailed,
    JudgeScorer,
    LengthScorer,
    NumericAnswerScorer,
    PythonScorer,
    RegexScorer,
    SubstringScorer,
)

SCORERS = ("regex", "substring", "length", "numeric_answer", "python", "judge")
# Rubric and criterion names become metric names (criteria/<rubric>/<criterion>/mean).
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
_COMMON_KEYS = {"name", "weight", "scorer", "description"}
_SCORER_KEYS = {
    "regex": {"pattern", "match", "flags", "negate"},
    "substring": {"text", "require", "case_sensitive", "negate"},
    "length": {"min", "max", "unit", "slack"},
    "numeric_answer": {"tolerance", "require_tags"},
    "python": {"file", "function"},
    "judge": {"prompt", "prompt_file", "range"},
}
_REGEX_FLAGS = {"ignorecase": re.IGNORECASE, "multiline": re.MULTILINE, "dotall": re.DOTALL}
_JUDGE_KEYS = {"url", "model", "api_key_env", "timeout", "retries", "backoff", "concurrency", "max_tokens",
               "temperature", "system"}


@dataclass(frozen=True)
class Criterion:
    name: str
    weight: float
    kind: str  # one of SCORERS
    description: str
    scorer: Callable  # see rubric_scorers: (prompts, completions, answers, columns) -> scores


@dataclass
class RubricScores:
    """One scored batch: per-criterion matrix and weighted rubric score per sample."""

    rubric: str
    criteria: tuple[str, ...]
    weights: tuple[float, ...]
    matrix: np.ndarray  # shape (samples, criteria), 0..1 for rule criteria, NaN = missing
    total: list[float | None]  # weighted mean over the criteria that scored; None if none did
    errors: list[JudgeError] = field(default_factory=list)  # judge requests that gave no score
    failures: dict[str, str] = field(default_factory=dict)  # criterion -> why its python function failed
    api_tokens: int = 0  # judge tokens spent on this batch
    judge_requests: int = 0  # HTTP requests sent, retries included

    def column(self, criterion: str) -> np.ndarray:
        return self.matrix[:, self.criteria.index(criterion)]


@dataclass(frozen=True)
class Rubric:
    name: str
    description: str
    criteria: tuple[Criterion, ...]
    path: Path
    judge: Judge | None  # the one endpoint this rubric may contact, when it has judge criteria

    def describe(self) -> str:
        """The "Loaded rubric" line the caller prints or logs."""
        parts = ", ".join(f"{c.name} ({c.kind}, weight {c.weight:g})" for c in self.criteria)
        return f"Loaded rubric '{self.name}' with {len(self.criteria)} criteria: {parts}"

    @property
    def weights(self) -> dict[str, float]:
        return {c.name: c.weight for c in self.criteria}

    def score(self, prompts: list[str], completions: list[str], answers: list[str], **columns) -> RubricScores:
        """Score a batch against every criterion.

        The rubric score of a sample is sum(weight * score) / sum(weight) over the criteria that
        scored it, so a judge that failed for one sample does not drag that sample to zero.
        """
        n = len(completions)
        if len(prompts) != n or len(answers) != n:
            raise ValueError(f"got {len(prompts)} prompts, {n} completions and {len(answers)} answers")
        matrix = np.full((n, len(self.criteria)), np.nan)
        errors: list[JudgeError] = []
        failures: dict[str, str] = {}
        tokens = requests = 0
        for j, criterion in enumerate(self.criteria):
            try:
                result = criterion.scorer(prompts, completions, answers, columns)
            except CriterionFailed as failed:
                failures[criterion.name] = str(failed)
                continue  # the column stays NaN: missing for this batch
            if criterion.kind == "judge":
                errors.extend(result.errors)
                tokens += result.api_tokens
                requests += result.requests
                result = result.scores
            matrix[:, j] = [np.nan if v is None else v for v in result]

        weights = np.array([c.weight for c in self.criteria])
        scored = ~np.isnan(matrix)
        weight_sum = (scored * weights).sum(axis=1)
        weighted = np.where(scored, matrix, 0.0) @ weights
        total = [float(w / s) if s > 0 else None for w, s in zip(weighted, weight_sum)]
        return RubricScores(self.name, tuple(c.name for c in self.criteria), tuple(weights.tolist()),
                            matrix, total, errors, failures, tokens, requests)


def load_rubric(path: str | os.PathLike) -> Rubric:
    """Read and validate a rubric file; every problem is a UserError naming file, line and key."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: rubric file not found")
    text = read_user_text(path, "rubric file")
    data = parse_yaml(text, str(path))  # first: it refuses duplicate keys and nesting too deep for compose
    lines = _line_numbers(yaml.compose(text, Loader=yaml.SafeLoader))

    root = _Section(path, lines, (), "rubric", data)
    root.require_mapping()
    root.check_keys({"name", "description", "judge", "criteria"})
    name = root.name("name")
    description = root.string("description", default="")
    items = root.get("criteria", required=True)
    if not isinstance(items, list) or not items:
        raise root.fail("criteria", "must be a non-empty list of criteria")

    sections = [_criterion_section(root, i, item) for i, item in enumerate(items)]
    judge = None
    if any(s.data.get("scorer") == "judge" for s in sections):
        judge = _build_judge(root)
    elif "judge" in data:
        raise root.fail("judge", "no criterion uses scorer: judge")

    criteria: list[Criterion] = []
    seen: set[str] = set()
    for section in sections:
        criterion = _build_criterion(section, judge)
        if criterion.name in seen:
            raise section.fail("name", f"duplicate criterion name {criterion.name!r}")
        seen.add(criterion.name)
        criteria.append(criterion)
    if not any(c.weight > 0 for c in criteria):
        raise root.fail("criteria", "at least one criterion needs a weight above 0")
    return Rubric(name, description, tuple(criteria), path, judge)


class _Section:
    """One mapping of the file plus where it is, so every error can point at file:line and key."""

    def __init__(self, path: Path, lines: dict[tuple, int], where: tuple, subject: str, data: Any):
        self.path, self.lines, self.where, self.subject, self.data = path, lines, where, subject, data

    def fail(self, key: str | None, message: str) -> UserError:
        where = self.where + ((key,) if key is not None else ())
        while where and where not in self.lines:
            where = where[:-1]
        line = self.lines.get(where, 1)
        label = self.subject if key is None else (key if self.subject == "rubric" else f"{self.subject}: {key}")
        return UserError(f"{self.path}:{line}: {label}: {message}")

    def require_mapping(self) -> None:
        if not isinstance(self.data, dict):
            raise self.fail(None, f"must be a mapping of keys, got {_kind(self.data)}")

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.fail(str(key), f"unknown key; expected one of {', '.join(sorted(allowed))}")

    def get(self, key: str, required: bool = False, default: Any = None) -> Any:
        if key not in self.data or self.data[key] is None:
            if required:
                raise self.fail(key, "required")
            return default
        return self.data[key]

    def string(self, key: str, required: bool = False, default: str | None = None) -> str | None:
        value = self.get(key, required, default)
        if value is not default and (not isinstance(value, str) or not value.strip()):
            raise self.fail(key, f"must be a non-empty string, got {_kind(value)}")
        return value

    def name(self, key: str) -> str:
        value = self.string(key, required=True)
        if not _NAME.fullmatch(value):
            raise self.fail(key, f"{value!r} must be lowercase letters, digits, '_' or '-' (it names metrics)")
        return value

    def number(self, key: str, default: float | None = None, minimum: float | None = None,
               above: float | None = None, integer: bool = False) -> float | None:
        value = self.get(key, default=default)
        if value is default:
            return value
        wanted = "an integer" if integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
            raise self.fail(key, f"must be {wanted}, got {_kind(value)}")
        if not math.isfinite(value):
            raise self.fail(key, f"must be finite, got {value}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be {wanted} >= {minimum:g}, got {value:g}")
        if above is not None and value <= above:
            raise self.fail(key, f"must be {wanted} > {above:g}, got {value:g}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default=default)
        if not isinstance(value, bool):
            raise self.fail(key, f"must be true or false, got {_kind(value)}")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.get(key, default=default)
        if value not in options:
            raise self.fail(key, f"must be one of {', '.join(options)}, got {value!r}")
        return value

    def file(self, key: str) -> Path:
        """A path relative to the rubric file's directory that must exist."""
        relative = self.string(key, required=True)
        target = (self.path.parent / relative).resolve()
        if not target.is_file():
            raise self.fail(key, f"file not found: {target}")
        return target


def _criterion_section(root: _Section, index: int, item: Any) -> _Section:
    name = item.get("name") if isinstance(item, dict) else None
    subject = f"criterion {name!r}" if isinstance(name, str) and name else f"criteria[{index}]"
    section = _Section(root.path, root.lines, ("criteria", index), subject, item)
    section.require_mapping()
    return section


def _build_criterion(section: _Section, judge: Judge | None) -> Criterion:
    name = section.name("name")
    kind = section.get("scorer", required=True)
    if kind not in SCORERS:
        raise section.fail("scorer", f"unknown scorer {kind!r}; expected one of {', '.join(SCORERS)}")
    section.check_keys(_COMMON_KEYS | _SCORER_KEYS[kind])
    weight = section.number("weight", minimum=0)
    if weight is None:
        raise section.fail("weight", "required")
    description = section.string("description", default="")
    build = {"regex": _regex, "substring": _substring, "length": _length, "numeric_answer": _numeric,
             "python": _python, "judge": lambda s: _judge_scorer(s, name, judge)}[kind]
    return Criterion(name, float(weight), kind, description, build(section))


def _regex(section: _Section) -> RegexScorer:
    pattern = section.string("pattern", required=True)
    flags_list = section.get("flags", default=[])
    if not isinstance(flags_list, list) or any(f not in _REGEX_FLAGS for f in flags_list):
        raise section.fail("flags", f"must be a list of {', '.join(_REGEX_FLAGS)}, got {flags_list!r}")
    flags = 0
    for flag in flags_list:
        flags |= _REGEX_FLAGS[flag]
    try:
        compiled = re.compile(pattern, flags)
    except re.error as err:
        raise section.fail("pattern", f"not a valid regular expression: {err}") from None
    full = section.choice("match", ("search", "full"), "search") == "full"
    return RegexScorer(compiled, full, section.boolean("negate", False))


def _substring(section: _Section) -> SubstringScorer:
    text = section.get("text", required=True)
    texts = [text] if isinstance(text, str) else text
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise section.fail("text", "must be a non-empty string or a list of non-empty strings")
    require_all = section.choice("require", ("all", "any"), "all") == "all"
    return SubstringScorer(tuple(texts), require_all, section.boolean("case_sensitive", True),
                           section.boolean("negate", False))


def _length(section: _Section) -> LengthScorer:
    low = section.number("min", minimum=0)
    high = section.number("max", minimum=0)
    if low is None and high is None:
        raise section.fail("min", "a length scorer needs min, max or both")
    if low is not None and high is not None and low > high:
        raise section.fail("max", f"must be >= min ({low:g}), got {high:g}")
    words = section.choice("unit", ("chars", "words"), "chars") == "words"
    return LengthScorer(low, high, words, section.number("slack", default=0, minimum=0))


def _numeric(section: _Section) -> NumericAnswerScorer:
    return NumericAnswerScorer(section.number("tolerance", default=0, minimum=0),
                               section.boolean("require_tags", False))


def _python(section: _Section) -> PythonScorer:
    file = section.file("file")
    function_name = section.string("function", required=True)
    module = _import_file(file, section)
    function = getattr(module, function_name, None)
    if function is None:
        raise section.fail("function", f"{file.name} defines no function {function_name!r}")
    if not callable(function):
        raise section.fail("function", f"{file.name}:{function_name} is not callable")
    return PythonScorer(function, f"{file.name}:{function_name}")


def _import_file(file: Path, section: _Section):
    # One module per file path, so two criteria naming the same file share its state and imports.
    module_name = "mlx_grpo_rubric_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise section.fail("file", f"cannot import {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up here
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's file: report its error in one line
        del sys.modules[module_name]
        detail = f"line {err.lineno}: {err.msg}" if isinstance(err, SyntaxError) else f"{type(err).__name__}: {err}"
        raise section.fail("file", f"importing {file.name} failed: {detail}") from err
    return module


def _judge_scorer(section: _Section, name: str, judge: Judge) -> JudgeScorer:
    inline = section.get("prompt")
    if (inline is None) == (section.get("prompt_file") is None):
        raise section.fail("prompt", "give exactly one of prompt or prompt_file")
    if inline is not None:
        template = section.string("prompt")
    else:
        prompt_file = section.file("prompt_file")
        template = prompt_file.read_text(encoding="utf-8")
    if "{completion}" not in template:
        raise section.fail("prompt", "the judge prompt must contain {completion} "
                           f"(placeholders: {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    bounds = section.get("range", required=True)
    if (not isinstance(bounds, list) or len(bounds) != 2
            or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) for b in bounds)
            or bounds[0] >= bounds[1]):
        raise section.fail("range", f"must be [low, high] with low < high, got {bounds!r}")
    return JudgeScorer(judge, name, template, float(bounds[0]), float(bounds[1]))


def _build_judge(root: _Section) -> Judge:
    block = root.get("judge")
    if block is None:
        raise root.fail("judge", "required when a criterion uses scorer: judge (give at least its url)")
    section = _Section(root.path, root.lines, ("judge",), "judge", block)
    section.require_mapping()
    section.check_keys(_JUDGE_KEYS)
    url = section.string("url", required=True)
    try:
        chat_completions_url(url)
    except ValueError as err:
        raise section.fail("url", str(err)) from None
    api_key = None
    env_name = section.string("api_key_env")
    if env_name is not None:
        api_key = os.environ.get(env_name)
        if not api_key:
            raise section.fail("api_key_env", f"environment variable {env_name} is not set")
        register_secret(api_key)  # whatever the variable is called, its value is never written
    defaults = JudgeConfig(url=url)
    config = JudgeConfig(
        url=url,
        model=section.string("model"),
        api_key=api_key,
        timeout_s=float(section.number("timeout", default=defaults.timeout_s, above=0)),
        retries=int(section.number("retries", default=defaults.retries, minimum=0, integer=True)),
        backoff_s=float(section.number("backoff", default=defaults.backoff_s, minimum=0)),
        concurrency=int(section.number("concurrency", default=defaults.concurrency, minimum=1, integer=True)),
        max_tokens=int(section.number("max_tokens", default=defaults.max_tokens, minimum=1, integer=True)),
        temperature=float(section.number("temperature", default=defaults.temperature, minimum=0)),
        system=section.string("system"),
    )
    return Judge(config)


def _line_numbers(node: yaml.Node | None) -> dict[tuple, int]:
    """Map key paths like ("criteria", 2, "weight") to 1-based line numbers of the YAML source."""
    lines: dict[tuple, int] = {}
    seen: set[int] = set()  # aliases can make the node graph cyclic

    def walk(current: yaml.Node, where: tuple) -> None:
        lines.setdefault(where, current.start_mark.line + 1)
        if id(current) in seen:
            return
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                if isinstance(key, yaml.ScalarNode):
                    lines[where + (key.value,)] = key.start_mark.line + 1  # point at the key, not the value
                    walk(value, where + (key.value,))
        elif isinstance(current, yaml.SequenceNode):
            for index, value in enumerate(current.value):
                walk(value, where + (index,))

    if node is not None:
        walk(node, ())
    return lines


def _kind(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return type(value).__name__
    return f"{type(value).__name__} {value!r}"
