"""The `trtllm` backend's repository: TensorRT-LLM's LLM-API Triton model, configured for DFlash.

For recipes with `runtime: trtllm` (gpt-oss-120b on 8x B300 and friends) TensorRT-LLM's PyTorch
backend runs the target and its native DFlash drafter; this toolkit writes and checks the
configuration:

    REPO/tensorrt_llm/config.pbtxt   Python backend, decoupled, the LLM-API model's inputs/outputs
    REPO/tensorrt_llm/1/model.yaml   LLM-API options (speculative_config: DFlash, parallelism, KV
                                     cache, CUDA graphs, MoE backend) + triton_config
    REPO/tensorrt_llm/1/model.py     loads the LLM-API model.py of NVIDIA's Triton TensorRT-LLM
                                     container (its code is not copied here)
    REPO/trtllm-serve.yaml           the same options for `trtllm-serve MODEL --config`

Options are checked against TensorRT-LLM's own argument classes, extracted from its llm_args.py at a
pinned release, v1.4.0rc1 (trtllm_llm_args.json; llm_args_check.py); unknown keys, wrong types and values fail.

DFlash V2 drafters (DFlash2DraftModel) are refused. TensorRT-LLM's DFlash mode, as read in
tensorrt_llm/_torch/models/modeling_dflash.py at commit 009d8fa431bd3de92245aab80f8b57dc70da1ac4
(the newest stored version; no release tag resolvable offline), builds every drafter but Laguna's as
a plain DFlash stack from its model_type and loads the weights with allow_partial_loading: the V2
convolutions and candidate selector would be dropped without an error. Its DFlashDecodingConfig has
no DFlash2 option and nothing there detects V2 from the checkpoint (its DFlash2 tests, PR #19159,
are not in a release we can read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.protocol import INPUTS
from trtllm_dflash.serving.repository import check_model_name, pbtxt_string, staged_directory, write_manifest

MODEL_NAME = "tensorrt_llm"
CONTAINER_MODEL = "/app/all_models/llmapi/tensorrt_llm/1/model.py"


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


def v2_refusal(drafter: str) -> tuple[str, str]:
    """(problem, fix) of a DFlash V2 drafter on this backend (see the module docstring)."""
    return (f"{drafter} is a DFlash V2 drafter (DFlash2DraftModel), which TensorRT-LLM's DFlash mode does not run "
            "(it would load it without its convolutions and candidate selector)",
            "use --backend torch (or trt), which decode DFlash V2 drafters")


def _refuse_v2(drafter: str) -> None:
    raise DFlashError(*v2_refusal(drafter))


def llm_api_options(recipe, drafter_dir: str | Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """The LLM-API options of a `trtllm` recipe, and notes for the user.

    With `drafter_dir` (a local copy of the drafter) the speculative model points there and the
    mask token id / tapped layers come from its config.json when the recipe does not pin them.
    """
    notes: list[str] = []
    speculative_model = None
    if drafter_dir is not None:
        from trtllm_dflash.checkpoints import resolve_checkpoint
        from trtllm_dflash.config import DrafterConfig

        path = resolve_checkpoint(drafter_dir, "drafter")
        drafter = DrafterConfig.from_dir(path)
        if drafter.is_v2:
            _refuse_v2(str(drafter_dir))
        speculative_model = str(path.resolve())
    if drafter_dir is None and _catalog_drafter_is_v2(recipe):
        _refuse_v2(recipe.drafter.checkpoint)
    options = recipe.llm_api_options(speculative_model)
    spec = options["speculative_config"]
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


def render_config(name: str, decoupled: bool) -> str:
    """config.pbtxt of the LLM-API Python model (inputs as the LLM-API model reads them)."""
    inputs = ",\n".join(
        f"  {{ name: {pbtxt_string(n)} data_type: {dtype} dims: [ {'-1' if n == 'sampling_param_stop' else '1'} ]"
        f"{' optional: true' if optional else ''} }}"
        for n, (dtype, _, optional) in INPUTS.items()
    )
    outputs = ",\n".join(
        f"  {{ name: {pbtxt_string(n)} data_type: {dtype} dims: [ 1 ] }}"
        for n, dtype in (("text_output", "TYPE_STRING"), ("finish_reason", "TYPE_STRING"), ("stop_reason", "TYPE_STRING"),
                         ("cumulative_logprob", "TYPE_STRING"), ("acceptance_rate", "TYPE_STRING"),
                         ("total_accepted_draft_tokens", "TYPE_STRING"), ("total_draft_tokens", "TYPE_STRING"))
    )
    return (
        f"name: {pbtxt_string(name)}\nbackend: \"python\"\nmax_batch_size: 0\n"
        f"model_transaction_policy {{ decoupled: {'true' if decoupled else 'false'} }}\n\n"
        f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n\n"
        "instance_group [ { count: 1 kind: KIND_CPU } ]  # TensorRT-LLM places the model on the GPUs itself\n"
    )


MODEL_PY = f'''"""TensorRT-LLM LLM-API Triton model (written by `dflash-trt repo`).

Runs the LLM-API model.py of NVIDIA's Triton TensorRT-LLM container
(nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3, TensorRT-LLM 1.4.0rc1 or later: the options were checked against it)
with the model.yaml next to this file. Set TRTLLM_LLMAPI_MODEL to use another copy of it.
"""

import importlib.util
import os
import sys

_SOURCE = os.environ.get("TRTLLM_LLMAPI_MODEL", "{CONTAINER_MODEL}")
if not os.path.isfile(_SOURCE):
    raise ImportError(
        f"{{_SOURCE}} not found: serve this repository in NVIDIA's Triton TensorRT-LLM container, "
        "or set TRTLLM_LLMAPI_MODEL to the LLM-API model.py of tensorrtllm_backend (all_models/llmapi)"
    )
# model.yaml was checked against the TensorRT-LLM release its header names; where trtllm-dflash is
# installed beside TensorRT-LLM, a key this container's version does not know stops here, in one line
try:
    from trtllm_dflash.serving.trtllm import check_installed_tensorrt_llm
except ImportError:
    check_installed_tensorrt_llm = None
if check_installed_tensorrt_llm is not None:
    import yaml

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.yaml")) as _options:
        check_installed_tensorrt_llm(yaml.safe_load(_options), "model.yaml")
sys.path.insert(0, os.path.dirname(_SOURCE))
_spec = importlib.util.spec_from_file_location("trtllm_llmapi_model", _SOURCE)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TritonPythonModel = _module.TritonPythonModel
'''


def write_trtllm_repository(
    out: str | Path, recipe, drafter_dir: str | Path | None = None, name: str = MODEL_NAME, force: bool = False
) -> tuple[Path, list[str]]:
    """Write the LLM-API repository of a `trtllm` recipe; returns (repository, notes)."""
    if recipe.trtllm is None:  # only a trtllm recipe has TensorRT-LLM options
        raise DFlashError(f"recipe {recipe.name} has backend {recipe.runtime}, not trtllm", "use `dflash-trt repo` without a trtllm recipe")
    options, notes = llm_api_options(recipe, drafter_dir)
    path = write_llm_api_repository(out, options, recipe.model.checkpoint, bool(recipe.triton.decoupled), recipe.name, notes, name, force)
    return path, notes


def write_build_llm_api_repository(build_dir: Path, manifest: dict, out: str | Path, force: bool = False) -> Path:
    """The LLM-API repository of a `trtllm` build, from the options its trtllm stage checked."""
    stage = (manifest.get("stages") or {}).get("trtllm") or {}
    try:
        options_file = build_dir / stage.get("dir", "trtllm") / stage["summary"]["file"]
        target = manifest["stages"]["checkpoints"]["summary"]["target"]["path"]
        options = yaml.safe_load(options_file.read_text())
    except (KeyError, TypeError, OSError, yaml.YAMLError) as exc:
        raise DFlashError(f"the build in {build_dir} has no usable trtllm stage ({exc})", "re-run `dflash-trt build` for it") from None
    return write_llm_api_repository(out, options, target, True, str(build_dir), [], MODEL_NAME, force)


def write_llm_api_repository(
    out: str | Path, options: dict, model: str, decoupled: bool, title: str, notes: list[str], name: str = MODEL_NAME, force: bool = False
) -> Path:
    """tensorrt_llm/{config.pbtxt, 1/model.yaml, 1/model.py} and trtllm-serve.yaml, both checked."""
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
        (staging / "trtllm-serve.yaml").write_text(_yaml(serve_options, f"{title}: `{command}`"))
        write_manifest(staging, {name: {"runtime": "trtllm", "source": title}}, {"source": title, "trtllm_serve": command, "notes": notes})
    return Path(out).expanduser().resolve()


def _yaml(options: dict[str, Any], title: str) -> str:
    from trtllm_dflash.serving.llm_args_check import pinned_source

    return f"# {title}\n# Written by dflash-trt; every key checked against TensorRT-LLM {pinned_source()}.\n" + yaml.safe_dump(
        options, sort_keys=False, default_flow_style=None
    )
