"""The Triton Python-backend model: `TritonPythonModel`, imported by each repository's model.py.

Decoupled (one request, many responses), so `generate_stream` and gRPC streaming work; a
non-streaming request gets exactly one response, so `generate` works too. `execute()` only
parses, validates and queues; the BatchingLoop's thread batches every live request into
each decoding step and sends the responses.

It lives with the backends because it is where a backend is chosen: it opens the pipeline its
config.pbtxt names (open_served_pipeline) and hands it to serving's BatchingLoop, which never
imports backends.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from trtllm_dflash.backends import open_served_pipeline
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.runtime.host_memory import keep_freed_memory
from trtllm_dflash.sampling_params import SamplingError
from trtllm_dflash.served_model.batching_loop import BatchingLoop
from trtllm_dflash.served_model.call_thread import CallThread, ResponseQueue
from trtllm_dflash.served_model.metrics import TritonMetrics
from trtllm_dflash.served_model.model_parameters import ServingConfig
from trtllm_dflash.served_model.protocol import HEALTH_PROBE, INPUT_NAMES, INPUTS, LIMITS_OUTPUT, merge_step_outputs, parse_inputs


class TritonSink:
    """A ResponseSink over a Triton response sender, whose sends run on the model's CallThread.

    The first `cancelled()` asks Triton at once, on the loop, so a request whose client left before
    it was admitted is dropped before its prefill. Every later answer comes from the call thread,
    without a round trip on the loop (one cost 3.4% of the model process's samples at concurrency
    8): after each streamed response it asks whether the client cancelled, and until the first one,
    each `cancelled()` queues one such question there (never two at once), so a client that leaves
    while its request waits or prefills is seen within a step or two. Responses the call thread
    has not sent yet are merged (call_thread.ResponseQueue)."""

    def __init__(self, sender, calls: CallThread) -> None:
        self.sender, self.calls = sender, calls
        self.responses = ResponseQueue(calls, self._send, merge_step_outputs)
        self.handed_over = False  # a response or an error went to the call thread
        self.gone = False  # the client cancelled, or a send failed (set by the first ask, then on the call thread)
        self.asked = False  # the loop asked Triton once itself; later questions go to the call thread
        self.question_queued = False  # a question is waiting on the call thread

    def send(self, outputs: dict[str, np.ndarray], final: bool) -> None:
        self.handed_over = True
        self.responses.put(outputs, final)

    def _send(self, outputs: dict[str, np.ndarray], final: bool) -> None:
        try:
            tensors = [pb_utils.Tensor(name, value) for name, value in outputs.items()]
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
            self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)
            if not final and self.sender.is_cancelled():
                self.gone = True
        except Exception:  # noqa: BLE001 - the client went away: the loop drops the request
            self.gone = True

    def error(self, message: str) -> None:
        self.handed_over = True
        self.calls.submit(self._error, message)

    def _error(self, message: str) -> None:
        try:
            response = pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception:  # noqa: BLE001 - nobody is left to tell
            pass

    def cancelled(self) -> bool:
        if not self.asked:
            self.asked = True
            self.gone = self.sender.is_cancelled()
        elif not self.handed_over and not self.question_queued:
            self.question_queued = True
            self.calls.submit(self._ask)
        return self.gone

    def _ask(self) -> None:
        self.question_queued = False
        try:
            if self.sender.is_cancelled():
                self.gone = True
        except Exception:  # noqa: BLE001 - a sender that cannot answer has no client behind it
            self.gone = True


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("the DFlash model must be decoupled (model_transaction_policy { decoupled: true })")
        self.name = args["model_name"]
        model_dir = Path(args["model_repository"])
        # a step's freed buffers stay in the process for the next step, not unmapped and faulted in again
        refusal = keep_freed_memory()
        if refusal is not None:
            pb_utils.Logger.log_info(f"{self.name}: allocator thresholds left as they are ({refusal})")
        try:
            config = ServingConfig.from_parameters(model_config.get("parameters", {})).resolved(model_dir)
            # responses, metric updates and cancellation checks: round trips to tritonserver, made off the loop
            self.calls = CallThread(log=pb_utils.Logger.log_error)
            metrics = TritonMetrics(self.name, run=self.calls.submit)
            self.loop = BatchingLoop(config, open_served_pipeline(config), metrics, log=pb_utils.Logger.log_error)
        except DFlashError as exc:
            raise pb_utils.TritonModelException(f"cannot load DFlash model {self.name}: {exc}") from None
        self.loop.start()
        # the answer to a health probe: the limits this model really runs with, where the repository declares them
        declared = {output["name"] for output in model_config.get("output", [])}
        self.probe_answer = (
            {LIMITS_OUTPUT: np.array([self.loop.limits.to_json().encode()], dtype=np.object_)} if LIMITS_OUTPUT in declared else {}
        )
        mode = f"DFlash, block {self.loop.decoder.block_size}" if self.loop.decoder.speculative else "autoregressive"
        prefix = f"{config.prefix_cache_mib} MiB" if self.loop.decoder.prefix_cache is not None else "off"
        pb_utils.Logger.log_info(
            f"{self.name}: {config.target} ({mode}) on {self.loop.pipeline.runtime.device}, max batch {config.max_batch}, "
            f"max context {self.loop.max_context}"
            + (
                f" (config.pbtxt asks {config.max_context}: more than the model holds)"
                if self.loop.max_context < config.max_context
                else ""
            )
            + f", max new tokens {self.loop.max_new_tokens_limit}, prefix cache {prefix}, "
            f"prefill chunk {config.prefill_chunk or 'off (whole prompts)'}"
            + (
                f", prefills {config.prefill_share} of the decoding time beside decoding rows"
                if config.prefill_chunk and config.prefill_share
                else ""
            )
        )

    def execute(self, requests: list) -> None:
        for request in requests:
            sink = TritonSink(request.get_response_sender(), self.calls)
            try:
                raw = {}
                for name in INPUTS:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        raw[name] = tensor.as_numpy()
                if HEALTH_PROBE in raw:  # this process answers: it is alive (nothing decoded, nothing counted)
                    sink.send(self.probe_answer, final=True)
                    continue
                self.loop.accept(parse_inputs(raw, self.loop.defaults), sink)
            except SamplingError as exc:  # named as the request's inputs, not SamplingParams' fields
                sink.error(str(exc.renamed(INPUT_NAMES)))
            except DFlashError as exc:
                sink.error(str(exc))
            except Exception as exc:  # noqa: BLE001 - one bad request never takes the model down
                sink.error(f"cannot process the request ({type(exc).__name__}: {exc})")
        return None

    def finalize(self) -> None:
        self.loop.stop()
        self.calls.close()  # the responses the loop's stop() sent, then the thread ends
