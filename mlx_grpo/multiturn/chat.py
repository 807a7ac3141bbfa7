"""The tokens that follow a model's turn: the end of its turn as the chat template writes it, the messages the
environment answered with, and the opening of the model's next turn, through the tokenizer's chat template.

The template renders whole conversations, so the continuation is the difference of two renderings of a
stand-in conversation: one ending with an assistant turn, one with the new messages after it and the
generation prompt. The model's own end-of-turn token, when it wrote one, is not repeated."""

from __future__ import annotations

from typing import Any

_MARK = "\u2063MLX_GRPO_TURN\u2063"  # stand-in for the model's turn: text no template rewrites


def render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)


def continuation_text(tokenizer: Any, messages: list[dict], tools: list[dict] | None, ended_with: str) -> str:
    """Text between the model's last token (`ended_with`: its end-of-turn token's text, or "" when the turn
    was cut by its budget) and its next turn's first token."""
    if not getattr(tokenizer, "chat_template", None):  # a plain model: the messages on lines of their own
        return "".join(f"\n{m['content']}\n" for m in messages)
    stand_in = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _MARK}]
    before = render(tokenizer, stand_in, tools, False)
    after = render(tokenizer, stand_in + messages, tools, True)
    if not after.startswith(before):
        # templates that rewrite earlier turns: keep what follows the model's turn in the longer rendering
        before = after[:after.index(_MARK) + len(_MARK)] + before[before.index(_MARK) + len(_MARK):]
        before = before if after.startswith(before) else after[:after.index(_MARK) + len(_MARK)]
    turn_end = before[before.index(_MARK) + len(_MARK):]
    if ended_with and turn_end.startswith(ended_with):
        turn_end = turn_end[len(ended_with):]
    return turn_end + after[len(before):]


def continuation_tokens(tokenizer: Any, messages: list[dict], tools: list[dict] | None, ended_with: str) -> list[int]:
    text = continuation_text(tokenizer, messages, tools, ended_with)
    encode = getattr(tokenizer, "_tokenizer", tokenizer)
    ids = encode(text, add_special_tokens=False)
    return list(ids["input_ids"] if hasattr(ids, "get") or isinstance(ids, dict) else ids)
