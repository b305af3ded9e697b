"""Tenants that cannot read each other (issue 40 items 1, 2, 8), against a REAL tritonserver and the
OpenAI front end: the prefix cache is shared only between requests of the same cache_salt, and with
several API keys each key is a tenant of its own (cached_tokens never counts another tenant's
blocks); Triton's own generate reports only blocks of its own salt; keys come from a repeated flag
or an owner-only file; one Authorization header or a 400; unknown model names are not echoed whole.
"""

from __future__ import annotations

import json
import os
import urllib.request

import httpx
import pytest

from trtllm_dflash.errors import DFlashError

openai = pytest.importorskip("openai")

KEYS = ("key-of-tenant-a", "key-of-tenant-b")
# a prompt of several whole prefix-cache blocks (64 tokens each) in the demo tokenizer
PROMPT = "import os\nimport sys\n\n" + "".join(f"def helper_{i}(value):\n    return value * {i} + len(str(value))\n\n" for i in range(8))


@pytest.fixture(scope="module")
def triton(demo_triton):
    """The session's demo tritonserver (tests/conftest.py): every prompt here is the module's own, so
    other modules' requests share no cached block with it."""
    return demo_triton


@pytest.fixture(scope="module")
def repo(triton):
    return triton.repository


@pytest.fixture(scope="module")
def front(triton, repo):
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    with OpenAIServer(triton.endpoints.grpc, port=free_port(), repository=repo, api_key=list(KEYS)) as running:
        yield running


def _cached(front, key: str, prompt: str = PROMPT, **extra) -> int:
    client = openai.OpenAI(base_url=front.url, api_key=key, max_retries=0, timeout=300)
    answer = client.completions.create(model="dflash", prompt=prompt, max_tokens=2, temperature=0, extra_body=extra or None)
    return answer.usage.prompt_tokens_details.cached_tokens


def _triton_generate(triton, prompt: str, **inputs) -> dict:
    body = json.dumps({"text_input": prompt, "sampling_param_max_tokens": 2, "sampling_param_temperature": 0, **inputs}).encode()
    request = urllib.request.Request(f"{triton.endpoints.http}/v2/models/dflash/generate", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def test_each_key_is_a_tenant_and_a_salt_shares_only_with_itself(front, triton):
    prompt = "# tenants\n" + PROMPT
    a, b = KEYS
    assert _cached(front, a, prompt) == 0
    hit = _cached(front, a, prompt)  # the same tenant: its whole blocks
    assert hit >= 128
    assert _cached(front, b, prompt) == 0  # another key: nothing of tenant a's
    assert _cached(front, b, prompt) == hit  # its own blocks now
    assert _cached(front, a, prompt, cache_salt="s") == 0  # a salt is a scope of its own, inside the key
    assert _cached(front, a, prompt, cache_salt="s") == hit
    assert _cached(front, b, prompt, cache_salt="s") == 0  # the same salt under another key shares nothing
    # Triton's own generate (no key, no salt) sees none of the tenants' blocks, nor a salt's
    assert _triton_generate(triton, prompt)["num_cached_tokens"] == 0
    assert _triton_generate(triton, prompt, cache_salt="s")["num_cached_tokens"] == 0
    assert _triton_generate(triton, prompt, cache_salt="s")["num_cached_tokens"] == hit
    assert _triton_generate(triton, prompt)["num_cached_tokens"] == hit


def test_with_one_key_requests_share_unless_salted(triton, repo):
    """One key (and no salt): today's server-wide sharing, as docs/serving.md says."""
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    prompt = "# one key\n" + PROMPT
    with OpenAIServer(triton.endpoints.grpc, port=free_port(), repository=repo, api_key="only-key") as single:
        assert _cached(single, "only-key", prompt) == 0
        hit = _cached(single, "only-key", prompt)
        assert hit >= 128
        assert _cached(single, "only-key", prompt, cache_salt="private") == 0
        assert _triton_generate(triton, prompt)["num_cached_tokens"] == hit  # unscoped: shared with Triton's own clients


def test_bad_salts_headers_and_names_get_one_clear_error(front):
    base, (a, b) = front.url, KEYS
    body = {"model": "dflash", "prompt": "x", "max_tokens": 2}
    for salt in ("", 7, "s" * 257):
        answer = httpx.post(f"{base}/completions", json={**body, "cache_salt": salt}, headers={"Authorization": f"Bearer {a}"})
        assert answer.status_code == 400 and "cache_salt" in answer.text, (salt, answer.text)
    twice = httpx.post(f"{base}/completions", json=body, headers=[("Authorization", f"Bearer {a}"), ("Authorization", f"Bearer {b}")])
    assert twice.status_code == 400 and "2 Authorization headers" in twice.json()["error"]["message"]
    unknown = httpx.post(f"{base}/completions", json={**body, "model": "m" * 1_000_000}, headers={"Authorization": f"Bearer {a}"})
    assert unknown.status_code == 404 and len(unknown.text) < 2_000


def test_keys_come_from_the_flag_and_an_owner_only_file(tmp_path):
    from trtllm_dflash.serving.openai.server import api_keys

    path = tmp_path / "keys"
    path.write_text("# tenants\nkey-one\n\n  key-two  \n")
    path.chmod(0o644)
    with pytest.raises(DFlashError, match="can be read by other users"):
        api_keys(None, path)
    path.chmod(0o600)
    assert api_keys(["key-zero", "key-one"], path) == ("key-zero", "key-one", "key-two")
    assert api_keys("k", None) == ("k",) and api_keys(None, None) == ()
    with pytest.raises(DFlashError, match="spaces or control"):
        api_keys(["two words"], None)
    (tmp_path / "empty").write_text("# none\n")
    os.chmod(tmp_path / "empty", 0o600)
    with pytest.raises(DFlashError, match="holds no key"):
        api_keys(None, tmp_path / "empty")
