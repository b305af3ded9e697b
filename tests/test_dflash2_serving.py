"""A DFlash V2 pair (tiny target + random DFlash2DraftModel drafter) through `dflash-trt bench`, the
Triton Python-model repository on a REAL tritonserver, and the OpenAI front end: every answer
equals the offline `dflash-trt generate` tokens (torch backend). One server for the module.
"""

from __future__ import annotations

import json

import pytest
from support import cli, triton_server, write_repository

PROMPTS = ["def fibonacci(n):", "import os\nfor name in"]
MAX_TOKENS = 16
ASKED_CONTEXT = 1500  # config.pbtxt's max_context, above the tiny target's max_position_embeddings (1,024)


@pytest.fixture(scope="module")
def v2_pair(tmp_path_factory):
    from trtllm_dflash.testing.tiny import make_tiny_target, make_tiny_v2_drafter

    root = tmp_path_factory.mktemp("v2-pair")
    target = make_tiny_target(root / "target", seed=21, tokenizer=True)
    drafter = make_tiny_v2_drafter(root / "drafter", target, seed=22, mask_token_id=2, block_size=4)
    return str(target), str(drafter)


@pytest.fixture(scope="module")
def reference(v2_pair):
    target, drafter = v2_pair
    args = ["generate", "--target", target, "--drafter", drafter, "--json", "-n", str(MAX_TOKENS)]
    for prompt in PROMPTS:
        args += ["--prompt", prompt]
    return [json.loads(line) for line in cli(*args).splitlines() if line.startswith("{")]


def test_v2_drafter_spec_counts_every_stored_parameter(v2_pair):
    """The planner's V2 parameter count equals the tensors a V2 checkpoint stores."""
    from pathlib import Path

    from safetensors.torch import load_file

    from trtllm_dflash.catalog.models import drafter_from_config_file

    drafter = Path(v2_pair[1])
    spec = drafter_from_config_file(drafter / "config.json", checkpoint="tiny")
    stored = sum(t.numel() for file in drafter.glob("*.safetensors") for t in load_file(str(file)).values())
    assert spec.kind == "dflash2" and spec.conv_params() > 0 and spec.codebook_params() > 0
    assert spec.num_params() == stored


def test_bench_reports_tau_and_speedup_for_a_v2_pair(v2_pair, tmp_path):
    target, drafter = v2_pair
    out = tmp_path / "bench"
    cli(
        "bench",
        "--target",
        target,
        "--drafter",
        drafter,
        "--prompts",
        "stdlib",
        "--num-prompts",
        "2",
        "-n",
        "12",
        "--block-sizes",
        "2,4",
        "--concurrency",
        "1",
        "--out",
        str(out),
    )
    s = json.loads((out / "bench.json").read_text())["summary"]
    assert s["lossless"] is True and s["mismatched_prompts"] == 0
    assert 1.0 <= s["tau"] <= 4
    assert s["speedup"] == pytest.approx(s["dflash_tokens_per_second"] / s["ar_tokens_per_second"])


@pytest.fixture(scope="module")
def triton(v2_pair, tmp_path_factory):
    target, drafter = v2_pair
    # more context than the target's 1,024 positions: the model is served with 1,024 and says so (the limits test)
    repo = write_repository(tmp_path_factory.mktemp("v2-repo") / "repository", target, drafter, max_context=ASKED_CONTEXT, max_tokens=32)
    with triton_server(repo) as running:
        yield running, repo


def test_triton_repository_serves_a_v2_pair_as_offline(triton, reference):
    from trtllm_dflash.serving.client import DFlashClient

    server, _ = triton
    client = DFlashClient(server.endpoints.http, model="dflash", grpc_url=server.endpoints.grpc, timeout=300)
    for prompt, expected in zip(PROMPTS, reference):
        completion = client.complete(prompt, protocol="grpc", max_tokens=MAX_TOKENS)
        assert completion.token_ids == expected["token_ids"]
        assert completion.acceptance_lengths == expected["acceptance_lengths"]


def test_openai_front_end_serves_a_v2_pair_as_offline(triton, reference):
    openai = pytest.importorskip("openai")
    from trtllm_dflash.serving.openai.server import OpenAIServer
    from trtllm_dflash.serving.server import free_port

    server, repo = triton
    with OpenAIServer(server.endpoints.grpc, port=free_port(), repository=repo) as front:
        client = openai.OpenAI(base_url=front.url, api_key="unused", max_retries=0, timeout=300)
        # the limits the model runs with (its context capped at the target's positions), not config.pbtxt's
        assert f'string_value: "{ASKED_CONTEXT}"' in (repo / "dflash" / "config.pbtxt").read_text()
        card = client.models.retrieve("dflash").model_extra["dflash"]
        assert (card["max_context"], card["max_tokens"]) == (1024, 32)
        with pytest.raises(openai.BadRequestError) as refused:  # refused by the front end, in OpenAI's words
            client.completions.create(model="dflash", prompt="hello " * 1100, max_tokens=4)
        assert refused.value.body["code"] == "context_length_exceeded" and "1024 tokens" in refused.value.body["message"]
        for prompt, expected in zip(PROMPTS, reference):
            answer = client.completions.create(model="dflash", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
            assert answer.choices[0].text == expected["text"]
            assert answer.usage.completion_tokens == len(expected["token_ids"])
