"""A hybrid target (Qwen3.5-style Gated DeltaNet + full attention) served by a REAL tritonserver:
greedy output equals offline decoding, alone and with concurrent requests sharing decode steps
(rows accept different lengths, so each row's recurrent state rolls back to its own position).

The pair is a tiny qwen3_5 target trained for seconds on two token cycles plus a drafter
distilled from it, so long and ragged runs are accepted, with the character tokenizer.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch
from support import cli, triton_server, write_repository

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def hybrid_pair(hybrid_trained_pair):
    target, drafter = hybrid_trained_pair
    return str(target), str(drafter)


@pytest.fixture(scope="module")
def prompts(hybrid_pair):
    from transformers import AutoTokenizer

    from trtllm_dflash.testing.tiny import cycle_sequences

    tokenizer = AutoTokenizer.from_pretrained(hybrid_pair[0])
    windows = cycle_sequences(4, 14, torch.Generator().manual_seed(5)).tolist()
    lengths = (14, 9, 12, 5)  # different prompt lengths in one batch
    return [tokenizer.decode(w[:n]) for w, n in zip(windows, lengths)]


@pytest.fixture(scope="module")
def offline(hybrid_pair, prompts):
    target, drafter = hybrid_pair
    args = ["generate", "--target", target, "--drafter", drafter, "--json", "-n", str(MAX_TOKENS)]
    for prompt in prompts:
        args += ["--prompt", prompt]
    return [json.loads(line) for line in cli(*args).splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def client(hybrid_pair, tmp_path_factory):
    from trtllm_dflash.serving.client import DFlashClient

    target, drafter = hybrid_pair
    repo = write_repository(tmp_path_factory.mktemp("hybrid-repo") / "repository", target, drafter, max_context=128, max_tokens=MAX_TOKENS)
    with triton_server(repo) as server:
        yield DFlashClient(server.endpoints.http, model="dflash", grpc_url=server.endpoints.grpc, timeout=300)


def test_offline_reference_accepts_ragged_runs(offline):
    runs = [length for row in offline for length in row["acceptance_lengths"]]
    assert max(runs) >= 6 and len(set(runs)) >= 2  # long accepted runs, not all the same length


def test_served_hybrid_equals_offline(client, prompts, offline):
    for prompt, expected in zip(prompts, offline):
        completion = client.complete(prompt, protocol="grpc", max_tokens=MAX_TOKENS)
        assert completion.token_ids == expected["token_ids"]
        assert completion.acceptance_lengths == expected["acceptance_lengths"]


def test_concurrent_hybrid_requests_equal_offline(client, prompts, offline):
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        results[i] = client.complete(prompts[i], protocol="grpc", max_tokens=MAX_TOKENS).token_ids

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert [results[i] for i in range(len(prompts))] == [row["token_ids"] for row in offline]
