"""The `trtllm` backend's LLM-API options: what a `trtllm` recipe writes for TensorRT-LLM, checked key by key.

Options are checked against TensorRT-LLM's own argument classes, extracted from its llm_args.py at a
pinned release, v1.4.0rc1 (llm_args.json; llm_args_check.py); unknown keys, wrong types and values fail.
A drafter TensorRT-LLM refuses stops here in one line, and one it would run differently gets a note or
a config overlay (drafters.py says which, and why).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.backends.trtllm.drafters import (
    SLIDING,
    TWO_SIDED_BACKENDS,
    DrafterNote,
    drafter_support,
    local_drafter_overlay,
    runs_two_sided,
)
from trtllm_dflash.errors import DFlashError

# ---------------------------------------------------------------------- the checked LLM-API keys


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SpeculativeConfig(_Strict):
    """TensorRT-LLM DFlashDecodingConfig (1.3 release candidates and later)."""

    decoding_type: Literal["DFlash"]
    max_draft_len: int = Field(ge=1)
    speculative_model: str
    mask_token_id: Optional[int] = Field(None, ge=0)
    target_layer_ids: Optional[list[int]] = None
    max_concurrency: Optional[int] = Field(None, ge=1)
    draft_len_schedule: Optional[dict[int, int]] = None


class KvCacheConfig(_Strict):
    dtype: Literal["auto", "fp8"] = "auto"
    free_gpu_memory_fraction: Optional[float] = Field(None, gt=0, le=1)


class CudaGraphConfig(_Strict):
    enable_padding: bool = False
    max_batch_size: Optional[int] = Field(None, ge=1)


class MoeConfig(_Strict):
    backend: Literal["TRTLLM", "CUTLASS", "TRITON"]


class TritonConfig(_Strict):
    """The one key of model.yaml that is not an LLM-API option (read by the Triton model)."""

    max_batch_size: int = Field(ge=0)
    decoupled: bool


class LLMApiOptions(_Strict):
    """LLM-API options this toolkit writes; keys as PLATFORM.md lists them, plus `model` and
    `backend` (the Triton LLM-API model's own keys) and `enable_attention_dp` (the recipe schema's
    parallelism.attention_dp)."""

    model: Optional[str] = None
    backend: Optional[Literal["pytorch"]] = None
    tensor_parallel_size: int = Field(1, ge=1)
    moe_expert_parallel_size: Optional[int] = Field(None, ge=1)
    enable_attention_dp: Optional[bool] = None
    max_batch_size: Optional[int] = Field(None, ge=1)
    max_num_tokens: Optional[int] = Field(None, ge=1)
    max_seq_len: Optional[int] = Field(None, ge=2)
    kv_cache_config: Optional[KvCacheConfig] = None
    cuda_graph_config: Optional[CudaGraphConfig] = None
    moe_config: Optional[MoeConfig] = None
    speculative_config: Optional[SpeculativeConfig] = None


class TritonModelYaml(LLMApiOptions):
    """`1/model.yaml` of the Triton LLM-API model: LLM-API options + triton_config."""

    model: str
    backend: Literal["pytorch"]
    triton_config: TritonConfig


def validate_options(options: dict[str, Any], schema: type[BaseModel] = TritonModelYaml, source: str = "model.yaml") -> dict[str, Any]:
    """Check LLM-API options against TensorRT-LLM's own argument classes (the pinned llm_args extract).

    `triton_config` (required when `schema` is TritonModelYaml) is the Triton model's own key and is
    checked separately. DFlashError lists every bad key with its path.
    """
    from trtllm_dflash.backends.trtllm.llm_args_check import ROOT, check_class, pinned_source

    options = dict(options)
    problems = []
    triton = options.pop("triton_config", None)
    if schema is TritonModelYaml:
        for key in ("model", "backend"):
            if key not in options:
                problems.append(f"{key}: required in model.yaml")
        try:
            TritonConfig.model_validate(triton if triton is not None else {})
        except ValidationError as exc:
            problems += [f"triton_config.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    elif triton is not None:
        problems.append("triton_config: only model.yaml of the Triton model has it, not the trtllm-serve YAML")
    problems += check_class(options, ROOT)
    if problems:
        raise DFlashError(
            f"{source} is not a valid LLM-API configuration for TensorRT-LLM {pinned_source()}: {'; '.join(problems)}",
            "fix or remove those keys",
        ) from None
    return options


def check_installed_tensorrt_llm(options: dict[str, Any], source: str = "the LLM-API options") -> str:
    """Check options against the TensorRT-LLM installed here too, when there is one; says what checked them.

    The options were written against the pinned release; a node with another version gets one line
    naming each key that version does not know, before TensorRT-LLM starts.
    """
    from trtllm_dflash.backends.trtllm.llm_args_check import ROOT, check_class, installed_llm_args, pinned_source, source_name

    options = {k: v for k, v in options.items() if k != "triton_config"}
    installed = installed_llm_args()
    if installed is None:
        return f"the llm_args of TensorRT-LLM {pinned_source()} (tensorrt_llm is not installed here)"
    problems = check_class(options, ROOT, data=installed)
    if problems:
        raise DFlashError(
            f"{source} were checked against TensorRT-LLM {pinned_source()}, but the TensorRT-LLM installed here "
            f"({source_name(installed)}) refuses them: {'; '.join(problems)}",
            f"install tensorrt_llm {pinned_source().split()[0].lstrip('v')} (or a release that has these keys), or remove them",
        )
    return f"the llm_args of TensorRT-LLM {pinned_source()} and of the installed {source_name(installed)}"


def validate_model_yaml(path: str | Path) -> TritonModelYaml:
    """Validate a written model.yaml (or trtllm-serve YAML when it has no triton_config)."""
    path = Path(path)
    try:
        options = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DFlashError(f"cannot read {path} ({exc})", "point at a model.yaml written by `dflash-trt repo`") from None
    if not isinstance(options, dict):
        raise DFlashError(f"{path} is not a YAML mapping", "write LLM-API options as key: value pairs")
    schema = TritonModelYaml if "triton_config" in options else LLMApiOptions
    return validate_options(options, schema, str(path))


# ---------------------------------------------------------------------- the options of a recipe


def llm_api_options(
    recipe, drafter_dir: str | Path | None = None, overlay_at: str | Path | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The LLM-API options of a `trtllm` recipe, and notes for the user.

    With `drafter_dir` (a local copy of the drafter) the speculative model points there (or at
    `overlay_at`, where the caller writes write_drafter_overlay, when local_drafter_overlay says the
    drafter needs one) and the mask token id / tapped layers come from its config.json when the recipe
    does not pin them. A drafter the backend refuses (drafter_support) stops here in one line.
    """
    notes: list[str] = []
    speculative_model = None
    backend = recipe.trtllm.attention_backend if recipe.trtllm is not None else None
    drafter = None
    if drafter_dir is not None:
        from trtllm_dflash.checkpoints import resolve_checkpoint
        from trtllm_dflash.config import DrafterConfig

        path = resolve_checkpoint(drafter_dir, "drafter")
        drafter = DrafterConfig.from_dir(path)
        _check_drafter(drafter, backend, str(drafter_dir), notes)
        speculative_model = str(path.resolve())
        if local_drafter_overlay(path, backend) is not None:
            if overlay_at is not None:
                speculative_model = str(Path(overlay_at).resolve())
            notes.append(
                f"drafter config overlay ({overlay_at or 'written with the options'}): TensorRT-LLM reads the V2 sizes, "
                "is_causal and sliding windows from it, so it runs the drafter as published"
            )
    else:
        catalog = _catalog_drafter(recipe)
        if catalog is not None and (runs_two_sided(catalog) or SLIDING in tuple(catalog.layer_types)):
            _check_catalog_drafter(catalog, backend, recipe.drafter.checkpoint, notes)
    options = recipe.llm_api_options(speculative_model)
    spec = options["speculative_config"]
    if ((drafter is not None and runs_two_sided(drafter)) or _catalog_runs_two_sided(recipe)) and "attention_backend" not in spec:
        spec["attention_backend"] = "VANILLA"  # TRTLLM cannot run V2's non-causal windows: never leave it to a default
    if drafter_dir is not None:
        spec.setdefault("mask_token_id", drafter.mask_token_id)
        spec.setdefault("target_layer_ids", list(drafter.target_layer_ids))
    if "mask_token_id" not in spec:
        catalog_mask = _catalog_mask_token(recipe)
        if catalog_mask is not None:
            spec["mask_token_id"] = catalog_mask
        else:
            notes.append(
                f"speculative_config.mask_token_id is not pinned: neither the recipe nor the catalog knows the mask token of "
                f"{spec['speculative_model']}; pass --drafter DIR (a local copy) to write it from its config.json"
            )
    return options, notes


def _check_drafter(drafter, backend: str | None, name: str, notes: list[str]) -> None:
    support = drafter_support(drafter, backend)
    if isinstance(support, DrafterNote):
        notes.append(f"{name}: {support[0]}; {support[1]}")
    elif support is not None:
        raise DFlashError(f"{name}: {support[0]}", support[1])


def _check_catalog_drafter(catalog, backend: str | None, name: str, notes: list[str]) -> None:
    """A catalog drafter with sliding layers or V2 heads, before its config.json is here."""
    sliding = [i for i, t in enumerate(catalog.layer_types) if t == SLIDING]
    if (backend or "VANILLA") not in TWO_SIDED_BACKENDS:
        if runs_two_sided(catalog):
            raise DFlashError(
                f"{name} is a DFlash V2 drafter whose sliding layers attend non-causally, which TensorRT-LLM's "
                f"{backend} drafter attention refuses (NVIDIA/TensorRT-LLM PR #19159)",
                "set trtllm.attention_backend to VANILLA (or FA4 on Hopper)",
            )
        notes.append(
            f"{name}: with drafter attention {backend}, TensorRT-LLM runs sliding layers {sliding} causally "
            "(lower acceptance, output still exact); set trtllm.attention_backend to VANILLA (or FA4 on Hopper) "
            "to run them as published"
        )
    elif sliding and not runs_two_sided(catalog):
        notes.append(
            f"{name}: sliding layers {sliding} run as published through a drafter config overlay written with the "
            "options (TensorRT-LLM alone would run them causally); pass --drafter DIR to write it"
        )


def _catalog_drafter(recipe):
    """The catalog's shape of the recipe's drafter, when the catalog knows that checkpoint."""
    try:
        spec = recipe.model_spec()
    except DFlashError:
        return None
    drafter = getattr(spec, "drafter", None)
    return drafter if drafter is not None and drafter.checkpoint == recipe.drafter.checkpoint else None


def _catalog_mask_token(recipe) -> int | None:
    drafter = _catalog_drafter(recipe)
    return None if drafter is None else drafter.mask_token_id


def _catalog_runs_two_sided(recipe) -> bool:
    drafter = _catalog_drafter(recipe)
    return drafter is not None and runs_two_sided(drafter)


def model_yaml(model: str, options: dict[str, Any], decoupled: bool = True) -> dict[str, Any]:
    """model.yaml: the LLM-API options, the target, the PyTorch backend, and triton_config.

    triton_config.max_batch_size is 0: the LLM-API model takes one prompt per request and
    TensorRT-LLM batches in flight itself, up to the LLM-API max_batch_size of the recipe.
    """
    return {"model": model, "backend": "pytorch", **options, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}
