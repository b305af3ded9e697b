"""What `dflash-trt bench` measures: a small interface, one implementation per kind of system.

A system decodes a batch of tokenized prompts either autoregressively or with DFlash, at a
given block size and concurrency, and reports what it produced and how long it took. The bench
(measure.py) only talks to this interface, so the same interleaved measurement runs on:
- `PairSystem`: a target/drafter checkpoint pair on the torch runtime;
- `ServerSystem`: a running Triton server (serving, issue 5) holding a DFlash model and its
  autoregressive baseline (the same target without the drafter), through the serving client;
- `BuildSystem`: a `dflash-trt build` directory: its TensorRT engines on a GPU, or on CPU the
  ONNX graphs they were built from (onnxruntime).
"""

from __future__ import annotations

import abc
import dataclasses
import queue
import threading
import time
from pathlib import Path

import torch

from trtllm_dflash.decoding import Decoder, Request, SamplingParams, SequenceResult, StepStats
from trtllm_dflash.errors import DFlashError


@dataclasses.dataclass
class SystemRun:
    """One timed decode of a batch of requests."""

    results: list[SequenceResult]  # in request order
    seconds: float  # wall time of the whole batch
    steps: list[StepStats]  # per decoding step (empty when the system cannot see steps)

    @property
    def generated_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.results)


class BenchSystem(abc.ABC):
    """A system under test that can decode autoregressively and with DFlash."""

    name: str
    block_size: int  # the drafter's trained block size (or the one a server decodes with)
    fixed_block_size: bool = False  # True where the block size cannot change per run (a server)
    device: str = "cpu"

    @abc.abstractmethod
    def run(self, prompts: list[str], speculative: bool, block_size: int, concurrency: int, max_new_tokens: int) -> SystemRun:
        """Decode every prompt greedily (temperature 0), at most `concurrency` at a time.

        Results come back in prompt order; `prompt_ids` and `token_ids` are token ids.
        """

    def describe(self) -> dict:
        # "backend" is the system's key in bench.json (the report format predates the name)
        return {"backend": self.name, "device": self.device, "block_size": self.block_size}


class InProcessSystem(BenchSystem):
    """Two runtimes of the decoding loop in this process: the target alone and target + drafter.

    The autoregressive baseline is this package's own decoding loop without a drafter, on the
    same weights, so both modes pay the same framework overheads.
    """

    def __init__(self, ar_runtime, dflash_runtime, tokenizer, block_size: int, device: str) -> None:
        self.ar_runtime, self.dflash_runtime = ar_runtime, dflash_runtime
        self.tokenizer = tokenizer
        self.block_size = int(block_size)
        self.device = device
        self._encoded: dict[str, list[int]] = {}

    def encode(self, prompt: str) -> list[int]:
        if prompt not in self._encoded:
            ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
            if not ids:
                raise DFlashError("a prompt encodes to no tokens", "remove empty prompts")
            self._encoded[prompt] = ids
        return self._encoded[prompt]

    def run(self, prompts, speculative, block_size, concurrency, max_new_tokens) -> SystemRun:
        runtime = self.dflash_runtime if speculative else self.ar_runtime
        prompts = [self.encode(p) for p in prompts]
        max_context = max(len(p) for p in prompts) + max_new_tokens + 1
        # a fresh decoder per run: allocation happens here, outside the timed region
        decoder = Decoder(
            runtime, max_batch=concurrency, max_context=max_context, block_size=block_size if speculative else None, profile=True
        )
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=())
        requests = [Request(list(p), params) for p in prompts]
        if self.device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        results = decoder.generate(requests)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return SystemRun(results, time.perf_counter() - started, list(decoder.stats))


class PairSystem(InProcessSystem):
    """A target and its DFlash drafter checkpoints on the torch runtime (one loaded target)."""

    name = "torch"

    def __init__(self, target: str | Path, drafter: str | Path, device: str = "cpu") -> None:
        from trtllm_dflash.checkpoints import load_drafter, load_target
        from trtllm_dflash.runtime.torch_runtime import TorchRuntime

        if device == "cuda" and not torch.cuda.is_available():
            raise DFlashError("--device cuda was asked for but no CUDA GPU is visible", "use --device cpu")
        self.target = load_target(target, device=device, require_tokenizer=True)
        self.drafter = load_drafter(drafter, target=self.target)
        super().__init__(
            TorchRuntime(self.target.model),
            TorchRuntime(self.target.model, self.drafter),
            self.target.tokenizer,
            self.drafter.config.block_size,
            device,
        )

    def describe(self) -> dict:
        return {
            **super().describe(),
            "target": str(self.target.path),
            "target_layers": int(self.target.config.num_hidden_layers),
            "target_parameters": sum(p.numel() for p in self.target.model.parameters()),
            "drafter_layers": int(self.drafter.config.num_hidden_layers),
            "drafter_parameters": sum(p.numel() for p in self.drafter.parameters()),
            "threads": torch.get_num_threads(),
        }


class BuildSystem(InProcessSystem):
    """The artifacts of a `dflash-trt build`: its TensorRT engines on a GPU, its ONNX graphs on CPU.

    On CPU the graphs the engines were built from run with onnxruntime (the same graphs, not the
    engines: TensorRT needs a GPU); `describe()` says which one ran.
    """

    def __init__(self, build: Path, device: str = "cpu") -> None:
        from trtllm_dflash.backends import PipelineSource, get_backend
        from trtllm_dflash.backends.trt import engines_folder

        build = Path(build).expanduser()
        if device == "cuda" and not torch.cuda.is_available():
            raise DFlashError("--device cuda was asked for but no CUDA GPU is visible", "use --device cpu (runs the build's ONNX graphs)")
        backend = get_backend("trt")
        ar, dflash = (
            backend.open_pipeline(PipelineSource(build=build, speculative=d, onnx=device != "cuda"), device=device) for d in (False, True)
        )
        if device == "cuda":
            self.name, self.artifacts = "tensorrt", str(engines_folder(build))
        else:
            from trtllm_dflash.runtime.artifacts import export_dir_of

            self.name, self.artifacts = "onnxruntime", str(export_dir_of(build))
        if dflash.runtime.drafter_config is None:
            raise DFlashError(f"the build {build} has no drafter", "rebuild it with a drafter (the recipe's drafter section)")
        self.max_seq_len = int(dflash.runtime.info["bounds"]["max_seq_len"])
        block = min(int(dflash.runtime.drafter_config.block_size), int(dflash.runtime.info["bounds"]["block_size"]))
        super().__init__(ar.runtime, dflash.runtime, dflash.tokenizer, block, device)

    def run(self, prompts, speculative, block_size, concurrency, max_new_tokens) -> SystemRun:
        if block_size > self.block_size:
            raise DFlashError(
                f"block size {block_size} is beyond the build's bound {self.block_size}", f"sweep block sizes up to {self.block_size}"
            )
        longest = max(len(self.encode(p)) for p in prompts) + max_new_tokens + 1
        if longest > self.max_seq_len:
            raise DFlashError(
                f"a prompt plus --max-new-tokens needs {longest} positions; the build's engines hold {self.max_seq_len}",
                "lower --max-new-tokens, or rebuild with a larger max_seq_len",
            )
        return super().run(prompts, speculative, block_size, concurrency, max_new_tokens)

    def describe(self) -> dict:
        return {**super().describe(), "artifacts": self.artifacts, "threads": torch.get_num_threads()}


class ServerSystem(BenchSystem):
    """A running DFlash Triton server: its DFlash model and its autoregressive baseline model.

    Requests are streamed through the serving client (`trtllm_dflash.serving.client`), from
    `concurrency` client threads that each send their next request when the last one ends, so
    the server's in-flight batching sees `concurrency` users. The server decodes at the block
    size its repository was written with, and per-step times are not visible from a client.
    """

    name = "triton"
    fixed_block_size = True

    def __init__(self, url: str, model: str = "dflash", ar_model: str = "ar", protocol: str = "http") -> None:
        from urllib.parse import urlparse

        from trtllm_dflash.serving.client import DFlashClient

        if protocol not in ("http", "grpc"):
            raise DFlashError(f"unknown protocol {protocol!r}", "use http or grpc")
        grpc_url = f"{urlparse(url if '://' in url else 'http://' + url).hostname}:8001" if protocol == "grpc" else None
        self.url, self.protocol = url, protocol
        self.clients = {
            True: DFlashClient(url, model=model, grpc_url=grpc_url),
            False: DFlashClient(url, model=ar_model, grpc_url=grpc_url),
        }
        if self.clients[True].speaks_llmapi(protocol):
            raise DFlashError(
                f"model {model!r} on {url} is NVIDIA's LLM-API model (a trtllm repository): it sends no token ids or per-step "
                "acceptance and its repository has no autoregressive baseline, so this side-by-side bench cannot measure it",
                "bench trtllm-serve with the repository's trtllm-serve.yaml through `dflash-trt bench --openai-url http://HOST:8000/v1 "
                "--model NAME`, or send single requests with `dflash-trt generate --url`",
            )
        for client in self.clients.values():
            if not client.ready():
                raise DFlashError(
                    f"model {client.model!r} is not ready on the server at {url}",
                    "serve a repository with a DFlash model and its autoregressive baseline "
                    "(benchmarks/bench_serving.py writes one) or name them with --server-model/--ar-model",
                )
        self.block_size = self._served_block_size(model)

    def _served_block_size(self, model: str) -> int:
        """The block size in the served model's config (its `block_size`, else its drafter's)."""
        import tritonclient.http as httpclient

        from trtllm_dflash.checkpoints import resolve_checkpoint
        from trtllm_dflash.config import DrafterConfig
        from trtllm_dflash.served_model.model_parameters import ServingConfig

        host = self.clients[True].url.split("://", 1)[1]
        parameters = httpclient.InferenceServerClient(host).get_model_config(model).get("parameters", {})
        served = ServingConfig.from_parameters(parameters)
        if served.block_size:
            return int(served.block_size)
        if served.drafter is None:
            raise DFlashError(f"model {model!r} on {self.url} serves without a drafter", "pass the DFlash model with --server-model")
        return DrafterConfig.from_dir(resolve_checkpoint(served.drafter, "drafter")).block_size

    def run(self, prompts, speculative, block_size, concurrency, max_new_tokens) -> SystemRun:
        client = self.clients[speculative]
        jobs: queue.Queue = queue.Queue()
        for index, prompt in enumerate(prompts):
            jobs.put((index, prompt))
        results: dict[int, SequenceResult] = {}
        errors: list[Exception] = []

        def user() -> None:
            while not errors:
                try:
                    index, prompt = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    done = client.complete(prompt, protocol=self.protocol, max_new_tokens=max_new_tokens, temperature=0.0)
                except Exception as exc:  # noqa: BLE001 - re-raised below, in the caller's thread
                    errors.append(exc)
                    return
                results[index] = SequenceResult(
                    index,
                    [],
                    list(done.token_ids),
                    list(done.acceptance_lengths),
                    done.finish_reason,
                    time_to_first_token=done.client_time_to_first_token,
                    elapsed=done.latency,
                )

        started = time.perf_counter()
        users = [threading.Thread(target=user) for _ in range(min(concurrency, len(prompts)))]
        for thread in users:
            thread.start()
        for thread in users:
            thread.join()
        seconds = time.perf_counter() - started
        if errors:
            raise errors[0]
        return SystemRun([results[i] for i in range(len(prompts))], seconds, [])

    def describe(self) -> dict:
        return {
            **super().describe(),
            "url": self.url,
            "protocol": self.protocol,
            "models": [self.clients[True].model, self.clients[False].model],
        }


def open_system(
    model: str | None = None,
    target: str | None = None,
    drafter: str | None = None,
    build: Path | None = None,
    url: str | None = None,
    device: str = "cpu",
    server_model: str = "dflash",
    ar_model: str = "ar",
    protocol: str = "http",
) -> BenchSystem:
    """The system the command line names (exactly one of model, target+drafter, build, url)."""
    chosen = [name for name, value in (("--model", model), ("--target", target), ("--build", build), ("--url", url)) if value]
    if len(chosen) != 1:
        raise DFlashError(
            "name exactly one system to benchmark" + (f" (got {' and '.join(chosen)})" if chosen else ""),
            "pass --model demo, or --target DIR --drafter DIR, or --build DIR, or --url URL",
        )
    if build is not None:
        return BuildSystem(build, device)
    if url is not None:
        return ServerSystem(url, server_model, ar_model, protocol)
    if model is not None:
        if model != "demo":
            raise DFlashError(
                f"--model {model} is not a pair this command can load",
                "use --model demo (the embedded pair), or --target DIR --drafter DIR",
            )
        return PairSystem("demo", "demo", device)
    if drafter is None:
        raise DFlashError("--target given without --drafter", "pass the DFlash drafter with --drafter DIR")
    return PairSystem(target, drafter, device)
