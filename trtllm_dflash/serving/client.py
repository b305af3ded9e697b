"""A client for the served DFlash models: HTTP generate / generate_stream, and gRPC streaming.

The HTTP side uses Triton's generate extension (`/v2/models/<m>/generate[_stream]`, JSON in,
JSON or server-sent events out), which tritonclient does not wrap, so it is plain urllib; the
gRPC side is `tritonclient.grpc` bidirectional streaming (what decoupled models need). Both
return the same `Chunk` / `Completion` objects, so callers can switch protocols freely.

The same client talks to NVIDIA's LLM-API model (the `trtllm` backend's `tensorrt_llm`): the model's
metadata says which one is served (protocol.LLMAPI_MARKER), and for that one each request sets the
flags it needs to send a finish reason and acceptance figures and to leave the prompt out, and its
cumulative text is turned into steps (protocol.LLMApiStream). It sends no token ids: such completions
have none, and their token counts and tau are 0 (unknown).
"""

from __future__ import annotations

import dataclasses
import json
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Iterator, Sequence

import numpy as np

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.extras import require
from trtllm_dflash.served_model.protocol import (
    HEALTH_PROBE,
    INPUTS,
    LIST_OUTPUTS,
    LLMAPI_FLAGS,
    LLMAPI_MARKER,
    LLMApiStream,
    llmapi_body,
    request_body,
)


class ServerError(DFlashError):
    """The server refused or failed one request (the message is the server's)."""


@dataclasses.dataclass
class Chunk:
    """One response of a stream: the new text/ids of a step and the running totals."""

    text: str
    token_ids: list[int]
    acceptance_lengths: list[int]
    final: bool
    stats: dict[str, Any]
    full_text: str | None = None  # the whole text so far, where the server sends it (NVIDIA's LLM-API model)


@dataclasses.dataclass
class Completion:
    """A whole generation, with the server's per-request metrics and client-side timings."""

    text: str
    token_ids: list[int]
    acceptance_lengths: list[int]
    finish_reason: str
    mean_acceptance_length: float
    acceptance_rate: float
    num_input_tokens: int
    num_output_tokens: int
    time_to_first_token: float  # measured by the server, arrival to first token
    tokens_per_second: float  # measured by the server
    latency: float = 0.0  # measured here: request sent to last response
    client_time_to_first_token: float = 0.0  # measured here: request sent to first text

    @classmethod
    def from_chunks(cls, chunks: Sequence[Chunk], latency: float = 0.0, first: float = 0.0) -> "Completion":
        if not chunks:
            raise ServerError("the server sent no response", "check the server log")
        last = chunks[-1].stats
        return cls(
            text=chunks[-1].full_text if chunks[-1].full_text is not None else "".join(c.text for c in chunks),
            token_ids=[t for c in chunks for t in c.token_ids],
            acceptance_lengths=[a for c in chunks for a in c.acceptance_lengths],
            finish_reason=str(last.get("finish_reason", "")),
            mean_acceptance_length=float(last.get("mean_acceptance_length", 0.0)),
            acceptance_rate=float(last.get("acceptance_rate", 0.0)),
            num_input_tokens=int(last.get("num_input_tokens", 0)),
            num_output_tokens=int(last.get("num_output_tokens", 0)),
            time_to_first_token=float(last.get("time_to_first_token", 0.0)),
            tokens_per_second=float(last.get("tokens_per_second", 0.0)),
            latency=latency,
            client_time_to_first_token=first,
        )

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


class DFlashClient:
    """Talks to one model of a running server.

    client = DFlashClient("http://localhost:8000", model="dflash")
    print(client.generate("def fib(n):", max_new_tokens=64).text)
    for chunk in client.stream("def fib(n):", protocol="grpc", grpc_url="localhost:8001"):
        print(chunk.text, end="", flush=True)
    """

    def __init__(
        self, url: str = "http://localhost:8000", model: str = "dflash", grpc_url: str | None = None, timeout: float = 600.0
    ) -> None:
        self.url = url.rstrip("/") if "://" in url else f"http://{url.rstrip('/')}"
        self.model = model
        self.grpc_url = grpc_url
        self.timeout = timeout
        self._local = threading.local()
        self._declared: dict[str, frozenset[str]] = {}  # protocol -> the model's declared inputs

    # ------------------------------------------------------------------ health

    def ready(self) -> bool:
        """Server and model ready (tritonclient's HTTP client)."""
        httpclient = require("tritonclient.http", "serve", "the Triton client")

        try:
            client = httpclient.InferenceServerClient(self.url.split("://", 1)[1], connection_timeout=5, network_timeout=5)
            return bool(client.is_server_ready() and client.is_model_ready(self.model))
        except Exception:  # noqa: BLE001 - not reachable == not ready
            return False

    def speaks_llmapi(self, protocol: str = "http") -> bool:
        """Whether the model is NVIDIA's LLM-API model (it declares protocol.LLMAPI_MARKER), not ours."""
        return LLMAPI_MARKER in self._inputs(protocol)

    def _inputs(self, protocol: str) -> frozenset[str]:
        """The model's declared input names (its metadata, asked once per protocol); empty when it cannot be
        read, so the request itself then says what is wrong."""
        if protocol not in self._declared:
            names: list[str] = []
            try:
                if protocol == "grpc" and self.grpc_url:
                    grpcclient = require("tritonclient.grpc", "serve", "gRPC requests")
                    metadata = grpcclient.InferenceServerClient(self.grpc_url).get_model_metadata(self.model, as_json=True)
                else:
                    with urllib.request.urlopen(f"{self.url}/v2/models/{self.model}", timeout=min(self.timeout, 30.0)) as response:
                        metadata = json.loads(response.read())
                names = [entry["name"] for entry in metadata.get("inputs", [])]
            except Exception:  # noqa: BLE001 - not reachable or not served: the request reports it
                return frozenset()
            self._declared[protocol] = frozenset(names)
        return self._declared[protocol]

    def _body(self, prompt: str, streaming: bool, protocol: str, **sampling) -> tuple[dict[str, Any], LLMApiStream | None]:
        """The request body, and for NVIDIA's LLM-API model the reader of its responses."""
        body = request_body(prompt, streaming=streaming, **sampling)
        declared = self._inputs(protocol)
        if LLMAPI_MARKER not in declared:
            return body, None
        return llmapi_body(body, declared), LLMApiStream()

    # ------------------------------------------------------------------ HTTP (generate extension)

    def generate(self, prompt: str, **sampling) -> Completion:
        """One request, one JSON response (POST /v2/models/<model>/generate)."""
        started = time.perf_counter()
        body, reader = self._body(prompt, False, "http", **sampling)
        with self._post("generate", body) as response:
            data = json.loads(response.read())
        latency = time.perf_counter() - started
        return Completion.from_chunks([_chunk(data, final=True, reader=reader)], latency, latency)

    def stream(self, prompt: str, protocol: str = "http", **sampling) -> Iterator[Chunk]:
        """Responses as the server commits tokens: HTTP server-sent events, or gRPC streaming."""
        if protocol == "grpc":
            yield from self._stream_grpc(prompt, **sampling)
            return
        if protocol != "http":
            raise DFlashError(f"unknown protocol {protocol!r}", "use http or grpc")
        body, reader = self._body(prompt, True, "http", **sampling)
        with self._post("generate_stream", body) as response:
            for line in response:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                data = json.loads(line[5:])
                if "error" in data:
                    raise ServerError(f"server error: {data['error']}")
                chunk = _chunk(data, final=None, reader=reader)
                yield chunk
                if chunk.final:
                    return

    def complete(self, prompt: str, protocol: str = "http", **sampling) -> Completion:
        """A streamed request collected into one Completion (client-side TTFT included)."""
        started = time.perf_counter()
        chunks, first = [], 0.0
        for chunk in self.stream(prompt, protocol=protocol, **sampling):
            if not first and chunk.token_ids:
                first = time.perf_counter() - started
            chunks.append(chunk)
        return Completion.from_chunks(chunks, time.perf_counter() - started, first)

    def _post(self, endpoint: str, body: dict):
        request = urllib.request.Request(
            f"{self.url}/v2/models/{self.model}/{endpoint}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise ServerError(f"server error (HTTP {exc.code}): {_error_message(exc.read()) or exc.reason}") from None
        except urllib.error.URLError as exc:
            raise DFlashError(
                f"cannot reach {self.url} ({exc.reason})", "start the server with `dflash-trt serve REPO` or fix --url"
            ) from None

    # ------------------------------------------------------------------ gRPC streaming

    def _stream_grpc(self, prompt: str, **sampling) -> Iterator[Chunk]:
        grpcclient = require("tritonclient.grpc", "serve", "gRPC streaming")
        from tritonclient.utils import InferenceServerException

        if not self.grpc_url:
            raise DFlashError("gRPC streaming needs the server's gRPC address", "pass grpc_url (for example localhost:8001)")
        client = getattr(self._local, "grpc", None)
        if client is None:  # one channel per thread, reused: a gRPC client holds one stream at a time
            client = self._local.grpc = grpcclient.InferenceServerClient(self.grpc_url)
        responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        finished = False
        try:
            body, reader = self._body(prompt, True, "grpc", **sampling)
            inputs = grpc_inputs(body)
            client.async_stream_infer(self.model, inputs, enable_empty_final_response=True)
            while True:
                try:
                    result, error = responses.get(timeout=self.timeout)
                except queue.Empty:
                    raise ServerError(f"no response from the server in {self.timeout:.0f} s") from None
                if error is not None:
                    finished = True
                    message = error.message() if isinstance(error, InferenceServerException) else str(error)
                    raise ServerError(f"server error: {message}")
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                if response.outputs:
                    yield _chunk(read_outputs(result), final=final, reader=reader)
                if final:
                    finished = True
                    return
        finally:
            # a consumer that stops early cancels its request on the server
            client.stop_stream(cancel_requests=not finished)


def health_probe(client: Any, model: str, timeout: float) -> tuple[Any, Any] | None:
    """Send `model` one `health_probe` request on a gRPC stream of `client` (a tritonclient.grpc
    client with no stream open), which the model process answers at once without decoding it:
    its (result, error), or None when nothing came within `timeout` seconds. The answer of a
    repository that declares protocol.LIMITS_OUTPUT carries the model's limits."""
    grpcclient = require("tritonclient.grpc", "serve", "gRPC requests")
    probe = grpcclient.InferInput(HEALTH_PROBE, [1], "BOOL")
    probe.set_data_from_numpy(np.array([True], dtype=np.bool_))
    answers: queue.Queue = queue.Queue()
    answer = None
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        # an empty final response still calls back (older repositories answer with no outputs)
        client.async_stream_infer(model, [probe], enable_empty_final_response=True)
        try:
            answer = answers.get(timeout=timeout)
        except queue.Empty:
            pass
        return answer
    finally:
        # answered: end the request stream, so gRPC's thread that reads it returns (cancelling leaves
        # it waiting for a next request forever: one thread leaked per probe, every second, in `serve`);
        # unanswered: cancel, since a graceful close would wait for the answer
        client.stop_stream(cancel_requests=answer is None)


def grpc_inputs(body: dict[str, Any]) -> list:
    """tritonclient InferInputs for a request body (types as in the model's config.pbtxt)."""
    grpcclient = require("tritonclient.grpc", "serve", "gRPC requests")

    inputs = []
    for name, value in body.items():
        dtype = INPUTS[name][0] if name in INPUTS else LLMAPI_FLAGS[name]
        if name == "input_ids":
            array, triton = np.asarray(value, dtype=np.int64).reshape(-1), "INT64"
        elif dtype == "TYPE_STRING":
            array = np.array([v.encode() for v in (value if isinstance(value, list) else [value])], dtype=np.object_)
            triton = "BYTES"
        else:
            numpy_type = {"TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}[dtype]
            array = np.array([value], dtype=numpy_type)
            triton = dtype[len("TYPE_") :]
        tensor = grpcclient.InferInput(name, list(array.shape), triton)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _value(name: str, array: np.ndarray) -> Any:
    if array.dtype == np.object_:
        values = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v) for v in array.reshape(-1)]
    else:
        values = array.reshape(-1).tolist()
    return values if name in LIST_OUTPUTS else (values[0] if values else None)


def read_outputs(result: Any, names: Sequence[str] | None = None) -> dict[str, Any]:
    """`names` -> a gRPC response's value (None where it sent none; default: every output it
    sent), each output decoded once.

    One pass over the outputs the response carries: `InferResult.as_numpy` scans them all for each
    name asked, and the OpenAI front end asks for 14 names on every streamed chunk (15 us a
    response that way, 6 us in one pass).
    """
    utils = require("tritonclient.utils", "serve", "gRPC requests")

    response = result.get_response()
    raw = response.raw_output_contents
    values = dict.fromkeys(names or ())
    for index, output in enumerate(response.outputs):
        if names is not None and output.name not in values:
            continue
        if index >= len(raw):  # not sent as raw bytes: tritonclient's own reading
            array = result.as_numpy(output.name)
        elif output.datatype == "BYTES":
            array = utils.deserialize_bytes_tensor(raw[index])
        else:
            array = np.frombuffer(raw[index], dtype=utils.triton_to_np_dtype(output.datatype))
        values[output.name] = _value(output.name, array)
    return values


def _error_message(body: bytes) -> str | None:
    """The "error" of a JSON body, or of the first server-sent event (generate_stream)."""
    text = body.decode("utf-8", errors="replace").strip()
    if text.startswith("data:"):
        text = text[5:].split("\n", 1)[0]
    try:
        data = json.loads(text)
    except ValueError:
        return text or None
    return data.get("error") if isinstance(data, dict) else None


def _as_list(value: Any) -> list:
    """Triton's JSON writes one-element tensors as scalars."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _chunk(data: dict[str, Any], final: bool | None, reader: LLMApiStream | None = None) -> Chunk:
    """A Chunk of one response; `final=None`: final when it carries a finish reason (HTTP streams). With
    `reader` the response is NVIDIA's LLM-API model's (cumulative text, string metrics)."""
    full_text = None
    if reader is not None:
        data = reader.step(data)
        full_text = data.pop("full_text")
    stats = {k: v for k, v in data.items() if k not in ("text_output", "output_ids", "acceptance_lengths", "model_name", "model_version")}
    if stats.get("finish_reason") is None:
        stats.pop("finish_reason", None)
    return Chunk(
        text=data.get("text_output") or "",
        token_ids=[int(t) for t in _as_list(data.get("output_ids"))],
        acceptance_lengths=[int(a) for a in _as_list(data.get("acceptance_lengths"))],
        final=bool(stats.get("finish_reason")) if final is None else final,
        stats=stats,
        full_text=full_text,
    )
