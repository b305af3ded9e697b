"""What `dflash-trt bench` measures: a small interface, one implementation per kind of system.

A backend decodes a batch of tokenized prompts either autoregressively or with DFlash, at a
given block size and concurrency, and reports what it produced and how long it took. The bench
(measure.py) only talks to this interface, so the same interleaved measurement runs on:
- `PairBackend`: a target/drafter checkpoint pair on the torch runtime (implemented here);
- a build directory of TensorRT engines (`dflash-trt build`, issue 4) and
- a running Triton server (`dflash-trt repo` / serving, issue 5): both plug in here; until their
  runtimes exist, asking for them fails with a message that says so.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from pathlib import Path

import torch

from trtllm_dflash.decoding import Decoder, Request, SamplingParams, SequenceResult, StepStats
from trtllm_dflash.errors import DFlashError


@dataclasses.dataclass
class BackendRun:
    """One timed decode of a batch of requests."""

    results: list[SequenceResult]  # in request order
    seconds: float  # wall time of the whole batch
    steps: list[StepStats]  # per decoding step (empty when the backend cannot see steps)

    @property
    def generated_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.results)


class BenchBackend(abc.ABC):
    """A system under test that can decode autoregressively and with DFlash."""

    name: str
    block_size: int  # the drafter's trained block size
    device: str = "cpu"

    @abc.abstractmethod
    def encode(self, prompt: str) -> list[int]:
        """Token ids of a text prompt."""

    @abc.abstractmethod
    def run(
        self, prompts: list[list[int]], speculative: bool, block_size: int, concurrency: int, max_new_tokens: int
    ) -> BackendRun:
        """Decode every prompt greedily (temperature 0), at most `concurrency` at a time."""

    def describe(self) -> dict:
        return {"backend": self.name, "device": self.device, "block_size": self.block_size}


class PairBackend(BenchBackend):
    """A target and its DFlash drafter on the torch runtime (one target model, two runtimes).

    The autoregressive baseline is this package's own decoding loop without a drafter, on the
    same loaded target, so both modes pay the same framework overheads.
    """

    name = "torch"

    def __init__(self, target: str | Path, drafter: str | Path, device: str = "cpu") -> None:
        from trtllm_dflash.checkpoints import load_drafter, load_target
        from trtllm_dflash.runtime.torch_runtime import TorchRuntime

        if device == "cuda" and not torch.cuda.is_available():
            raise DFlashError("--device cuda was asked for but no CUDA GPU is visible", "use --device cpu")
        self.target = load_target(target, device=device, require_tokenizer=True)
        self.drafter = load_drafter(drafter, target=self.target)
        self.ar_runtime = TorchRuntime(self.target.model)
        self.dflash_runtime = TorchRuntime(self.target.model, self.drafter)
        self.block_size = int(self.drafter.config.block_size)
        self.device = device
        self.max_positions = int(getattr(self.target.config, "max_position_embeddings", 4096) or 4096)

    def encode(self, prompt: str) -> list[int]:
        return list(self.target.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def run(self, prompts, speculative, block_size, concurrency, max_new_tokens) -> BackendRun:
        runtime = self.dflash_runtime if speculative else self.ar_runtime
        max_context = max(len(p) for p in prompts) + max_new_tokens + 1
        # a fresh decoder per run: allocation happens here, outside the timed region
        decoder = Decoder(runtime, max_batch=concurrency, max_context=max_context,
                          block_size=block_size if speculative else None, profile=True)
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=())
        requests = [Request(list(p), params) for p in prompts]
        if self.device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        results = decoder.generate(requests)
        if self.device == "cuda":
            torch.cuda.synchronize()
        return BackendRun(results, time.perf_counter() - started, list(decoder.stats))

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


def open_backend(
    model: str | None = None,
    target: str | None = None,
    drafter: str | None = None,
    build: Path | None = None,
    url: str | None = None,
    device: str = "cpu",
) -> BenchBackend:
    """The backend the command line names (exactly one of model, target+drafter, build, url)."""
    chosen = [name for name, value in (("--model", model), ("--target", target), ("--build", build), ("--url", url)) if value]
    if len(chosen) != 1:
        raise DFlashError(
            "name exactly one system to benchmark" + (f" (got {' and '.join(chosen)})" if chosen else ""),
            "pass --model demo, or --target DIR --drafter DIR, or --build DIR, or --url URL",
        )
    if build is not None:
        raise DFlashError(
            f"benchmarking the build directory {build} needs the TensorRT engine runtime of `dflash-trt build` "
            "(issue 4), which this installation does not have yet",
            "benchmark the checkpoints instead: --target DIR --drafter DIR (or --model demo)",
        )
    if url is not None:
        raise DFlashError(
            f"benchmarking the server at {url} needs the Triton client of the serving issue (issue 5), "
            "which this installation does not have yet",
            "benchmark the checkpoints instead: --target DIR --drafter DIR (or --model demo)",
        )
    if model is not None:
        if model != "demo":
            raise DFlashError(
                f"--model {model} is not a pair this command can load",
                "use --model demo (the embedded pair), or --target DIR --drafter DIR",
            )
        return PairBackend("demo", "demo", device)
    if drafter is None:
        raise DFlashError("--target given without --drafter", "pass the DFlash drafter with --drafter DIR")
    return PairBackend(target, drafter, device)
