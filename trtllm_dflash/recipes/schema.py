"""The recipe schema: one YAML file per model x GPU in engine_recipes/<model>/<gpu>.yaml.

A recipe holds every decision `dflash-trt build` and `dflash-trt repo` need: which checkpoints,
which backend, which precisions, how the model is split over GPUs, the engine limits, how long a
draft to propose at each concurrency, and the Triton / TensorRT-LLM settings. Unknown keys are
errors (a typo must not silently fall back to a default); the loader turns validation errors into
`file:line: key.path: problem` lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from trtllm_dflash.backends import get_backend
from trtllm_dflash.contracts.defaults import PLANNED_MAX_BATCH

BackendName = Literal["trt", "trtllm", "torch"]  # trtllm_dflash.backends
# fp32 is for the torch runtime on CPU (the embedded demo); GPUs use bf16/fp16 and below.
WeightPrecision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4"]
ExpertPrecision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4", "mxfp4"]
KVCachePrecision = Literal["fp32", "bf16", "fp16", "fp8"]
DrafterPrecision = Literal["fp32", "bf16", "fp16", "fp8", "nvfp4"]
TRTFlavour = Literal["auto", "tensorrt", "tensorrt-rtx"]
MoEBackend = Literal["TRTLLM", "CUTLASS", "TRITON"]
# DFlashDecodingConfig.attention_backend (TensorRT-LLM 1.4): the drafter's attention kernels
DraftAttentionBackend = Literal["VANILLA", "TRTLLM", "FA4"]
# which SM majors each one runs on (its field description): VANILLA anywhere, TRTLLM SM100/103, FA4 SM90
DRAFT_ATTENTION_SM = {"TRTLLM": (10,), "FA4": (9,)}
# MoE backends that run gpt-oss's MXFP4 experts (TensorRT-LLM's gpt-oss deployment guide): Hopper
# TRITON (BF16 activations) or CUTLASS; Blackwell TRTLLM (MXFP8 activations) or CUTLASS
MOE_BACKENDS_BY_SM = {9: ("TRITON", "CUTLASS"), 10: ("TRTLLM", "CUTLASS")}


def trtllm_draft_len_schedule(schedule: dict[int, int], max_batch_size: int) -> dict[int, int]:
    """Our schedule ({1: 15, 8: 7, 32: 0}: from N sequences on) in TensorRT-LLM's form.

    TensorRT-LLM's key is the LARGEST batch size that uses the length ({7: 15, 31: 7}; batches above
    the largest key draft 0), and its smallest key must map to max_draft_len.
    """
    items = sorted(schedule.items())
    out: dict[int, int] = {}
    for (start, length), following in zip(items, items[1:] + [(None, 0)]):
        if length == 0:
            break
        out[(following[0] - 1) if following[0] is not None else max(max_batch_size, start)] = length
    return out


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class ModelSection(_Section):
    """The target LLM."""

    name: str = Field(description="Catalog name (shapes for planning), e.g. qwen3-8b; see `dflash-trt recipes list`.")
    checkpoint: str = Field(description="Hugging Face id or local directory of the target checkpoint.")


class DrafterSection(_Section):
    """The DFlash drafter and how much of its block to use."""

    checkpoint: str = Field(description="Hugging Face id or local directory (z-lab layout).")
    block_size: int = Field(ge=2, le=64, description="Tokens per draft block (anchor + block_size - 1 drafts).")
    mask_token_id: int | None = Field(default=None, ge=0, description="Default: from the drafter's config.json.")
    target_layer_ids: list[int] | None = Field(default=None, description="Default: from the drafter's config.json.")
    draft_len_schedule: dict[int, int] | None = Field(
        default=None,
        description=(
            "Draft tokens per step by number of running sequences, TensorRT-LLM semantics: "
            "{1: 15, 8: 7, 32: 0} drafts 15 tokens from 1 sequence on, 7 from 8 on, none from 32 on."
        ),
    )

    @field_validator("draft_len_schedule")
    @classmethod
    def _schedule_is_monotone(cls, schedule: dict[int, int] | None) -> dict[int, int] | None:
        if schedule is None:
            return None
        if 1 not in schedule:
            raise ValueError("must have an entry for concurrency 1 (the longest draft), e.g. {1: 15, 8: 7, 32: 0}")
        previous = None
        for concurrency in sorted(schedule):
            length = schedule[concurrency]
            if concurrency < 1:
                raise ValueError(f"concurrency {concurrency} must be >= 1")
            if length < 0:
                raise ValueError(f"draft length {length} at concurrency {concurrency} must be >= 0")
            if previous is not None and length > previous:
                raise ValueError("draft lengths must not grow with concurrency (drafting pays off less at high batch)")
            previous = length
        return dict(sorted(schedule.items()))

    @model_validator(mode="after")
    def _schedule_fits_block(self) -> "DrafterSection":
        if self.draft_len_schedule and self.draft_len_schedule[1] > self.block_size - 1:
            raise ValueError(f"draft_len_schedule[1] = {self.draft_len_schedule[1]} is longer than block_size - 1 = {self.block_size - 1}")
        return self


class CalibrationSection(_Section):
    """Calibration data for post-training quantization (ModelOpt)."""

    dataset: str = Field(default="builtin", description="'builtin' (shipped text) or a path to a .txt/.jsonl file.")
    num_samples: int = Field(default=512, ge=1)
    max_seq_len: int = Field(default=1024, ge=16)


class QuantizationSection(_Section):
    """Precisions of the target, its MoE experts, the KV cache and the drafter."""

    weights: WeightPrecision = Field(default="bf16", description="Target's decoder linear layers (embedding and LM head stay BF16).")
    moe_experts: ExpertPrecision | None = Field(
        default=None, description="MoE expert weights; default: same as `weights` (gpt-oss ships MXFP4)."
    )
    kv_cache: KVCachePrecision = "bf16"
    drafter: DrafterPrecision = Field(
        default="bf16", description="Drafter weights; BF16 unless a recipe says otherwise. nvfp4: ModelOpt PTQ on a CUDA GPU, fc kept BF16."
    )
    calibration: CalibrationSection | None = Field(
        default=None, description="Calibration text for FP8/NVFP4 PTQ, and for the activation scales of MXFP4 -> NVFP4 experts."
    )

    @property
    def experts(self) -> str:
        return self.moe_experts or self.weights


class ParallelismSection(_Section):
    """How the target is split over GPUs (one node)."""

    num_gpus: int = Field(default=1, ge=1)
    tp: int = Field(default=1, ge=1, description="Tensor parallel size.")
    ep: int = Field(default=1, ge=1, description="MoE expert parallel size (divides tp).")
    attention_dp: bool = Field(default=False, description="Data-parallel attention (TensorRT-LLM enable_attention_dp).")

    @model_validator(mode="after")
    def _consistent(self) -> "ParallelismSection":
        if self.num_gpus % self.tp:
            raise ValueError(f"tp = {self.tp} does not divide num_gpus = {self.num_gpus}")
        if self.tp % self.ep:
            raise ValueError(f"ep = {self.ep} does not divide tp = {self.tp} (TensorRT-LLM: moe_tp x ep = tp)")
        return self


class LimitsSection(_Section):
    """Engine limits: the optimization-profile maxima and the scheduler's bounds."""

    max_batch_size: int = Field(ge=1)
    max_input_len: int = Field(ge=1)
    max_seq_len: int = Field(ge=2, description="Prompt + generated tokens per sequence.")
    max_num_tokens: int | None = Field(default=None, ge=1, description="Tokens per forward pass; default: max_input_len.")

    @model_validator(mode="after")
    def _input_fits_sequence(self) -> "LimitsSection":
        if self.max_input_len >= self.max_seq_len:
            raise ValueError(f"max_input_len ({self.max_input_len}) must be < max_seq_len ({self.max_seq_len})")
        return self

    @property
    def tokens_per_step(self) -> int:
        return self.max_num_tokens or self.max_input_len


class TritonSection(_Section):
    """Triton Inference Server model settings."""

    model_name: str = "dflash"
    max_batch_size: int = Field(default=PLANNED_MAX_BATCH, ge=1, description="Requests batched into one decoding step.")
    instance_count: int = Field(default=1, ge=1)
    decoupled: bool = Field(default=True, description="Streaming responses need decoupled mode.")


class CudaGraphSection(_Section):
    enable_padding: bool = True
    max_batch_size: int = Field(default=PLANNED_MAX_BATCH, ge=1)


class TRTLLMSection(_Section):
    """TensorRT-LLM PyTorch-backend (LLM API) options for backend: trtllm."""

    moe_backend: MoEBackend | None = Field(
        default=None, description="Hopper: TRITON or CUTLASS; Blackwell: TRTLLM (the default there) or CUTLASS."
    )
    attention_backend: DraftAttentionBackend | None = Field(
        default=None, description="The DFlash drafter's attention: VANILLA (any GPU), TRTLLM (Blackwell), FA4 (Hopper)."
    )
    cuda_graph: CudaGraphSection | None = Field(default_factory=CudaGraphSection)
    kv_cache_free_gpu_memory_fraction: float = Field(default=0.85, gt=0.0, lt=1.0)
    max_concurrency: int | None = Field(default=None, ge=1, description="Speculation off above this many sequences.")
    extra_llm_api_options: dict[str, Any] = Field(
        default_factory=dict, description="Passed verbatim into model.yaml / trtllm-serve --config (escape hatch)."
    )


class TRTSection(_Section):
    """Engine build options for backend: trt (this toolkit's TensorRT engines)."""

    flavour: TRTFlavour = Field(default="auto", description="auto: from the GPU catalog (TensorRT-RTX for RTX GPUs).")
    builder_optimization_level: int = Field(default=3, ge=0, le=5)
    use_plugins: bool = Field(default=True, description="DFlash plugin nodes; false builds the plugin-free graphs.")
    timing_cache: bool = True
    cuda_graphs: bool = True


class Recipe(_Section):
    """A deployment of one target + drafter on one GPU type."""

    description: str = ""
    model: ModelSection
    drafter: DrafterSection
    gpu: str = Field(description="Catalog GPU name (h100, h200, b200, b300, gb200, gb300, rtx-pro-6000) or cpu.")
    backend: BackendName  # the deployment backend (trtllm_dflash.backends)
    quantization: QuantizationSection = Field(default_factory=QuantizationSection)
    parallelism: ParallelismSection = Field(default_factory=ParallelismSection)
    limits: LimitsSection
    triton: TritonSection = Field(default_factory=TritonSection)
    trtllm: TRTLLMSection | None = None
    trt: TRTSection | None = None

    _path: Path | None = PrivateAttr(default=None)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, gpu: str) -> str:
        from trtllm_dflash.catalog.gpus import CPU, GPUS, resolve_gpu
        from trtllm_dflash.errors import UnknownNameError

        if gpu.strip().lower() == CPU:
            return CPU
        try:
            return resolve_gpu(gpu).name
        except UnknownNameError:
            raise ValueError(f"unknown GPU {gpu!r}; use one of: {', '.join(GPUS)} or cpu") from None

    @model_validator(mode="before")
    @classmethod
    def _backend_sections(cls, data: Any) -> Any:
        """The backend's own section exists (with defaults) and no other backend's section does."""
        if not isinstance(data, dict) or data.get("backend") not in ("trt", "trtllm", "torch"):
            return data
        backend = data["backend"]
        for section in ("trt", "trtllm"):
            if data.get(section) is not None and backend != section:
                raise ValueError(f"a '{section}' section is only for backend: {section} (this recipe says backend: {backend})")
        if backend in ("trt", "trtllm") and data.get(backend) is None:
            data = {**data, backend: {}}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "Recipe":
        backend = get_backend(self.backend)
        if not backend.multi_gpu and self.parallelism.num_gpus > 1:
            raise ValueError(f"backend {self.backend} runs on one GPU; use backend: trtllm for {self.parallelism.num_gpus} GPUs")
        if self.gpu == "cpu" and not backend.runs_on_cpu:
            raise ValueError(f"gpu: cpu runs only backend: torch (this recipe says backend: {self.backend})")
        if self.trtllm is not None and self.trtllm.max_concurrency is not None and self.drafter.draft_len_schedule:
            raise ValueError(
                "trtllm.max_concurrency cannot be combined with drafter.draft_len_schedule (TensorRT-LLM refuses both); "
                "drop max_concurrency: a schedule ending in 0 already stops drafting"
            )
        if self.trtllm is not None and self.trtllm.moe_backend is not None and self.gpu != "cpu":
            from trtllm_dflash.catalog.gpus import resolve_gpu

            major = resolve_gpu(self.gpu).compute_capability[0]
            allowed = MOE_BACKENDS_BY_SM.get(major, ())
            if allowed and self.trtllm.moe_backend not in allowed:
                raise ValueError(
                    f"trtllm.moe_backend {self.trtllm.moe_backend} is not the MoE backend for {self.gpu} "
                    f"(SM {major}.x); use {' or '.join(allowed)}"
                )
        if self.trtllm is not None and self.trtllm.attention_backend in DRAFT_ATTENTION_SM and self.gpu != "cpu":
            from trtllm_dflash.catalog.gpus import resolve_gpu

            major = resolve_gpu(self.gpu).compute_capability[0]
            if major not in DRAFT_ATTENTION_SM[self.trtllm.attention_backend]:
                fits = [name for name, sms in DRAFT_ATTENTION_SM.items() if major in sms]
                raise ValueError(
                    f"trtllm.attention_backend {self.trtllm.attention_backend} does not run on {self.gpu} (SM {major}.x); "
                    f"use {' or '.join(['VANILLA', *fits])}"
                )
        if self.triton.max_batch_size > self.limits.max_batch_size:
            raise ValueError(
                f"triton.max_batch_size ({self.triton.max_batch_size}) exceeds limits.max_batch_size ({self.limits.max_batch_size})"
            )
        return self

    # ----- derived values that the builder and the repository writer use -----

    @property
    def path(self) -> Path | None:
        """The YAML file this recipe was loaded from (None when built in code)."""
        return self._path

    @property
    def name(self) -> str:
        """'<model>/<gpu>', the name `dflash-trt recipes show` and `build --recipe` accept."""
        return f"{self.model.name}/{self.gpu}"

    @property
    def max_draft_len(self) -> int:
        """Longest draft per step: the schedule's value at concurrency 1, else block_size - 1."""
        if self.drafter.draft_len_schedule:
            return self.drafter.draft_len_schedule[1]
        return self.drafter.block_size - 1

    def draft_len_for(self, concurrency: int) -> int:
        """Draft tokens per step when `concurrency` sequences run (0: plain autoregressive steps)."""
        length = self.max_draft_len
        for threshold, value in (self.drafter.draft_len_schedule or {}).items():
            if concurrency >= threshold:
                length = value
        if self.trtllm is not None and self.trtllm.max_concurrency is not None and concurrency > self.trtllm.max_concurrency:
            return 0
        return length

    @property
    def precision(self):
        """What this deployment quantizes and how (recipes/precision.py): the quantization section
        with the model's published expert format, the one value the planner and the builder ask."""
        from trtllm_dflash.recipes.precision import Precision

        return Precision.from_recipe(self)

    def gpu_spec(self):
        """The catalog GPUSpec (None for gpu: cpu)."""
        from trtllm_dflash.catalog.gpus import CPU, resolve_gpu

        return None if self.gpu == CPU else resolve_gpu(self.gpu)

    def model_spec(self):
        """The catalog ModelSpec for model.name (falls back to model.checkpoint when it is a local
        directory), with the drafter read from drafter.checkpoint where that is a local directory."""
        from trtllm_dflash.catalog.models import resolve_model, with_local_drafter
        from trtllm_dflash.errors import UnknownNameError

        try:
            spec = resolve_model(self.model.name)
        except UnknownNameError:
            spec = resolve_model(self.model.checkpoint)
        return with_local_drafter(spec, self.drafter.checkpoint)

    def trt_flavour(self) -> str | None:
        """'tensorrt' or 'tensorrt-rtx' for backend trt (resolving 'auto' through the GPU catalog)."""
        if self.trt is None:
            return None
        if self.trt.flavour != "auto":
            return self.trt.flavour
        spec = self.gpu_spec()
        return spec.trt_flavour if spec else None

    def llm_api_options(self, speculative_model: str | None = None) -> dict[str, Any]:
        """TensorRT-LLM LLM-API options (model.yaml of the Triton `tensorrt_llm` model, or
        `trtllm-serve --config`), for backend: trtllm. Keys as listed in PLATFORM.md."""
        if self.trtllm is None:
            raise ValueError(f"recipe {self.name} has backend {self.backend}, not trtllm")
        spec: dict[str, Any] = {
            "decoding_type": "DFlash",
            "max_draft_len": self.max_draft_len,
            "speculative_model": speculative_model or self.drafter.checkpoint,
        }
        if self.drafter.mask_token_id is not None:
            spec["mask_token_id"] = self.drafter.mask_token_id
        if self.drafter.target_layer_ids is not None:
            spec["target_layer_ids"] = list(self.drafter.target_layer_ids)
        if self.drafter.draft_len_schedule:
            spec["draft_len_schedule"] = trtllm_draft_len_schedule(self.drafter.draft_len_schedule, self.limits.max_batch_size)
        if self.trtllm.max_concurrency is not None:
            spec["max_concurrency"] = self.trtllm.max_concurrency
        if self.trtllm.attention_backend is not None:
            spec["attention_backend"] = self.trtllm.attention_backend
        options: dict[str, Any] = {
            "tensor_parallel_size": self.parallelism.tp,
            "moe_expert_parallel_size": self.parallelism.ep,
            "enable_attention_dp": self.parallelism.attention_dp,
            "max_batch_size": self.limits.max_batch_size,
            "max_num_tokens": self.limits.tokens_per_step,
            "max_seq_len": self.limits.max_seq_len,
            "kv_cache_config": {
                "dtype": "fp8" if self.precision.fp8_kv_cache else "auto",
                "free_gpu_memory_fraction": self.trtllm.kv_cache_free_gpu_memory_fraction,
            },
            "speculative_config": spec,
        }
        if self.trtllm.cuda_graph is not None:
            options["cuda_graph_config"] = self.trtllm.cuda_graph.model_dump()
        if self.trtllm.moe_backend is not None:
            options["moe_config"] = {"backend": self.trtllm.moe_backend}
        options.update(self.trtllm.extra_llm_api_options)
        return options
