"""One dataset record as a row: GSM8K's answers, conversational prompts, the reference-answer column under
its other tools' names, and every problem named where it is."""

from __future__ import annotations

import re
import sys
from typing import Any

from ..common.errors import UserError

GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$", re.S)


def _gsm8k_answer(text: str, where: str) -> str:
    match = GSM8K_ANSWER.search(text)
    if match is None:
        raise UserError(f"{where}: GSM8K answer has no final '#### <number>' line")
    return match.group(1).replace(",", "").strip()


def _messages(value: list, where: str, field: str) -> list[dict]:
    """A conversational prompt: chat messages with string roles and contents, ending with the user's turn."""
    if not value or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                            for m in value):
        raise UserError(f"{where}: field '{field}' is a list, so it must hold messages "
                        '{"role": "...", "content": "..."}')
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _transcript(messages: list[dict]) -> str:
    """A conversation as text, for reward functions, samples and logs."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


# Other tools' names for the reference answer, tried in this order when a dataset has no `answer` column (and
# answer_field is left at its default): TRL's and open-r1's `solution`, then names other GRPO datasets use, then
# the `completion` of mlx-lm's and TRL's prompt/completion rows. With none of them, the rows are prompts only.
ANSWER_LIKE = ("solution", "ground_truth", "reference_answer", "final_answer", "expected_answer", "target",
               "completion")
_said: set[str] = set()  # notes already printed: the trainer, its memory plan and evaluation each read the rows


def _say_once(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(f"mlx-grpo: note: {text}", file=sys.stderr)


def answer_column(columns: Any, answer_field: str, where: str) -> str | None:
    """The column holding the reference answer: `answer_field` when the data has it; else, for the default
    `answer`, the first of ANSWER_LIKE it has, said in a note; None (prompts only) when it has none."""
    if answer_field in columns:
        return answer_field
    if answer_field != "answer":  # the user named the column: it must be there
        raise UserError(f"{where}: missing field '{answer_field}' (answer_field; the data has "
                        f"{', '.join(repr(str(c)) for c in columns) or 'no fields'})")
    found = next((name for name in ANSWER_LIKE if name in columns), None)
    if found is not None:
        _say_once(f"{where.split(':')[0]}: no 'answer' column; '{found}' is read as the reference answer "
                  f"(answer_field: {found})")
    else:
        _say_once(f"{where.split(':')[0]}: no answer column ({', '.join(('answer',) + ANSWER_LIKE)}): prompts "
                  "only, for rewards that need no reference answer")
    return found


# Reward functions get these as arguments; a dataset column of the same name would collide with them.
REWARD_ARGUMENTS = frozenset({"prompts", "completions", "answers"})


def _row(record: dict, where: str, fmt: str, prompt_field: str, answer_field: str | None) -> dict:
    """One dataset record (a JSONL object or a table row) as a row; problems are reported at `where`. With
    no `answer_field` (prompts only) the row's answer is empty."""
    if fmt == "auto":
        fmt = "gsm8k" if "question" in record and prompt_field not in record else "prompt_answer"
    if fmt == "gsm8k":
        for key in ("question", "answer"):
            if not isinstance(record.get(key), str):
                raise UserError(f"{where}: GSM8K row needs a string '{key}' field")
        row = {k: v for k, v in record.items() if k not in ("question", "answer")}
        row.update(prompt=record["question"], answer=_gsm8k_answer(record["answer"], where))
    else:
        for key in (prompt_field, answer_field):
            if key is not None and key not in record:
                raise UserError(f"{where}: missing field '{key}' (the row has "
                                f"{', '.join(repr(str(k)) for k in record) or 'no fields'})")
        prompt = record[prompt_field]
        messages = _messages(prompt, where, prompt_field) if isinstance(prompt, list) else None
        if messages is None and not isinstance(prompt, str):
            raise UserError(f"{where}: field '{prompt_field}' must be a string or a list of messages "
                            "({\"role\": ..., \"content\": ...})")
        answer = record[answer_field] if answer_field is not None else ""
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            raise UserError(f"{where}: field '{answer_field}' must be a string or a number, got "
                            f"{'null' if answer is None else type(answer).__name__}")
        row = {k: v for k, v in record.items() if k not in (prompt_field, answer_field)}
        row.update(prompt=prompt if messages is None else _transcript(messages), answer=str(answer))
        if answer_field not in (None, "answer", *REWARD_ARGUMENTS):
            row[answer_field] = answer  # TRL passes every column under its own name: `solution` stays `solution`
        if messages is not None:
            row["messages"] = messages
    for key in ("prompt", "answer"):
        try:
            row[key].encode("utf-8")
        except UnicodeEncodeError as err:  # a JSON \ud800 escape: no tokenizer takes it
            raise UserError(f"{where}: field '{prompt_field if key == 'prompt' else answer_field}' is not valid "
                            f"text (a lone surrogate, {err.object[err.start]!a}); fix or drop the row") from None
    shadowing = sorted(REWARD_ARGUMENTS & set(row))
    if shadowing:
        raise UserError(f"{where}: column '{shadowing[0]}' has the name of a reward function's own argument "
                        "(prompts, completions, answers): rename it")
    return row
