"""Reward functions as TRL's documentation writes them: completions (plain strings or chat messages), the
dataset's columns by name, **kwargs for the rest."""
import re


def _text(completion):
    return completion if isinstance(completion, str) else completion[0]["content"]


def accuracy(completions, solution, **kwargs):
    found = [re.search(r"<answer>(.*?)</answer>", _text(c)) for c in completions]
    return [1.0 if m and m.group(1).strip() == s else 0.0 for m, s in zip(found, solution)]


def fmt(completions, **kwargs):
    pattern = r"^<reasoning>.*?</reasoning><answer>.*?</answer>$"
    return [1.0 if re.match(pattern, _text(c), re.S) else 0.0 for c in completions]
