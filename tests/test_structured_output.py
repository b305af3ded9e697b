"""Structured output and tool calls through the OpenAI API (issue 42), against a REAL tritonserver
with the official `openai` SDK: a JSON-schema answer from the DFlash model is, token for token, the
target's greedy answer under the same mask (offline, autoregressive) and parses against the schema;
a forced tool call comes back as `tool_calls` whose arguments follow the function's schema,
streamed and not; a grammar cut by max_tokens ends "length", never claimed complete; malformed
schemas and asks that cannot be served get a 400 naming the field.
"""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "count": {"type": "integer", "enum": [1, 2, 3]}},
    "required": ["name", "count"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "days": {"type": "integer", "enum": [1, 2, 3]}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def client(demo_triton):
    """An OpenAI front end of its own on the session's demo tritonserver (tests/conftest.py)."""
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    with OpenAIServer(demo_triton.endpoints.grpc, port=free_port(), repository=demo_triton.repository) as front:
        yield openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def offline():
    from trtllm_dflash import DFlashPipeline, demo

    return DFlashPipeline.load(demo.target_dir())


def test_a_json_schema_answer_is_the_target_s_masked_greedy_answer(client, offline):
    from trtllm_dflash.contracts.grammar_spec import GrammarSpec

    response_format = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA, "strict": True}}
    for prompt in ("config = ", "def make_item():\n    return "):
        answers = [
            client.completions.create(
                model=model, prompt=prompt, max_tokens=120, temperature=0, extra_body={"response_format": response_format}
            )
            for model in ("dflash", "ar")
        ]
        reference = offline.generate([prompt], max_new_tokens=120, grammar=GrammarSpec("json_schema", json.dumps(SCHEMA)))[0]
        assert answers[0].choices[0].text == answers[1].choices[0].text == reference.text
        assert answers[0].usage.completion_tokens == len(reference.token_ids)
        if answers[0].choices[0].finish_reason == "stop":
            value = json.loads(answers[0].choices[0].text)
            assert set(value) == {"name", "count"} and value["count"] in (1, 2, 3) and len(value["name"]) <= 12
        else:
            assert answers[0].choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model="dflash",
        messages=[{"role": "user", "content": "an item"}],
        max_tokens=120,
        temperature=0,
        response_format={"type": "json_object"},
    )
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(chat.choices[0].message.content), dict)
    regex = client.completions.create(
        model="dflash", prompt="x = ", max_tokens=40, temperature=0, extra_body={"guided_regex": r"[a-z]+\(\d\)"}
    )
    assert regex.choices[0].finish_reason == "length" or __import__("re").fullmatch(r"[a-z]+\(\d\)", regex.choices[0].text)
    choice = client.completions.create(
        model="dflash", prompt="ok? ", max_tokens=20, temperature=0, extra_body={"guided_choice": ["yes", "no"]}
    )
    assert choice.choices[0].text in ("yes", "no")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_call_comes_back_as_tool_calls_streamed_and_not(client, tool_choice):
    messages = [{"role": "user", "content": "What is the weather in Paris for two days?"}]
    answer = client.chat.completions.create(
        model="dflash",
        messages=messages,
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=250,
        temperature=0,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert len(calls) == 1 and all(call.type == "function" and call.id.startswith("call_") for call in calls)  # parallel_tool_calls false
    weather = [json.loads(call.function.arguments) for call in calls if call.function.name == "get_weather"]
    assert weather or tool_choice == "required"
    for arguments in weather:
        assert set(arguments) == {"city", "days"} and arguments["city"] in ("Paris", "Tokyo") and arguments["days"] in (1, 2, 3)
    stream = client.chat.completions.create(
        model="dflash",
        messages=messages,
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
        parallel_tool_calls=False,
        max_tokens=250,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [call for d in deltas for call in (d.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in streamed] == [(c.function.name, c.function.arguments) for c in calls]
    assert [c.index for c in streamed] == list(range(len(calls)))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(d.content or "" for d in deltas) == (choice.message.content or "")


def test_a_grammar_cut_by_max_tokens_ends_with_length(client):
    answer = client.chat.completions.create(
        model="dflash",
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        tool_choice="required",
        max_tokens=8,
        temperature=0,
    )
    assert answer.choices[0].finish_reason == "length" and not answer.choices[0].message.tool_calls
    cut = client.completions.create(
        model="dflash",
        prompt="config = ",
        max_tokens=3,
        temperature=0,
        extra_body={"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
    )
    assert cut.choices[0].finish_reason == "length"


def test_bad_asks_get_a_400_naming_the_field(client):
    def refused(param: str, **kwargs) -> str:
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="dflash", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kwargs)
        assert caught.value.status_code == 400
        return caught.value.message

    assert "cannot be compiled" in refused(
        "response_format", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}
    )
    assert "regex grammar cannot be compiled" in refused("guided_regex", extra_body={"guided_regex": "(unclosed"})
    assert "send one of them" in refused("guided_json", response_format={"type": "json_object"}, extra_body={"guided_json": SCHEMA})
    assert "not one of the request's tools" in refused(
        "tool_choice", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}
    )
    assert "ignore_eos cannot be combined with a grammar" in refused(
        "ignore_eos", response_format={"type": "json_object"}, extra_body={"ignore_eos": True}
    )
    with pytest.raises(openai.BadRequestError, match="tools are taken on /v1/chat/completions"):
        client.completions.create(model="dflash", prompt="hi", max_tokens=4, extra_body={"tools": [WEATHER]})


def test_tool_call_text_is_read_back_in_the_family_formats():
    from trtllm_dflash.serving.openai.tool_calls import ToolCallStream, parse_tool_calls

    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    content, calls = parse_tool_calls(text, "qwen_3")
    assert content == "Let me check.\n" and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 2}),
        ("get_time", {}),
    ]
    assert parse_tool_calls('{"name": "get_time", "parameters": {}}', "llama")[1][0]["function"]["name"] == "get_time"
    assert parse_tool_calls('<tool_call>\n{"name": "get_weather", "argu', "qwen_3") == ('<tool_call>\n{"name": "get_weather", "argu', [])
    held = ToolCallStream("qwen_3")
    sent = "".join(held.feed(text[i : i + 3]) for i in range(0, len(text), 3))
    rest, streamed = held.finish()
    assert sent + rest == "Let me check.\n" and len(streamed) == 2  # "<tool" was held back, never sent as content
