"""Tool-call formats (multi_turn.format): model text → the calls it makes, and what could not be parsed.

`hermes` (Qwen2.5/Qwen3, NousResearch Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any
number of them; `qwen` and `qwen25` (the names SGLang's parser gives Qwen 2.5's format, which older veRL scripts
pass) are the same format. `llama3_json` (Llama 3.1/3.2 JSON tool calling): the message is `{"name": ..., "parameters":
{...}}` (optionally after `<|python_tag|>`), several separated by `;`. A call that is not valid JSON or lacks a
name is reported as malformed (the model is told so), never guessed at.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from verlx.utils.registry import Registry

# tool-call formats of veRL and SGLang that verlx has no parser for, and what each is
MISSING_FORMATS = {
    "gpt-oss": "the gpt-oss (harmony) tool-call format",
    "spo": "the SPO recipe's code-block tool-call format",
    "llama3": "SGLang's llama3 (pythonic) tool-call format (verlx: llama3_json)",
    "mistral": "the Mistral tool-call format",
    "deepseekv3": "the DeepSeek-V3 tool-call format",
    "pythonic": "the pythonic tool-call format",
    "kimi_k2": "the Kimi K2 tool-call format",
    "qwen3_coder": "the Qwen3-Coder (XML) tool-call format",
    "glm45": "the GLM-4.5 tool-call format",
}


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedTurn:
    calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)  # why each unparseable call was rejected

    @property
    def has_calls(self) -> bool:
        return bool(self.calls or self.malformed)


TOOL_PARSERS: Registry[Callable[[str], ParsedTurn]] = Registry(
    "tool-call format", "actor_rollout_ref.rollout.multi_turn.format", import_paths=True)
_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def _call_from_json(text: str, args_key: str, out: ParsedTurn) -> None:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        out.malformed.append(f"not valid JSON ({e.msg} at position {e.pos}): {text.strip()[:200]!r}")
        return
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        out.malformed.append(f"a tool call must be a JSON object with a string 'name': {text.strip()[:200]!r}")
        return
    arguments = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(arguments, str):  # some models double-encode the arguments
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    out.calls.append(ToolCall(obj["name"], arguments))


@TOOL_PARSERS.register("qwen25")
@TOOL_PARSERS.register("qwen")
@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedTurn:
    out = ParsedTurn()
    for body, closing in _HERMES.findall(text):
        if not closing:
            out.malformed.append(f"<tool_call> without </tool_call>: {body.strip()[:200]!r}")
            continue
        _call_from_json(body, "arguments", out)
    return out


@TOOL_PARSERS.register("llama3_json")
def parse_llama3_json(text: str) -> ParsedTurn:
    out = ParsedTurn()
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    elif not body.startswith("{"):
        return out  # plain text: an answer, not a call
    for part in _split_top_level(body):
        _call_from_json(part, "parameters", out)
    return out


def _split_top_level(text: str) -> list[str]:
    """Split on ';' outside JSON strings and brackets."""
    parts, depth, start, in_string, escaped = [], 0, 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == ";" and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]
