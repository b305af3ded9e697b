"""The `trtllm` backend's repository: TensorRT-LLM's LLM-API Triton model, configured for DFlash.

For recipes with `runtime: trtllm` (gpt-oss-120b on 8x B300 and friends) TensorRT-LLM's PyTorch
backend runs the target and its native DFlash drafter; this toolkit writes and checks the
configuration:

    REPO/tensorrt_llm/config.pbtxt   Python backend, decoupled, the LLM-API model's inputs/outputs
    REPO/tensorrt_llm/1/model.yaml   LLM-API options (speculative_config: DFlash, parallelism, KV
                                     cache, CUDA graphs, MoE backend) + triton_config
    REPO/tensorrt_llm/1/model.py     loads NVIDIA's LLM-API model.py (+ helpers.py) from the folder
                                     find_llmapi_model names (its code is not copied here)
    REPO/trtllm-serve.yaml           the same options for `trtllm-serve MODEL --config`

Options are checked against TensorRT-LLM's own argument classes, extracted from its llm_args.py at a
pinned release, v1.4.0rc1 (trtllm_llm_args.json; llm_args_check.py); unknown keys, wrong types and values fail.

Drafters, as TensorRT-LLM's DFlash mode runs them (read in NVIDIA/TensorRT-LLM, the newest versions the
search index holds; v1.4.0rc1 was cut from main on 2026-10-22, after PR #19159 merged on 2026-09-14):
- tensorrt_llm/_torch/models/modeling_dflash.py, the DFlash 2 version (DFlash2BlockConv,
  DFlash2CandidateSelector, _is_dflash2_architecture; the index gives no commit for it) and
  7c7504c08f1f (FA4): a checkpoint whose `architectures` has the "dflash2" stem, or whose dflash_config
  has conv_kernel_size / selector_rank, is a DFlash 2 drafter; it needs dflash_config.{conv_kernel_size,
  conv_group_size, selector_rank, selector_top_k} and honours the TOP-LEVEL `is_causal` (V2 only): false
  gives non-causal sliding layers with flash-attention window (W-1, W-1). V1 drafters ignore is_causal:
  a layer with a sliding window runs CAUSALLY, window (W-1, 0). dflash_config.use_swa / swa_window_size
  replaces the window with (W-1, W-1) on the sliding layers (all layers without layer_types) but leaves
  `causal` as it was.
- tests/unittest/_torch/speculative/hw_agnostic/test_dflash2_semantics.py @10e95278445b (PR #19159):
  the drafter attention backends VANILLA and FA4 run the released V2 drafter's non-causal 2048 window;
  TRTLLM refuses any non-causal finite window ("flashinfer's trtllm-gen context kernel refuses causal=False
  with any finite window_left").
- tensorrt_llm/_torch/pyexecutor/config_utils.py @2c36f34b5d18 (get_layer_attention_window): an explicit
  `use_sliding_window: false` turns the inferred window off.
So V2 drafters run here with drafter attention VANILLA (written explicitly) or FA4, never TRTLLM, and a
drafter whose reference semantics TensorRT-LLM would not reproduce from its own config.json gets a config
overlay (drafter_overlay: config.json patched, every other file linked) that makes it run them.

The LLM-API Triton model is NVIDIA's (TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm, at
the tag of the container's tensorrt_llm.__version__); its code is not copied: find_llmapi_model says
where it is looked for, and the written model.py loads it from there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.protocol import INPUTS
from trtllm_dflash.serving.repository import check_model_name, pbtxt_string, staged_directory, write_manifest
from trtllm_dflash.serving.trtllm_drafters import (
    SLIDING,
    TWO_SIDED_BACKENDS,
    DrafterNote,
    drafter_support,
    local_drafter_overlay,
    write_drafter_overlay,
)

MODEL_NAME = "tensorrt_llm"
# Where NVIDIA's LLM-API Triton model is looked for (find_llmapi_model), in this order: the folder given
# explicitly, $DFLASH_TRT_LLMAPI_MODEL, a TensorRT-LLM clone in the working directory (Triton's "Deploying
# an LLM with Triton and TRT-LLM" page clones it there), the path older tensorrtllm_backend images used.
LLMAPI_MODEL_ENV = "DFLASH_TRT_LLMAPI_MODEL"
LLMAPI_MODEL_SUBDIR = "triton_backend/all_models/llmapi/tensorrt_llm"
LLMAPI_MODEL_PLACES = ("TensorRT-LLM/" + LLMAPI_MODEL_SUBDIR, "/app/all_models/llmapi/tensorrt_llm")
LLMAPI_MODEL_FILES = ("config.pbtxt", "1/model.py", "1/model.yaml", "1/helpers.py")
TENSORRT_LLM_REPO = "https://github.com/NVIDIA/TensorRT-LLM.git"


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
    from trtllm_dflash.serving.llm_args_check import ROOT, check_class, pinned_source

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
        raise DFlashError(f"{source} is not a valid LLM-API configuration for TensorRT-LLM {pinned_source()}: "
                          f"{'; '.join(problems)}", "fix or remove those keys") from None
    return options


def check_installed_tensorrt_llm(options: dict[str, Any], source: str = "the LLM-API options") -> str:
    """Check options against the TensorRT-LLM installed here too, when there is one; says what checked them.

    The options were written against the pinned release; a node with another version gets one line
    naming each key that version does not know, before TensorRT-LLM starts.
    """
    from trtllm_dflash.serving.llm_args_check import ROOT, check_class, installed_llm_args, pinned_source, source_name

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


# ---------------------------------------------------------------------- writing the repository


# ---------------------------------------------------------------------- drafters: serving/trtllm_drafters.py

def llm_api_options(recipe, drafter_dir: str | Path | None = None, overlay_at: str | Path | None = None) -> tuple[dict[str, Any], list[str]]:
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
            notes.append(f"drafter config overlay ({overlay_at or 'written with the options'}): TensorRT-LLM reads the V2 sizes, "
                         "is_causal and sliding windows from it, so it runs the drafter as published")
    else:
        catalog = _catalog_drafter(recipe)
        if catalog is not None and (catalog.is_v2 or SLIDING in tuple(catalog.layer_types)):
            _check_catalog_drafter(catalog, backend, recipe.drafter.checkpoint, notes)
    options = recipe.llm_api_options(speculative_model)
    spec = options["speculative_config"]
    if ((drafter is not None and drafter.is_v2) or _catalog_drafter_is_v2(recipe)) and "attention_backend" not in spec:
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
        if catalog.is_v2:
            raise DFlashError(f"{name} is a DFlash V2 drafter whose sliding layers attend non-causally, which TensorRT-LLM's "
                              f"{backend} drafter attention refuses (NVIDIA/TensorRT-LLM PR #19159)",
                              "set trtllm.attention_backend to VANILLA (or FA4 on Hopper)")
        notes.append(f"{name}: with drafter attention {backend}, TensorRT-LLM runs sliding layers {sliding} causally "
                     "(lower acceptance, output still exact); set trtllm.attention_backend to VANILLA (or FA4 on Hopper) "
                     "to run them as published")
    elif sliding and not catalog.is_v2:
        notes.append(f"{name}: sliding layers {sliding} run as published through a drafter config overlay written with the "
                     "options (TensorRT-LLM alone would run them causally); pass --drafter DIR to write it")


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


def _catalog_drafter_is_v2(recipe) -> bool:
    drafter = _catalog_drafter(recipe)
    return drafter is not None and drafter.is_v2


def model_yaml(model: str, options: dict[str, Any], decoupled: bool = True) -> dict[str, Any]:
    """model.yaml: the LLM-API options, the target, the PyTorch backend, and triton_config.

    triton_config.max_batch_size is 0: the LLM-API model takes one prompt per request and
    TensorRT-LLM batches in flight itself, up to the LLM-API max_batch_size of the recipe.
    """
    return {"model": model, "backend": "pytorch", **options, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}


# NVIDIA's LLM-API model's own config.pbtxt, as read in NVIDIA/TensorRT-LLM
# triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt @0a71057313ec (the newest version the search
# index holds; the v1.4.0rc1 tag commit 0372799d itself is not in it) and @c8c6df08bd0e (the same inputs
# and outputs without image_url / LoRA). name -> (data_type, dims, optional).
LLMAPI_INPUTS: dict[str, tuple[str, str, bool]] = {
    "text_input": ("TYPE_STRING", "-1", False),
    "streaming": ("TYPE_BOOL", "1", True),
    "sampling_param_best_of": ("TYPE_INT32", "1", True),
    "sampling_param_temperature": ("TYPE_FP32", "1", True),
    "sampling_param_top_k": ("TYPE_INT32", "1", True),
    "sampling_param_top_p": ("TYPE_FP32", "1", True),
    "sampling_param_frequency_penalty": ("TYPE_FP32", "1", True),
    "sampling_param_presence_penalty": ("TYPE_FP32", "1", True),
    "sampling_param_max_tokens": ("TYPE_INT32", "1", True),
    "sampling_param_stop": ("TYPE_STRING", "-1", True),
    "sampling_param_seed": ("TYPE_UINT64", "1", True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", "1", True),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", "1", True),
    "return_finish_reason": ("TYPE_BOOL", "1", True),
    "return_stop_reason": ("TYPE_BOOL", "1", True),
    "return_cumulative_logprob": ("TYPE_BOOL", "1", True),
    "stop": ("TYPE_BOOL", "1", True),
}
LLMAPI_OUTPUTS: dict[str, tuple[str, str]] = {
    "text_output": ("TYPE_STRING", "-1"),
    "finish_reason": ("TYPE_STRING", "-1"),
    "stop_reason": ("TYPE_STRING", "-1"),
    "cumulative_logprob": ("TYPE_FP32", "-1"),
    "kv_cache_reused_block": ("TYPE_INT32", "-1"),
    "kv_cache_missed_block": ("TYPE_INT32", "-1"),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", "-1"),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", "-1"),
    "kv_cache_hit_rate": ("TYPE_FP32", "-1"),
    "arrival_time_ns": ("TYPE_INT64", "1"),
    "first_scheduled_time_ns": ("TYPE_INT64", "1"),
    "first_token_time_ns": ("TYPE_INT64", "1"),
    "last_token_time_ns": ("TYPE_INT64", "1"),
    "acceptance_rate": ("TYPE_FP32", "1"),
    "total_accepted_draft_tokens": ("TYPE_INT32", "1"),
    "total_draft_tokens": ("TYPE_INT32", "1"),
}
# Where ours differs, and why: our clients send these integers as INT64 (protocol.INPUTS) over gRPC, and
# the LLM-API model reads every sampling input with .item() (helpers.get_input_scalar_by_name), so a
# wider integer reaches SamplingParams unchanged.
WIDENED_INPUTS = {"sampling_param_max_tokens": "TYPE_INT64", "sampling_param_top_k": "TYPE_INT64",
                  "sampling_param_seed": "TYPE_INT64"}


def find_llmapi_model(explicit: str | Path | None = None) -> Path | None:
    """NVIDIA's LLM-API Triton model folder (config.pbtxt, 1/model.py, 1/helpers.py): `explicit`, then
    $DFLASH_TRT_LLMAPI_MODEL, then LLMAPI_MODEL_PLACES; None when none has it."""
    env = os.environ.get(LLMAPI_MODEL_ENV)
    candidates = [explicit] if explicit is not None else ([env] if env else list(LLMAPI_MODEL_PLACES))
    for candidate in candidates:
        folder = Path(candidate).expanduser()
        if folder.name == "1" or (folder / "model.py").is_file() and not (folder / "1").is_dir():
            folder = folder.parent  # the version folder or model.py's folder was given
        if all((folder / name).is_file() for name in ("1/model.py", "1/helpers.py")):
            return folder.resolve()
    return None


LLMAPI_MODEL_OPTION = "--llmapi-model"
LLMAPI_MODEL_NEEDS = ("1/model.py", "1/helpers.py")  # what the written model.py loads (model.py imports helpers)


def llmapi_model_refusal(looked: str | Path | None = None) -> tuple[str, str]:
    """(problem, fix) when NVIDIA's LLM-API model is not where it is looked for; `looked` is the folder given
    with --llmapi-model, whose missing files are named."""
    from trtllm_dflash.serving.llm_args_check import pinned_version

    tag = f"v{pinned_version() or '1.4.0rc1'}"
    clone = f"git clone -b {tag} {TENSORRT_LLM_REPO} (the tag of your container's tensorrt_llm.__version__)"
    if looked is not None:
        folder = Path(looked).expanduser()
        missing = [name for name in LLMAPI_MODEL_NEEDS if not (folder / name).is_file()]
        what = "does not exist" if not folder.is_dir() else f"lacks {' and '.join(missing)}"
        return (f"{LLMAPI_MODEL_OPTION} {looked} is not NVIDIA's LLM-API Triton model: it {what}",
                f"{clone} and pass {LLMAPI_MODEL_OPTION} TensorRT-LLM/{LLMAPI_MODEL_SUBDIR}")
    where = os.environ.get(LLMAPI_MODEL_ENV) or " or ".join(LLMAPI_MODEL_PLACES)
    return (f"NVIDIA's LLM-API Triton model (1/model.py + 1/helpers.py) is not in {where}",
            f"{clone} and pass {LLMAPI_MODEL_OPTION} $PWD/TensorRT-LLM/{LLMAPI_MODEL_SUBDIR} "
            f"(or set {LLMAPI_MODEL_ENV} to it)")


def require_llmapi_model(explicit: str | Path | None = None) -> Path:
    """find_llmapi_model, or one line naming what to clone and at which tag."""
    found = find_llmapi_model(explicit)
    if found is None:
        raise DFlashError(*llmapi_model_refusal(explicit))
    return found


def use_llmapi_model(explicit: str | Path) -> Path:
    """`--llmapi-model DIR` for code paths that cannot carry it (the build pipeline, `repo --build`): checked
    now (one line naming what to clone), then exported as $DFLASH_TRT_LLMAPI_MODEL for this process, where
    find_llmapi_model looks next."""
    found = require_llmapi_model(explicit)
    os.environ[LLMAPI_MODEL_ENV] = str(found)
    return found


def render_config(name: str, decoupled: bool) -> str:
    """config.pbtxt: the LLM-API model's own inputs and outputs (LLMAPI_INPUTS / LLMAPI_OUTPUTS, with
    WIDENED_INPUTS), so its clients, ours (HTTP and gRPC) and the OpenAI front end all reach it."""
    inputs = ",\n".join(
        f"  {{ name: {pbtxt_string(n)} data_type: {WIDENED_INPUTS.get(n, dtype)} dims: [ {dims} ]{' optional: true' if optional else ''} }}"
        for n, (dtype, dims, optional) in LLMAPI_INPUTS.items()
    )
    outputs = ",\n".join(f"  {{ name: {pbtxt_string(n)} data_type: {dtype} dims: [ {dims} ] }}" for n, (dtype, dims) in LLMAPI_OUTPUTS.items())
    return (
        f"name: {pbtxt_string(name)}\nbackend: \"python\"\nmax_batch_size: 0\n"
        f"model_transaction_policy {{ decoupled: {'true' if decoupled else 'false'} }}\n\n"
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]  # TensorRT-LLM places the model on the GPUs itself\n"
    )


MODEL_PY = f'''"""TensorRT-LLM LLM-API Triton model (written by `dflash-trt repo`).

Runs NVIDIA's LLM-API model.py (TensorRT-LLM's {LLMAPI_MODEL_SUBDIR}, at the tag of this container's
tensorrt_llm.__version__; the options were checked against 1.4.0rc1) with the model.yaml next to this file.
The folder comes from ${LLMAPI_MODEL_ENV}, else from llmapi_model.txt written beside this file.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_FOLDER = os.environ.get("{LLMAPI_MODEL_ENV}")
if not _FOLDER and os.path.isfile(os.path.join(_HERE, "llmapi_model.txt")):
    with open(os.path.join(_HERE, "llmapi_model.txt")) as _recorded:
        _FOLDER = _recorded.read().strip()
_SOURCE = os.path.join(_FOLDER or "", "1", "model.py")
if not _FOLDER or not os.path.isfile(_SOURCE) or not os.path.isfile(os.path.join(_FOLDER, "1", "helpers.py")):
    raise ImportError(
        f"NVIDIA's LLM-API Triton model (1/model.py + 1/helpers.py) is not in {{_FOLDER or 'any folder'}}: "
        "git clone -b v<tensorrt_llm.__version__ of this container> {TENSORRT_LLM_REPO}, mount it and set "
        "{LLMAPI_MODEL_ENV}=<clone>/{LLMAPI_MODEL_SUBDIR}"
    )
# model.yaml was checked against the TensorRT-LLM release its header names; where trtllm-dflash is
# installed beside TensorRT-LLM, a key this container's version does not know stops here, in one line
try:
    from trtllm_dflash.serving.trtllm import check_installed_tensorrt_llm
except ImportError:
    check_installed_tensorrt_llm = None
if check_installed_tensorrt_llm is not None:
    import yaml

    with open(os.path.join(_HERE, "model.yaml")) as _options:
        check_installed_tensorrt_llm(yaml.safe_load(_options), "model.yaml")
sys.path.insert(0, os.path.dirname(_SOURCE))  # its model.py imports helpers from its own folder
_spec = importlib.util.spec_from_file_location("trtllm_llmapi_model", _SOURCE)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TritonPythonModel = _module.TritonPythonModel
'''


def write_trtllm_repository(
    out: str | Path, recipe, drafter_dir: str | Path | None = None, name: str = MODEL_NAME, force: bool = False,
    llmapi_model: str | Path | None = None,
) -> tuple[Path, list[str]]:
    """Write the LLM-API repository of a `trtllm` recipe; returns (repository, notes). `llmapi_model`: NVIDIA's
    LLM-API model folder (--llmapi-model), refused in one line when it is not one."""
    if llmapi_model is not None:
        require_llmapi_model(llmapi_model)  # before anything is written
    if recipe.trtllm is None:  # only a trtllm recipe has TensorRT-LLM options
        raise DFlashError(f"recipe {recipe.name} has backend {recipe.runtime}, not trtllm", "use `dflash-trt repo` without a trtllm recipe")
    overlay_at = Path(out).expanduser().resolve() / "drafter"
    options, notes = llm_api_options(recipe, drafter_dir, overlay_at)
    overlay = local_drafter_overlay(drafter_dir, recipe.trtllm.attention_backend) if drafter_dir is not None else None
    extra = (lambda staging: write_drafter_overlay(drafter_dir, staging / "drafter", overlay)) if overlay is not None else None
    path = write_llm_api_repository(out, options, recipe.model.checkpoint, bool(recipe.triton.decoupled), recipe.name, notes, name,
                                    force, extra=extra, llmapi_model=llmapi_model)
    return path, notes


def write_build_llm_api_repository(build_dir: Path, manifest: dict, out: str | Path, force: bool = False,
                                   llmapi_model: str | Path | None = None) -> Path:
    """The LLM-API repository of a `trtllm` build, from the options its trtllm stage checked."""
    stage = (manifest.get("stages") or {}).get("trtllm") or {}
    try:
        options_file = build_dir / stage.get("dir", "trtllm") / stage["summary"]["file"]
        target = manifest["stages"]["checkpoints"]["summary"]["target"]["path"]
        options = yaml.safe_load(options_file.read_text())
    except (KeyError, TypeError, OSError, yaml.YAMLError) as exc:
        raise DFlashError(f"the build in {build_dir} has no usable trtllm stage ({exc})", "re-run `dflash-trt build` for it") from None
    return write_llm_api_repository(out, options, target, True, str(build_dir), [], MODEL_NAME, force, llmapi_model=llmapi_model)


def write_llm_api_repository(
    out: str | Path, options: dict, model: str, decoupled: bool, title: str, notes: list[str], name: str = MODEL_NAME, force: bool = False,
    extra=None, llmapi_model: str | Path | None = None,
) -> Path:
    """tensorrt_llm/{config.pbtxt, 1/model.yaml, 1/model.py} and trtllm-serve.yaml, both checked; `extra(staging)`
    writes more (the drafter overlay). NVIDIA's LLM-API model folder, where find_llmapi_model finds it here, is
    recorded in 1/llmapi_model.txt (the start command mounts it); where not, the notes say what to clone."""
    check_model_name(name)
    model_options = model_yaml(model, options, decoupled)
    validate_options(model_options, TritonModelYaml, f"model.yaml of {title}")
    serve_options = dict(options)
    validate_options(serve_options, LLMApiOptions, f"trtllm-serve YAML of {title}")
    command = f"trtllm-serve {model} --backend pytorch --config trtllm-serve.yaml"
    with staged_directory(out, force) as staging:
        model_dir = staging / name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(render_config(name, decoupled))
        (model_dir / "1" / "model.yaml").write_text(_yaml(model_options, f"{title}: TensorRT-LLM LLM-API options (DFlash) + triton_config"))
        (model_dir / "1" / "model.py").write_text(MODEL_PY)
        found = require_llmapi_model(llmapi_model) if llmapi_model is not None else find_llmapi_model()
        if found is not None:
            (model_dir / "1" / "llmapi_model.txt").write_text(f"{found}\n")
        else:
            notes.append("{}; to start it: {}".format(*llmapi_model_refusal()))  # the caller prints its notes
        if extra is not None:
            extra(staging)
        (staging / "trtllm-serve.yaml").write_text(_yaml(serve_options, f"{title}: `{command}`"))
        write_manifest(staging, {name: {"runtime": "trtllm", "source": title}}, {"source": title, "trtllm_serve": command, "notes": notes})
    return Path(out).expanduser().resolve()


def _yaml(options: dict[str, Any], title: str) -> str:
    from trtllm_dflash.serving.llm_args_check import pinned_source

    return f"# {title}\n# Written by dflash-trt; every key checked against TensorRT-LLM {pinned_source()}.\n" + yaml.safe_dump(
        options, sort_keys=False, default_flow_style=None
    )
