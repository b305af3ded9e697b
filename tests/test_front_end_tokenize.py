"""Where the OpenAI front end tokenizes a prompt: a short one on the event loop (a worker thread's
round trip cost milliseconds of time to first token under load), a long one in a worker thread, and
a short one that finds the tokenizer busy in a worker thread waits there, never on the loop."""

from __future__ import annotations

import threading

import pytest

anyio = pytest.importorskip("anyio")

from trtllm_dflash.serving.openai.frontend import INLINE_CHARS, Frontend, FrontendConfig, ModelInfo  # noqa: E402
from trtllm_dflash.serving.openai.schemas import OpenAIError  # noqa: E402


class RecordingTokenizer:
    """One id per word, and the thread each prompt was tokenized on."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        self.threads.append(threading.current_thread())
        return {"input_ids": list(range(len(text.split())))}


def model(max_context: int = 100_000) -> tuple[ModelInfo, RecordingTokenizer]:
    tokenizer = RecordingTokenizer()
    return ModelInfo("dflash", tokenizer, max_context, 256, 16, True, 0), tokenizer


def test_a_short_prompt_is_tokenized_on_the_event_loop_and_a_long_one_in_a_worker():
    info, tokenizer = model()
    frontend = Frontend(FrontendConfig(triton_url="127.0.0.1:1"))

    async def main():
        short = await frontend.prompt_ids(info, "one two three", "prompt")
        long = await frontend.prompt_ids(info, "word " * INLINE_CHARS, "prompt")
        return threading.current_thread(), short, long

    loop_thread, short, long = anyio.run(main)
    assert short == [0, 1, 2] and len(long) == INLINE_CHARS
    assert tokenizer.threads[0] is loop_thread
    assert tokenizer.threads[1] is not loop_thread


def test_a_short_prompt_waits_for_a_busy_tokenizer_in_a_worker_not_on_the_loop():
    info, tokenizer = model()
    frontend = Frontend(FrontendConfig(triton_url="127.0.0.1:1"))
    ticks = []

    async def main():
        info.lock.acquire()  # another request's long prompt is being tokenized
        threading.Timer(0.3, info.lock.release).start()

        async def tick():
            while not ticks or ticks[-1] != "done":
                ticks.append("tick")
                await anyio.sleep(0.02)

        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            ids = await frontend.prompt_ids(info, "one two", "prompt")
            ticks.append("done")
        return threading.current_thread(), ids

    loop_thread, ids = anyio.run(main)
    assert ids == [0, 1]
    assert tokenizer.threads == [tokenizer.threads[0]] and tokenizer.threads[0] is not loop_thread
    assert ticks.count("tick") >= 5  # the loop kept running while the prompt waited for the tokenizer


def test_a_short_prompt_over_the_context_is_refused_in_openai_words():
    info, _ = model(max_context=4)
    frontend = Frontend(FrontendConfig(triton_url="127.0.0.1:1"))
    with pytest.raises(OpenAIError) as refused:
        anyio.run(frontend.prompt_ids, info, "a b c d e", "prompt")
    assert refused.value.code == "context_length_exceeded" and "5 tokens" in refused.value.message
