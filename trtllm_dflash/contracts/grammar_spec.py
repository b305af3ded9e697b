"""What a grammar-constrained request asks for, as every layer passes it on (no grammar engine here:
the OpenAI front end, the Triton protocol and SamplingParams carry it; runtime/grammar.py compiles it).

`kind` is one of GRAMMAR_KINDS and `value` its text: a JSON schema (json_schema), a regular
expression (regex), a JSON list of strings (choice), an xgrammar structural tag as JSON
(structural_tag), `{"format": "qwen_3" | "llama", "tools": [...], "tool_choice": ..., "parallel": bool}` (tool_calls:
the OpenAI request's tools, in the call format of the target's family), nothing (json_object: any
JSON object). On the wire (the Triton input `guided_decoding`) it is `{"kind": ..., "value": ...}`.
"""

from __future__ import annotations

import dataclasses
import json

GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "choice", "structural_tag", "tool_calls")
# a grammar's text travels in every request and is compiled per request: bounded like a prompt
MAX_GRAMMAR_CHARS = 256 * 1024


@dataclasses.dataclass(frozen=True)
class GrammarSpec:
    kind: str
    value: str = ""

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "value": self.value})

    @classmethod
    def from_json(cls, text: str) -> "GrammarSpec":
        """Parse the wire form; ValueError names what is wrong (its callers say it in their own words)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"is not JSON ({exc.msg})") from None
        if not isinstance(data, dict) or set(data) - {"kind", "value"} or not isinstance(data.get("value", ""), str):
            raise ValueError('must be {"kind": KIND, "value": TEXT}')
        spec = cls(str(data.get("kind")), data.get("value", ""))
        spec.check()
        return spec

    def check(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(GRAMMAR_KINDS)}")
        if len(self.value) > MAX_GRAMMAR_CHARS:
            raise ValueError(f"has {len(self.value)} characters, more than {MAX_GRAMMAR_CHARS}")
