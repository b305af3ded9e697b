"""The `trtllm` backend's repository: TensorRT-LLM's LLM-API Triton model, configured for DFlash.

For recipes with `backend: trtllm` (gpt-oss-120b on 8x B300 and friends) TensorRT-LLM's PyTorch
backend runs the target and its native DFlash drafter; this toolkit writes and checks the
configuration:

    REPO/tensorrt_llm/config.pbtxt   Python backend, decoupled, the LLM-API model's inputs/outputs
    REPO/tensorrt_llm/1/model.yaml   LLM-API options (speculative_config: DFlash, parallelism, KV
                                     cache, CUDA graphs, MoE backend) + triton_config
    REPO/tensorrt_llm/1/model.py     loads NVIDIA's LLM-API model.py (+ helpers.py) from the folder
                                     find_llmapi_model names (its code is not copied here)
    REPO/trtllm-serve.yaml           the same options for `trtllm-serve MODEL --config`

The LLM-API Triton model is NVIDIA's (TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm, at
the tag of the container's tensorrt_llm.__version__); its code is not copied: find_llmapi_model says
where it is looked for, and the written model.py loads it from there.
The options it writes are made and checked in options.py, the drafter overlay in drafters.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtllm_dflash.backends.trtllm.drafters import local_drafter_overlay, write_drafter_overlay
from trtllm_dflash.backends.trtllm.options import LLMApiOptions, TritonModelYaml, llm_api_options, model_yaml, validate_options
from trtllm_dflash.errors import DFlashError
from trtllm_dflash.served_model.repository import check_model_name, pbtxt_string, staged_directory, write_manifest

if TYPE_CHECKING:
    from trtllm_dflash.backends.artifact import BuildArtifact

MODEL_NAME = "tensorrt_llm"
# Where NVIDIA's LLM-API Triton model is looked for (find_llmapi_model), in this order: the folder given
# explicitly, $DFLASH_TRT_LLMAPI_MODEL, a TensorRT-LLM clone in the working directory (Triton's "Deploying
# an LLM with Triton and TRT-LLM" page clones it there), the path older tensorrtllm_backend images used.
LLMAPI_MODEL_ENV = "DFLASH_TRT_LLMAPI_MODEL"
LLMAPI_MODEL_SUBDIR = "triton_backend/all_models/llmapi/tensorrt_llm"
LLMAPI_MODEL_PLACES = ("TensorRT-LLM/" + LLMAPI_MODEL_SUBDIR, "/app/all_models/llmapi/tensorrt_llm")
LLMAPI_MODEL_FILES = ("config.pbtxt", "1/model.py", "1/model.yaml", "1/helpers.py")
TENSORRT_LLM_REPO = "https://github.com/NVIDIA/TensorRT-LLM.git"


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
WIDENED_INPUTS = {"sampling_param_max_tokens": "TYPE_INT64", "sampling_param_top_k": "TYPE_INT64", "sampling_param_seed": "TYPE_INT64"}


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
    from trtllm_dflash.backends.trtllm.llm_args_check import pinned_version

    tag = f"v{pinned_version() or '1.4.0rc1'}"
    clone = f"git clone -b {tag} {TENSORRT_LLM_REPO} (the tag of your container's tensorrt_llm.__version__)"
    if looked is not None:
        folder = Path(looked).expanduser()
        missing = [name for name in LLMAPI_MODEL_NEEDS if not (folder / name).is_file()]
        what = "does not exist" if not folder.is_dir() else f"lacks {' and '.join(missing)}"
        return (
            f"{LLMAPI_MODEL_OPTION} {looked} is not NVIDIA's LLM-API Triton model: it {what}",
            f"{clone} and pass {LLMAPI_MODEL_OPTION} TensorRT-LLM/{LLMAPI_MODEL_SUBDIR}",
        )
    where = os.environ.get(LLMAPI_MODEL_ENV) or " or ".join(LLMAPI_MODEL_PLACES)
    return (
        f"NVIDIA's LLM-API Triton model (1/model.py + 1/helpers.py) is not in {where}",
        f"{clone} and pass {LLMAPI_MODEL_OPTION} $PWD/TensorRT-LLM/{LLMAPI_MODEL_SUBDIR} (or set {LLMAPI_MODEL_ENV} to it)",
    )


def require_llmapi_model(explicit: str | Path | None = None) -> Path:
    """find_llmapi_model, or one line naming what to clone and at which tag."""
    found = find_llmapi_model(explicit)
    if found is None:
        raise DFlashError(*llmapi_model_refusal(explicit))
    return found


def render_config(name: str, decoupled: bool) -> str:
    """config.pbtxt: the LLM-API model's own inputs and outputs (LLMAPI_INPUTS / LLMAPI_OUTPUTS, with
    WIDENED_INPUTS), so its clients, ours (HTTP and gRPC) and the OpenAI front end all reach it."""
    inputs = ",\n".join(
        f"  {{ name: {pbtxt_string(n)} data_type: {WIDENED_INPUTS.get(n, dtype)} dims: [ {dims} ]{' optional: true' if optional else ''} }}"
        for n, (dtype, dims, optional) in LLMAPI_INPUTS.items()
    )
    outputs = ",\n".join(
        f"  {{ name: {pbtxt_string(n)} data_type: {dtype} dims: [ {dims} ] }}" for n, (dtype, dims) in LLMAPI_OUTPUTS.items()
    )
    return (
        f'name: {pbtxt_string(name)}\nbackend: "python"\nmax_batch_size: 0\n'
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
    from trtllm_dflash.backends.trtllm.options import check_installed_tensorrt_llm
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
    out: str | Path,
    recipe,
    drafter_dir: str | Path | None = None,
    name: str = MODEL_NAME,
    force: bool = False,
    llmapi_model: str | Path | None = None,
) -> tuple[Path, list[str]]:
    """Write the LLM-API repository of a `trtllm` recipe; returns (repository, notes). `llmapi_model`: NVIDIA's
    LLM-API model folder (--llmapi-model), refused in one line when it is not one."""
    if llmapi_model is not None:
        require_llmapi_model(llmapi_model)  # before anything is written
    if recipe.trtllm is None:  # only a trtllm recipe has TensorRT-LLM options
        raise DFlashError(f"recipe {recipe.name} has backend {recipe.backend}, not trtllm", "use `dflash-trt repo` without a trtllm recipe")
    overlay_at = Path(out).expanduser().resolve() / "drafter"
    options, notes = llm_api_options(recipe, drafter_dir, overlay_at)
    overlay = local_drafter_overlay(drafter_dir, recipe.trtllm.attention_backend) if drafter_dir is not None else None
    extra = (lambda staging: write_drafter_overlay(drafter_dir, staging / "drafter", overlay)) if overlay is not None else None
    path = write_llm_api_repository(
        out,
        options,
        recipe.model.checkpoint,
        bool(recipe.triton.decoupled),
        recipe.name,
        notes,
        name,
        force,
        extra=extra,
        llmapi_model=llmapi_model,
    )
    return path, notes


def write_build_llm_api_repository(artifact: BuildArtifact, out: str | Path, force: bool = False) -> Path:
    """The LLM-API repository of a `trtllm` build, from the options its trtllm stage checked, for the
    checkpoint it deploys (the quantized one when the quantize stage wrote one)."""
    if artifact.trtllm_options is None:
        raise DFlashError(f"the build in {artifact.build_dir} has no trtllm stage", "re-run `dflash-trt build` for it")
    options_file = artifact.path(artifact.trtllm_options)
    try:
        options = yaml.safe_load(options_file.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DFlashError(
            f"the build in {artifact.build_dir} has no usable trtllm stage ({exc})", "re-run `dflash-trt build` for it"
        ) from None
    return write_llm_api_repository(
        out,
        options,
        artifact.deployed_target,
        artifact.decoupled,
        artifact.build_dir,
        [],
        MODEL_NAME,
        force,
        llmapi_model=artifact.llmapi_model,
    )


def write_llm_api_repository(
    out: str | Path,
    options: dict,
    model: str,
    decoupled: bool,
    title: str,
    notes: list[str],
    name: str = MODEL_NAME,
    force: bool = False,
    extra=None,
    llmapi_model: str | Path | None = None,
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
        write_manifest(staging, {name: {"backend": "trtllm", "source": title}}, {"source": title, "trtllm_serve": command, "notes": notes})
    return Path(out).expanduser().resolve()


def _yaml(options: dict[str, Any], title: str) -> str:
    from trtllm_dflash.backends.trtllm.llm_args_check import pinned_source

    return f"# {title}\n# Written by dflash-trt; every key checked against TensorRT-LLM {pinned_source()}.\n" + yaml.safe_dump(
        options, sort_keys=False, default_flow_style=None
    )
