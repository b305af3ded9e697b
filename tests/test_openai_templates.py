"""Clients do not run their own templates: chat_template_kwargs may set the variables a template
reads, but `chat_template` (unless the operator allows request templates) and every key that
changes how the template is chosen or rendered get a 400 naming the key. Rendering is bounded
either way (time and output size). Served on a REAL tritonserver (the demo repository), with one
front end as deployed by default and one with `--allow-request-chat-template`."""

from __future__ import annotations

import pytest

from trtllm_dflash.chat import RenderLimitError, apply_chat_template
from trtllm_dflash.serving.openai.frontend import DEFAULT_MAX_REQUEST_BYTES

openai = pytest.importorskip("openai")

SLOW = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
HUGE = [
    "{{ 'a' * 10000000 }}",
    "{{ 'a'|center(100000000) }}",
    "{{ range(99999)|join('a' * 1000) }}",
    "{{ '%999999999s' % 'a' }}",
    "{{ ('a' * 1000).replace('', 'b' * 1000) }}",
    "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from trtllm_dflash.checkpoints import resolve_checkpoint

    return AutoTokenizer.from_pretrained(resolve_checkpoint("demo", "target"))


def test_bounded_render_equals_transformers(tokenizer):
    rows = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]
    assert apply_chat_template(tokenizer, rows) == tokenizer.apply_chat_template(rows, tokenize=False, add_generation_prompt=True)


@pytest.mark.parametrize("template", HUGE)
def test_output_bound_stops_string_building_before_it_happens(tokenizer, template):
    with pytest.raises(RenderLimitError) as caught:  # raised, not built: the string would be gigabytes
        apply_chat_template(tokenizer, "hi" * 100, {"chat_template": template}, max_chars=100_000)
    assert caught.value.limit == "max_chars" and "100000 characters" in str(caught.value)


def test_time_bound_stops_a_loop(tokenizer):
    with pytest.raises(RenderLimitError) as caught:  # the template never ends: only the time bound stops it
        apply_chat_template(tokenizer, "hi", {"chat_template": SLOW}, max_seconds=0.5)
    assert caught.value.limit == "max_seconds"


# ---------------------------------------------------------------------- served (real tritonserver)


@pytest.fixture(scope="module")
def triton(demo_triton):
    """The session's demo tritonserver (tests/conftest.py)."""
    return demo_triton


def _client(triton, allow: bool):
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    return OpenAIServer(triton.endpoints.grpc, port=free_port(), repository=triton.repository, allow_request_chat_template=allow)


@pytest.fixture(scope="module")
def default(triton):
    with _client(triton, False) as front:
        yield openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def allowing(triton):
    with _client(triton, True) as front:
        yield openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=60)


def _chat(client, **kwargs):
    return client.chat.completions.create(
        model="dflash",
        messages=[{"role": "user", "content": "def f(x):"}],
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": kwargs},
    )


def _refused(client, **kwargs) -> dict:
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(client, **kwargs)
    return caught.value.body


@pytest.mark.parametrize(
    "key", ["chat_template", "tokenize", "add_generation_prompt", "tools", "continue_final_message", "messages", "return_dict"]
)
def test_template_and_rendering_keys_refused_by_name(default, key):
    body = _refused(default, **{key: "{{ 'x' }}" if key == "chat_template" else True})
    assert body["param"] == "chat_template_kwargs" and f"chat_template_kwargs.{key}" in body["message"]
    if key == "chat_template":
        assert "--allow-request-chat-template" in body["message"]


def test_template_variables_pass(default):
    plain = _chat(default)
    assert _chat(default, unused_flag=True).choices[0].message.content == plain.choices[0].message.content
    # the demo template reads enable_thinking (an extra "# (no thinking)" line): it reaches the template
    assert _chat(default, enable_thinking=False).usage.prompt_tokens > plain.usage.prompt_tokens


def test_operator_allows_request_templates(allowing, default):
    plain = _chat(allowing)
    own = _chat(allowing, chat_template="{% for m in messages %}<<{{ m.content }}>>{% endfor %}x = ")
    assert own.usage.prompt_tokens != plain.usage.prompt_tokens  # the request's template was used
    completion = allowing.completions.create(model="dflash", prompt="<<def f(x):>>x = ", max_tokens=8, temperature=0)
    assert own.choices[0].message.content == completion.choices[0].text
    assert "tokenize" in _refused(allowing, tokenize=True)["message"]  # rendering keys stay refused


def test_served_render_bounds(allowing):
    body = _refused(allowing, chat_template=SLOW)  # the template never ends: only the time bound answers
    assert "time limit of 2 s" in body["message"] and body["code"] == "chat_template_limit"
    body = _refused(allowing, chat_template="{{ 'a' * 10000000 }}")  # over twice the body limit
    assert f"limit of {2 * DEFAULT_MAX_REQUEST_BYTES} characters" in body["message"] and body["code"] == "chat_template_limit"
    assert _chat(allowing).choices[0].finish_reason == "length"  # the server goes on
