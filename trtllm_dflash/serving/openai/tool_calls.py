"""Tool calls and structured output on the OpenAI API (issue 42): the request's grammar, and the
calls read back out of the answer's text.

A request's `response_format`, vLLM's `guided_json` / `guided_regex` / `guided_choice` (or their
`structured_outputs` form) and `tools` + `tool_choice` become one GrammarSpec the model compiles
(runtime/grammar.py): the front end needs no grammar engine. Tool calls follow the chat format of
the target's family, which is also what xgrammar's structural tag for that family enforces:

    qwen_3 (Qwen2/3, Hermes style)   <tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>
    llama  (Llama 3.1 JSON calls)    {"name": NAME, "parameters": ARGS}

gpt-oss's Harmony format is not served here (it needs its special tokens in the text, which the
model's detokenizer drops): such requests are refused in one line.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from trtllm_dflash.contracts.grammar_spec import GrammarSpec
from trtllm_dflash.serving.openai.schemas import OpenAIError

# config.json model_type -> the tool-call format of that family (xgrammar's structural tag name)
FAMILY_FORMATS = {
    "qwen2": "qwen_3",
    "qwen2_moe": "qwen_3",
    "qwen3": "qwen_3",
    "qwen3_moe": "qwen_3",
    "qwen3_next": "qwen_3",
    "qwen3_5": "qwen_3",
    "qwen3_5_moe": "qwen_3",
    "llama": "llama",
    "gpt_oss": "harmony",
}
# where a call starts in the text, per format
TRIGGERS = {"qwen_3": "<tool_call>", "llama": '{"name": '}
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice")


def tool_format_of(checkpoint: Path) -> str | None:
    """The tool-call format of a target directory's family (None: unknown family or no config)."""
    try:
        model_type = json.loads((Path(checkpoint) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
    return FAMILY_FORMATS.get(model_type)


def request_grammar(extra: dict, tool_format: str | None, model: str) -> GrammarSpec | None:
    """The one grammar a request's fields outside the schema (`extra`) ask for (None: none);
    OpenAIError 400 names a bad or double ask."""
    asks = []
    response_format = extra.get("response_format")
    if response_format and not (isinstance(response_format, dict) and response_format.get("type") == "text"):
        asks.append(("response_format", _response_format(response_format)))
    structured = extra.get("structured_outputs")
    if structured is not None:
        asks.append(("structured_outputs", _structured(structured)))
    for name in GUIDED_FIELDS:
        if extra.get(name) is not None:
            asks.append((name, _guided(name, extra[name])))
    tools, choice = extra.get("tools"), extra.get("tool_choice")
    if tools and choice != "none":
        asks.append(("tools", _tools(tools, choice, tool_format, model, extra.get("parallel_tool_calls") is not False)))
    elif choice not in (None, "none", "auto"):
        raise OpenAIError(400, "tool_choice names a tool but the request has no tools; send the tools too", "tool_choice")
    if len(asks) > 1:
        raise OpenAIError(400, f"{' and '.join(n for n, _ in asks)} each constrain the answer; send one of them", asks[1][0])
    return asks[0][1] if asks else None


def _response_format(value: Any) -> GrammarSpec:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return GrammarSpec("json_object")
    if kind == "json_schema":
        inner = value.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict):
            raise OpenAIError(400, "response_format.json_schema.schema must be a JSON schema object", "response_format")
        return GrammarSpec("json_schema", json.dumps(schema))
    raise OpenAIError(400, 'response_format.type must be "text", "json_object" or "json_schema"', "response_format")


def _structured(value: Any) -> GrammarSpec:
    if not isinstance(value, dict) or len([k for k in ("json", "regex", "choice") if value.get(k) is not None]) != 1:
        raise OpenAIError(400, "structured_outputs must hold exactly one of json, regex, choice", "structured_outputs")
    key = next(k for k in ("json", "regex", "choice") if value.get(k) is not None)
    return _guided(f"guided_{key}", value[key])


def _guided(name: str, value: Any) -> GrammarSpec:
    if name == "guided_json":
        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except json.JSONDecodeError as exc:
                raise OpenAIError(400, f"guided_json is not JSON ({exc.msg})", name) from None
        if not isinstance(schema, dict):
            raise OpenAIError(400, "guided_json must be a JSON schema object", name)
        return GrammarSpec("json_schema", json.dumps(schema))
    if name == "guided_regex":
        if not isinstance(value, str) or not value:
            raise OpenAIError(400, "guided_regex must be a non-empty string", name)
        return GrammarSpec("regex", value)
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise OpenAIError(400, "guided_choice must be a non-empty list of non-empty strings", name)
    return GrammarSpec("choice", json.dumps(value))


def _tools(tools: Any, choice: Any, tool_format: str | None, model: str, parallel: bool) -> GrammarSpec:
    if tool_format not in TRIGGERS:
        family = f"the {tool_format} format" if tool_format else "no tool-call format this server knows"
        raise OpenAIError(
            400,
            f"model '{model}' uses {family}; tool calls are served for Qwen/Hermes- and Llama-style targets",
            "tools",
            "unsupported_parameter",
        )
    if not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools):
        raise OpenAIError(400, 'tools must be a list of {"type": "function", "function": {"name": ..., "parameters": {...}}}', "tools")
    names = {t["function"]["name"] for t in tools}
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if wanted not in names:
            raise OpenAIError(400, f"tool_choice names {wanted!r}, which is not one of the request's tools", "tool_choice")
    elif choice not in (None, "auto", "required"):
        raise OpenAIError(
            400, 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice"
        )
    # parallel_tool_calls false: the answer ends after its first call
    return GrammarSpec(
        "tool_calls", json.dumps({"format": tool_format, "tools": tools, "tool_choice": choice or "auto", "parallel": parallel})
    )


def _is_function_tool(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    return (
        isinstance(function, dict)
        and isinstance(function.get("name"), str)
        and bool(function["name"])
        and isinstance(function.get("parameters", {}), dict)
    )


def parse_tool_calls(text: str, tool_format: str) -> tuple[str | None, list[dict]]:
    """(content before the calls or None, the calls as OpenAI's tool_calls) of an answer's text."""
    trigger = TRIGGERS[tool_format]
    start = text.find(trigger)
    if start < 0:
        return text, []
    calls, decoder, at = [], json.JSONDecoder(), start
    while at >= 0:
        body = at + (len(trigger) if tool_format == "qwen_3" else 0)
        try:
            value, end = decoder.raw_decode(text, body + (len(text[body:]) - len(text[body:].lstrip())))
        except json.JSONDecodeError:
            break  # an unfinished call (max_tokens): the text keeps it, no call is claimed
        arguments = value.get("arguments" if tool_format == "qwen_3" else "parameters") if isinstance(value, dict) else None
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not isinstance(arguments, dict):
            break
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": value["name"], "arguments": json.dumps(arguments)},
            }
        )
        at = text.find(trigger, end)
    if not calls:  # nothing complete: the text is the answer (cut by max_tokens, finish_reason "length")
        return text, []
    return (text[:start] if text[:start].strip() else None), calls  # as streamed: the text before the first call


class ToolCallStream:
    """Streamed text where calls may follow: content is sent up to where a call starts (a possible
    start is held back), the calls when the answer is complete (`finish`)."""

    def __init__(self, tool_format: str) -> None:
        self.tool_format, self.trigger = tool_format, TRIGGERS[tool_format]
        self.text, self.sent = "", 0

    def feed(self, delta: str) -> str:
        """The content that can be sent now."""
        self.text += delta
        start = self.text.find(self.trigger)
        if start < 0:  # hold back a tail that could still become the trigger
            start = len(self.text) - next((k for k in range(len(self.trigger) - 1, 0, -1) if self.text.endswith(self.trigger[:k])), 0)
        out, self.sent = self.text[self.sent : max(start, self.sent)], max(start, self.sent)
        return out

    def finish(self) -> tuple[str, list[dict]]:
        """The content not sent yet, and the calls."""
        content, calls = parse_tool_calls(self.text, self.tool_format)
        end = len(self.text) if not calls else self.text.find(self.trigger)
        rest = self.text[self.sent : end] if end > self.sent else ""
        return rest, calls
