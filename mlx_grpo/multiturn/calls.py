"""Tool calls in a model's turn, in the model's own format.

When mlx-lm knows the tokenizer's tool-calling format (its `tool_call_start`, `tool_call_end` and
`tool_parser`, inferred from the chat template), that is used; otherwise the Hermes/Qwen format the common
templates teach, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, read with mlx-lm's own JSON tool
parser. A call that cannot be read (bad JSON, no name, arguments that are not an object, an unclosed tag) is a
`Malformed` call: the model is told what was wrong, as the tool's result, and it is counted as a failure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class Malformed:
    text: str  # what was between the tags (cut)
    reason: str


@dataclass
class CallFormat:
    start: str
    end: str
    parse: Callable[[str, Any], Any]  # mlx-lm's tool_parser signature: (text, tools) -> dict or list of dicts


def call_format(tokenizer: Any) -> CallFormat:
    """The tokenizer's tool-call format per mlx-lm, else the Hermes/Qwen one."""
    if getattr(tokenizer, "has_tool_calling", False) and getattr(tokenizer, "tool_parser", None) is not None:
        return CallFormat(tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser)
    from mlx_lm.tool_parsers.json_tools import parse_tool_call
    return CallFormat(HERMES_START, HERMES_END, parse_tool_call)


def parse_calls(text: str, fmt: CallFormat, tools: list[dict] | None = None) -> list[ToolCall | Malformed]:
    """Every tool call in a model turn, in order. A turn without the format's tags whose JSON object names one
    of `tools` (bare, or in a ```json block) is read as that call: small instruct models often drop the tags
    their template asks for (Qwen2.5-Coder-0.5B-Instruct wrote none in 28 sampled turns)."""
    if fmt.start not in text:
        return untagged_calls(text, tools)
    calls: list[ToolCall | Malformed] = []
    position = 0
    while (start := text.find(fmt.start, position)) >= 0:
        body_start = start + len(fmt.start)
        end = text.find(fmt.end, body_start) if fmt.end else len(text)
        if end < 0:
            calls.append(Malformed(text[body_start:body_start + 200], f"no closing {fmt.end}"))
            break
        calls.extend(_read_call(text[body_start:end], fmt, tools))
        position = end + len(fmt.end)
    return calls


def _read_call(body: str, fmt: CallFormat, tools: list[dict] | None) -> list[ToolCall | Malformed]:
    try:
        parsed = fmt.parse(body, tools)
    except Exception as exc:  # noqa: BLE001 - each parser raises its own errors on text a model wrote
        return [Malformed(body[:200], f"the call is not valid JSON ({type(exc).__name__})")]
    out: list[ToolCall | Malformed] = []
    for item in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            out.append(Malformed(body[:200], "a call needs a \"name\""))
            continue
        arguments = item.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            out.append(Malformed(body[:200], "\"arguments\" must be a JSON object"))
            continue
        out.append(ToolCall(item["name"], arguments))
    return out


def untagged_calls(text: str, tools: list[dict] | None) -> list[ToolCall | Malformed]:
    """JSON objects in the text that name one of `tools` and carry its arguments: {"name": ..., "arguments": {...}}."""
    names = {t["function"]["name"] for t in tools or []}
    decoder = json.JSONDecoder()
    calls: list[ToolCall | Malformed] = []
    position = text.find("{")
    while position >= 0:
        try:
            item, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        if isinstance(item, dict) and item.get("name") in names and "arguments" in item:
            calls.extend(_read_call(json.dumps(item), CallFormat("", "", lambda body, _: json.loads(body)), tools))
        position = text.find("{", end)
    return calls
