"""What one served DFlash model is (its config.pbtxt parameters): checkpoints (or engines), backend, limits.

The repository writer stores these values as the `parameters` of the model's config.pbtxt
(visible through Triton's model-config API, overridable when loading the model); the Python
backend model reads them back from there. Kept apart from the code that loads and runs models.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trtllm_dflash.contracts.defaults import DEFAULT_NEW_TOKENS, SERVED_MAX_BATCH, SERVED_MAX_CONTEXT, SERVED_PREFIX_CACHE_MIB
from trtllm_dflash.contracts.request_limits import DEFAULT_PREFILL_CHUNK, DEFAULT_PREFILL_SHARE
from trtllm_dflash.errors import DFlashError

ServedBackend = Literal["torch", "trt"]  # the backends whose repository holds our Python-backend models
DEFAULT_PREFIX_CACHE_MIB = SERVED_PREFIX_CACHE_MIB  # contracts/defaults.py says why it is on


@dataclasses.dataclass(frozen=True)
class ServingLimits:
    """A served model's token limits, under one name each from the repository to the decoder.

    The config.pbtxt parameters keep their wire names (`max_context`, `max_tokens`,
    `default_max_tokens`); everything that serves reads them through `serving_limits`."""

    max_context: int  # prompt + generated tokens of one request
    max_new_tokens: int  # the most a request may ask to generate (OpenAI max_tokens, sampling_param_max_tokens)
    default_new_tokens: int  # generated when a request does not say

    def to_json(self) -> str:
        """What a loaded model publishes (protocol.LIMITS_OUTPUT)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ServingLimits":
        """The published limits; DFlashError when they are not three positive integers."""
        try:
            values = json.loads(text)
            limits = cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)})
        except (ValueError, TypeError, KeyError):
            raise DFlashError(f"a model published limits that are not ServingLimits: {text[:200]!r}", "rewrite its repository") from None
        if not all(isinstance(v, int) and v > 0 for v in dataclasses.astuple(limits)):
            raise DFlashError(f"a model published limits that are not positive integers: {text[:200]!r}", "rewrite its repository")
        return limits


def serving_limits(max_context: int, max_tokens: int | None = None, default_max_tokens: int | None = None) -> ServingLimits:
    """The limits of a model that holds `max_context` tokens: at least one of them is the prompt."""
    limit = max_context - 1 if max_tokens is None else min(max_tokens, max_context - 1)
    return ServingLimits(max_context, limit, min(default_max_tokens or DEFAULT_NEW_TOKENS, limit))


class ServingConfig(BaseModel):
    """One Python-backend model of the repository."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: ServedBackend = "torch"
    target: str = Field(description="Target checkpoint directory, or 'demo'.")
    drafter: Optional[str] = Field(None, description="Drafter directory, or 'demo'; None serves autoregressively.")
    engines: Optional[str] = Field(None, description="Build directory with TensorRT engines (backend 'trt').")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_batch: int = Field(SERVED_MAX_BATCH, ge=1, description="Requests decoded together in one step (in-flight batching).")
    max_context: int = Field(SERVED_MAX_CONTEXT, ge=2, description="Prompt + generated tokens per request.")
    max_tokens: int = Field(1024, ge=1, description="Largest sampling_param_max_tokens a request may ask for.")
    default_max_tokens: Optional[int] = Field(
        None, ge=1, description=f"Tokens generated when a request does not say (default: min({DEFAULT_NEW_TOKENS}, max_tokens))."
    )
    block_size: Optional[int] = Field(None, ge=2, description="Draft block size (default: the drafter's).")
    draft_len_schedule: Optional[dict[int, int]] = Field(
        None, description="Draft tokens by live rows, {rows from: tokens} (the recipe's; '1:7,8:3,16:0' in config.pbtxt)."
    )
    num_threads: int = Field(
        0,
        ge=0,
        description="torch CPU threads per model "
        "(0 = the cores not busy when it loads: available cores less the load average, at least 1).",
    )
    prefix_cache_mib: int = Field(
        DEFAULT_PREFIX_CACHE_MIB,
        ge=0,
        description="Prefix cache (MiB, on the model's device; 0 = off): prompts that start with a prefix seen before skip its prefill.",
    )
    prefix_cache_block: int = Field(
        64, ge=1, description="Prefix cache granularity: prompts are matched in whole blocks of this many tokens."
    )
    prefill_chunk: int = Field(
        DEFAULT_PREFILL_CHUNK,
        ge=0,
        description="Prompt tokens prefilled per decoding step, so long prompts join without stalling live streams (0 = whole prompts).",
    )
    prefill_share: float = Field(
        DEFAULT_PREFILL_SHARE,
        ge=0,
        description="While streams decode, prefills take about this share of the decoding time on average, in chunks of "
        "at most prefill_chunk tokens, shortest prompt first (0 = always prefill_chunk tokens, oldest first).",
    )
    adaptive_drafting: bool = Field(
        False,
        description="Skip the drafter in steps where its drafts have not been paying for themselves (measured per batch "
        "size; the skipped steps' context is read at its next pass; lossless). Off: every step drafts.",
    )
    async_scheduling: bool = Field(
        False,
        description="Launch each decoding step before reading the one before it, so a GPU computes while the host "
        "schedules and streams (a finishing request is decoded one step more and its tokens dropped; lossless). "
        "On a CPU it only costs that extra step.",
    )

    cuda_graphs: Optional[bool] = Field(
        None,
        description="torch backend: replay each decoding step's passes from CUDA graphs per batch bucket "
        "(default: wherever the runtime can, that is on a GPU; off on a CPU).",
    )
    attention_choice: Literal["dflash", "flash", "sdpa", "measure"] = Field(
        "dflash",
        description="torch backend on the dflash attention path (a GPU): the kernel of the target's attention in decode "
        "passes; each is checked against the reference when the model loads; 'measure' times the exact ones per batch "
        "bucket there and keeps the fastest.",
    )
    verify_choice: Literal["positions", "spread", "shortlist", "measure"] = Field(
        "positions",
        description="torch backend on a GPU: the kernels verifying steps with sampled rows: one program per position, "
        "every pass spread over the vocabulary, two reads of the logits for rows with top-k <= 64 (the same decisions "
        "either way), or 'measure' (the fastest per batch bucket, timed at load).",
    )
    linear_choice: Literal["torch", "skinny", "measure"] = Field(
        "torch",
        description="torch backend on a GPU: the kernels of the decode passes' projections: cuBLAS, the skinny kernels "
        "(few rows, the weight streamed once) where they cover a call, or 'measure' (the faster per row count and "
        "weight shape, timed at load).",
    )
    dependent_launch: bool = Field(
        False,
        description="torch backend on a Hopper or later GPU: launch a decoding step's Triton kernels (passes, verification, "
        "sampling) as programmatic dependent launches (each waits on the GPU for the kernel ahead; the same arithmetic).",
    )

    @field_validator("draft_len_schedule", mode="before")
    @classmethod
    def _parse_schedule(cls, value):
        """config.pbtxt parameters are strings: '1:7,8:3' -> {1: 7, 8: 3}."""
        if isinstance(value, str):
            try:
                return {int(k): int(v) for k, v in (item.split(":") for item in value.split(",") if item.strip())}
            except ValueError:
                raise ValueError(f"'{value}' is not a schedule like '1:7,8:3' (live rows from: draft tokens)") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> "ServingConfig":
        if self.backend == "trt" and not self.engines:
            raise ValueError("backend 'trt' needs 'engines' (a build directory)")
        if self.backend != "torch" and (
            self.cuda_graphs is not None
            or self.attention_choice != "dflash"
            or self.verify_choice != "positions"
            or self.linear_choice != "torch"
            or self.dependent_launch
        ):
            raise ValueError(
                "cuda_graphs, attention_choice, verify_choice, linear_choice and dependent_launch are options of the torch backend "
                "(engines carry their own)"
            )
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_tokens:
            raise ValueError(f"default_max_tokens {self.default_max_tokens} is above max_tokens {self.max_tokens}")
        return self

    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    def limits(self, max_context: int | None = None) -> ServingLimits:
        """This model's limits; `max_context`: what the opened pipeline holds, where it differs."""
        return serving_limits(max_context or self.max_context, self.max_tokens, self.default_max_tokens)

    def resolved(self, model_dir: Path) -> "ServingConfig":
        """Checkpoint paths that are relative are relative to the model's directory in the repository."""

        def resolve(value: str | None) -> str | None:
            if value is None or value == "demo" or Path(value).is_absolute():
                return value
            return str((model_dir / value).resolve())

        return self.model_copy(update={"target": resolve(self.target), "drafter": resolve(self.drafter), "engines": resolve(self.engines)})

    # ------------------------------------------------------------------ config.pbtxt parameters

    def to_parameters(self) -> dict[str, str]:
        """String key/values for config.pbtxt `parameters` (None values are left out)."""
        values = self.model_dump()
        if values["draft_len_schedule"] is not None:
            values["draft_len_schedule"] = ",".join(f"{k}:{v}" for k, v in sorted(values["draft_len_schedule"].items()))
        return {key: str(value) for key, value in values.items() if value is not None}

    @classmethod
    def from_parameters(cls, parameters: dict) -> "ServingConfig":
        """Parse Triton's `parameters` ({key: {"string_value": ...}} or plain strings)."""
        values = {}
        for key, value in parameters.items():
            values[key] = value.get("string_value") if isinstance(value, dict) else value
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
            raise DFlashError(
                f"invalid DFlash model parameters in config.pbtxt ({problems})",
                "fix the parameters or rewrite the repository with `dflash-trt repo`",
            ) from None


# ----------------------------------------------------------------------------- what a repository serves


class RecipeLimits(BaseModel):
    """A recipe's limits as its served models take them: the same values whether `repo` reads the
    recipe or a build recorded them in its artifact."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_batch: Optional[int] = None  # requests per decoding step (the recipe's triton.max_batch_size)
    max_input_len: Optional[int] = None
    max_seq_len: Optional[int] = None
    block_size: Optional[int] = None
    draft_len_schedule: Optional[dict[int, int]] = None

    @classmethod
    def of(cls, recipe: Any) -> "RecipeLimits":
        """The limits of a trtllm_dflash.recipes.Recipe (a layer above: read, never imported here)."""
        return cls(
            max_batch=recipe.triton.max_batch_size,
            max_input_len=recipe.limits.max_input_len,
            max_seq_len=recipe.limits.max_seq_len,
            block_size=recipe.drafter.block_size,
            draft_len_schedule=recipe.drafter.draft_len_schedule,
        )

    def parameters(self) -> dict[str, Any]:
        """ServingConfig values: the sequence holds the context, and what the input may not take is
        what a request may generate (TensorRT-LLM's limits)."""
        values: dict[str, Any] = {"max_batch": self.max_batch, "block_size": self.block_size, "draft_len_schedule": self.draft_len_schedule}
        if self.max_seq_len:
            values["max_context"] = self.max_seq_len
            if self.max_input_len:
                values["max_tokens"] = self.max_seq_len - self.max_input_len
        return {key: value for key, value in values.items() if value}


@dataclasses.dataclass(frozen=True)
class ServingSource:
    """What a repository's Python-backend models serve: checkpoints, or a build's engines, within a recipe's limits."""

    target: str
    drafter: Optional[str]
    engines: Optional[str] = None  # a build's engines folder: backend trt; None: the checkpoints on torch
    limits: RecipeLimits = RecipeLimits()

    @property
    def backend(self) -> ServedBackend:
        return "trt" if self.engines else "torch"


def serving_configs(
    source: ServingSource, name: str = "dflash", baseline: str | None = "ar", **flags: Any
) -> list[tuple[str, ServingConfig]]:
    """The models of a repository: DFlash under `name` and, with a drafter, the target alone under
    `baseline` ('' or None: none). `flags` (None: not given) override the recipe's limits; the one
    mapping of a source to ServingConfigs, for `repo` and the build alike."""
    options: dict[str, Any] = {"target": source.target, "drafter": source.drafter, "backend": source.backend, "engines": source.engines}
    options.update(source.limits.parameters())
    options.update({key: value for key, value in flags.items() if value is not None})  # flags override the recipe
    if options.get("max_context"):  # a request leaves room for its prompt: max_tokens (default or given) below the context
        asked = options.get("max_tokens") or ServingConfig.model_fields["max_tokens"].default
        options["max_tokens"] = serving_limits(options["max_context"], asked).max_new_tokens
    models = [(name, _config(options))]
    if source.drafter is not None and baseline:
        models.append((baseline, _config({**options, "drafter": None, "block_size": None, "draft_len_schedule": None})))
    return models


def _config(options: dict[str, Any]) -> ServingConfig:
    try:
        return ServingConfig(**options)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'options'}: {e['msg']}" for e in exc.errors())
        raise DFlashError(f"invalid serving options ({problems})", "fix the options") from None
