"""One request on Triton's async gRPC stream, as the OpenAI front end reads it.

The per-step responses of the served model (serving/protocol.py's outputs) come back as dicts;
an error from Triton becomes an OpenAIError; closing the stream early cancels the request, which
Triton passes on to the model's loop (its decoder row is freed between steps).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, AsyncIterator

import numpy as np

from trtllm_dflash.serving.client import grpc_inputs
from trtllm_dflash.serving.openai_schemas import OpenAIError

STATS = ("mean_acceptance_length", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
         "num_input_tokens", "num_output_tokens", "time_to_first_token", "tokens_per_second", "finish_reason")


def _value(result, name: str) -> Any:
    array = result.as_numpy(name)
    if array is None:
        return None
    if array.dtype == np.object_:
        values = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    else:
        values = array.reshape(-1).tolist()
    return values if name == "output_ids" else (values[0] if values else None)


class TritonStream:
    """One request on Triton's gRPC stream: iterate the step responses; cancel() ends it there."""

    def __init__(self, client, model: str, body: dict) -> None:
        self._done = asyncio.Event()
        inputs = grpc_inputs(body)

        async def requests():
            yield {"model_name": model, "inputs": inputs, "request_id": uuid.uuid4().hex}
            await self._done.wait()  # keep the stream open until the last response

        self._call = client.stream_infer(requests())
        self.finished = False

    async def __aiter__(self) -> AsyncIterator[dict]:
        from tritonclient.utils import InferenceServerException

        try:
            async for result, error in self._call:
                if error is not None:
                    self.finished = True
                    raise OpenAIError(400, error.message() if isinstance(error, InferenceServerException) else str(error))
                response = {name: _value(result, name) for name in ("text_output", "output_ids", *STATS)}
                yield response
                if response.get("finish_reason"):
                    self.finished = True
                    return
        except InferenceServerException as exc:
            self.finished = True
            raise OpenAIError(502, f"Triton stream failed: {exc.message()}", kind="server_error") from None
        finally:
            self.close()

    def close(self) -> None:
        """Cancel the call unless it finished (Triton then cancels the request in the model)."""
        self._done.set()
        if not self.finished:
            self.finished = True
            self._call.cancel()
