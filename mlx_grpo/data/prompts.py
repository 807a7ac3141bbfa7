"""Prompts as the model sees them: the epoch-shuffled order over the rows, the chat template, the cut to
max_prompt_length, and the longest prompt of a dataset. Imports no mlx."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .rows import _transcript


@dataclass
class PromptOrder:
    """Epoch-shuffled order over the training rows, resumable from (epoch, position)."""

    num_rows: int
    seed: int
    epoch: int = 0
    position: int = 0

    def _permutation(self, epoch: int) -> list[int]:
        # Shuffling 20,000 rows costs ~20 ms: once per epoch, not once per step.
        cached = getattr(self, "_cached", None)
        if cached is None or cached[0] != epoch:
            order = list(range(self.num_rows))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._cached = cached = (epoch, order)
        return cached[1]

    def next_indices(self, count: int) -> list[int]:
        """The next `count` rows. The epoch advances as soon as its last row is drawn, so `epoch`
        changes during the step that finishes an epoch (the step that closes it in the metrics)."""
        out: list[int] = []
        while len(out) < count:
            if self.position >= self.num_rows:  # a checkpoint saved at an epoch's end by an older version
                self.epoch, self.position = self.epoch + 1, 0
            out.append(self._permutation(self.epoch)[self.position])
            self.position += 1
            if self.position == self.num_rows:
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


@dataclass
class EncodedPrompt:
    tokens: list[int]
    truncated: bool


def render_prompt(tokenizer: Any, text: str, system_prompt: str | None, use_chat_template: bool,
                  messages: list[dict] | None = None, tools: list[dict] | None = None) -> str | list[int]:
    """The prompt as the model sees it: through the chat template when the tokenizer has one. A
    conversational row's `messages` are the conversation itself (the system prompt goes first unless
    the conversation has its own)."""
    conversation = list(messages) if messages else [{"role": "user", "content": text}]
    if system_prompt and conversation[0]["role"] != "system":
        conversation.insert(0, {"role": "system", "content": system_prompt})
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        extra = {"tools": tools} if tools else {}  # the tools' schemas, which the template shows the model
        return tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True, **extra)
    return "\n".join(m["content"] for m in conversation)


# No token spans more characters than this: text further left than max_prompt_length tokens of this size
# cannot survive the cut, so it is dropped before tokenizing (a 10 MB prompt would otherwise be tokenized
# whole every time it is drawn).
MAX_CHARS_PER_TOKEN = 64


def encode_prompt(tokenizer: Any, text: str, config: Any, messages: list[dict] | None = None,
                  tools: list[dict] | None = None) -> EncodedPrompt:
    """Token ids of one prompt (or conversation), cut from the left to max_prompt_length."""
    keep_chars = config.max_prompt_length * MAX_CHARS_PER_TOKEN
    if messages is None:
        cut = len(text) > keep_chars
        if cut:
            text = text[-keep_chars:]
    else:  # a conversation loses its oldest text first, to the same budget
        cut = sum(len(m["content"]) for m in messages) > keep_chars
        if cut:
            kept, budget = [], keep_chars
            for message in reversed(messages):
                content = message["content"][-budget:] if budget > 0 else ""
                budget -= len(content)
                kept.append({**message, "content": content})
            messages = kept[::-1]
    rendered = render_prompt(tokenizer, text, config.system_prompt, config.use_chat_template, messages, tools)
    tokens = list(rendered) if not isinstance(rendered, str) else tokenizer.encode(rendered)
    if hasattr(tokens, "get"):  # some tokenizers return a BatchEncoding
        tokens = list(tokens["input_ids"])
    limit = config.max_prompt_length
    if len(tokens) > limit:
        return EncodedPrompt(tokens[-limit:], True)
    return EncodedPrompt(tokens, cut)


def longest_prompt(tokenizer: Any, rows: list[dict], config: Any, exact: int = 64,
                   tools: list[dict] | None = None) -> int:
    """Tokens of the longest prompt among `rows`, encoded as the trainer encodes it (chat template, system
    prompt, cut to max_prompt_length). Every prompt's text is counted in one batch call of the tokenizer;
    the `exact` longest by that count are then encoded exactly."""
    keep_chars = config.max_prompt_length * MAX_CHARS_PER_TOKEN
    # a conversation is cut like a plain prompt: a 10 MB message tokenized whole took gigabytes
    texts = [(_transcript(row["messages"]) if row.get("messages") else row["prompt"])[-keep_chars:] for row in rows]
    batch = getattr(tokenizer, "_tokenizer", tokenizer)(texts, add_special_tokens=False)
    counts = [len(ids) for ids in batch["input_ids"]]
    longest = sorted(range(len(rows)), key=counts.__getitem__, reverse=True)[:exact]
    return max((len(encode_prompt(tokenizer, rows[i]["prompt"], config, rows[i].get("messages"), tools).tokens)
                for i in longest), default=0)
