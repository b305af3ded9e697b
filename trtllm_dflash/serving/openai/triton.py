"""One request on Triton's async gRPC stream, as the OpenAI front end reads it.

The per-step responses of the served model (served_model/protocol.py's outputs) come back as dicts;
an error from Triton becomes an OpenAIError; closing the stream early cancels the request, which
Triton passes on to the model's loop (its decoder row is freed between steps). NVIDIA's LLM-API
model (the trtllm backend's repository) answers with its whole text so far and string figures:
a `protocol.LLMApiStream` turns those into the same per-step dicts, and the token counts it does
not send are counted with the model's tokenizer (`count_tokens`).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import AsyncIterator, Callable

from trtllm_dflash.served_model.protocol import LLMApiStream
from trtllm_dflash.serving.client import grpc_inputs, read_outputs
from trtllm_dflash.serving.openai.schemas import OpenAIError

# Triton's words for a model whose Python backend process died: a 503 to retry, not a 400
MODEL_PROCESS_DOWN = ("Stub process", "is not healthy")
STATS = (
    "acceptance_lengths",
    "mean_acceptance_length",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "num_input_tokens",
    "num_output_tokens",
    "num_cached_tokens",
    "time_to_first_token",
    "tokens_per_second",
    "finish_reason",
)
OUTPUTS = ("text_output", "output_ids", *STATS)  # what our model's responses are read for
# what NVIDIA's LLM-API model sends (protocol.py's notes), read when the request asked for it
LLMAPI_OUTPUTS = (
    "text_output",
    "finish_reason",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "arrival_time_ns",
    "first_token_time_ns",
)


class TritonStream:
    """One request on Triton's gRPC stream: iterate the step responses; cancel() ends it there."""

    def __init__(
        self,
        client,
        model: str,
        body: dict,
        reader: LLMApiStream | None = None,
        count_tokens: Callable[[str], int] | None = None,
        prompt: str = "",
    ) -> None:
        self._done = asyncio.Event()
        self._reader, self._count, self._prompt = reader, count_tokens, prompt
        inputs = grpc_inputs(body)

        async def requests():
            yield {"model_name": model, "inputs": inputs, "request_id": uuid.uuid4().hex}
            await self._done.wait()  # keep the stream open until the last response

        self._call = client.stream_infer(requests())
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[dict]:
        import grpc
        from tritonclient.utils import InferenceServerException

        try:
            async for result, error in self._call:
                if error is not None:
                    self.finished = True
                    message = error.message() if isinstance(error, InferenceServerException) else str(error)
                    if any(mark in message for mark in MODEL_PROCESS_DOWN):  # not the request's fault
                        raise OpenAIError(
                            503,
                            f"the model's process is down ({message}); `dflash-trt serve` restarts it: retry shortly",
                            None,
                            "model_server_not_ready",
                            "server_error",
                        )
                    raise OpenAIError(400, message)
                if self._reader is None:
                    response = read_outputs(result, OUTPUTS)
                else:
                    response = self._reader.step(read_outputs(result, LLMAPI_OUTPUTS))
                    if response.get("finish_reason") and self._count is not None:  # usage: ids are not sent
                        response.update(num_input_tokens=self._count(self._prompt), num_output_tokens=self._count(response["full_text"]))
                yield response
                if response.get("finish_reason"):
                    self.finished = True
                    return
        except InferenceServerException as exc:
            self.finished = True
            raise OpenAIError(502, f"Triton stream failed: {exc.message()}", kind="server_error") from None
        except grpc.RpcError as exc:  # the server went away mid-stream (killed, or restarted by `serve`)
            self.finished = True
            raise OpenAIError(
                503,
                f"the model server's stream broke ({exc.code().name}: {exc.details()}); retry shortly",
                None,
                "model_server_not_ready",
                "server_error",
            ) from None
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the call unless it finished (Triton then cancels the request in the model)."""
        self._done.set()
        if not self.finished:
            self.finished = True
            self._call.cancel()
