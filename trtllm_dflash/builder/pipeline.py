"""The stages of `dflash-trt build`, in order, and the top-level manifest.json they produce.

    checkpoints  validate the target/drafter pair, check and hash every weight file
    quantize     ModelOpt FP8 / NVFP4 of the target (nothing to do for BF16/FP16)
    export       ONNX graphs of the target and the drafter (plain-op and plugin variants)
    validate     the graphs on CPU against the torch runtime (numerics + a greedy decode)
    engines      TensorRT / TensorRT-RTX engines from the graphs
    trtllm       (runtime `trtllm` instead of export/validate/engines) TensorRT-LLM's options
    repository   the Triton model repository (written by the serving part of the toolkit)

A stage that cannot run on this machine (no GPU, no TensorRT) stops the build after the stages
that could run; everything finished stays valid, and the same command on a GPU machine resumes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

from trtllm_dflash.builder import manifest as mf
from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.builder.stages import BuildResult, Reporter, Stage, StageBlocked, StageContext, StageRunner
from trtllm_dflash.errors import CheckpointError, DFlashError

EXPORT_FORMAT = 1  # bump when the graph layout changes, so old export stages are rebuilt
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "chat_template.jinja", "generation_config.json", "config.json",
)
# Above this many parameters the CPU check of the graphs is skipped (recorded, not hidden): the
# float32 reference and the graph together would need several times the weights in RAM.
CPU_VALIDATION_MAX_PARAMS = 3e9


# ----------------------------------------------------------------------------- checkpoints


def resolve_checkpoint_dir(name: str, role: str) -> Path:
    """A local directory for a checkpoint: a path, `demo`, or a Hugging Face id (cache or download)."""
    from trtllm_dflash.checkpoints import resolve_checkpoint

    if name == "demo" or Path(name).expanduser().exists():
        return resolve_checkpoint(name, role)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        snapshot_download = None
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    if snapshot_download is not None:
        try:
            return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
        except Exception:  # noqa: BLE001 - not cached
            pass
        if os.environ.get("HF_HUB_OFFLINE") != "1":
            try:
                return Path(snapshot_download(name, allow_patterns=patterns))
            except Exception as exc:  # noqa: BLE001 - network, auth, unknown repo
                raise CheckpointError(f"cannot download {role} {name} ({str(exc).splitlines()[0]})", f"download it yourself (`hf download {name} --local-dir DIR`) and pass the directory") from None
    raise CheckpointError(
        f"{role} {name} is not a local directory and is not in the Hugging Face cache (offline)",
        f"run `hf download {name} --local-dir DIR` and pass the directory",
    )


def listing(path: Path) -> list[list[Any]]:
    """Cheap fingerprint of a checkpoint directory: (name, size, mtime) of every file."""
    return sorted([str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns] for p in path.rglob("*") if p.is_file() and ".cache" not in p.parts)


def _target_config(path: Path) -> Any:
    from types import SimpleNamespace

    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"target {path} has no readable config.json", "point --model at a Hugging Face model directory") from None
    raw = raw.get("text_config", raw)
    return SimpleNamespace(**raw)


def run_checkpoints(ctx: StageContext, target_dir: Path, drafter_dir: Path) -> dict[str, Any]:
    from trtllm_dflash.checkpoints import _check_safetensors_headers, _require_safetensors, validate_pair
    from trtllm_dflash.config import DrafterConfig

    drafter_config = DrafterConfig.from_dir(drafter_dir)
    validate_pair(_target_config(target_dir), drafter_config)
    cache = mf.HashCache(ctx.out / ".cache" / "hashes.json")
    summary: dict[str, Any] = {}
    for role, path in (("target", target_dir), ("drafter", drafter_dir)):
        files = _require_safetensors(path, role)
        _check_safetensors_headers(files)
        digests = {}
        for file in sorted(p for p in path.iterdir() if p.is_file()):
            ctx.status(f"hashing {role} {file.name}")
            digests[file.name] = cache.digest(file)
        summary[role] = {"path": str(path), "sha256": digests}
    cache.save()
    summary["drafter"]["block_size"] = drafter_config.block_size
    summary["drafter"]["mask_token_id"] = drafter_config.mask_token_id
    summary["drafter"]["target_layer_ids"] = list(drafter_config.target_layer_ids)
    (ctx.workdir / "checkpoints.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


# ----------------------------------------------------------------------------- quantize / export / validate


def _target_source(ctx: StageContext) -> Path:
    """The quantized checkpoint when the quantize stage produced one, else the original target."""
    quantized = ctx.upstream["quantize"]["summary"].get("target_dir")
    if quantized:
        return ctx.upstream_dir("quantize") / quantized
    return Path(ctx.upstream["checkpoints"]["summary"]["target"]["path"])


def run_quantize(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    if spec.quant in ("fp32", "bf16", "fp16"):
        return {"quant": spec.quant, "note": f"no quantization; weights are cast to {spec.quant} at export"}
    if spec.quant == "mxfp4":
        return {"quant": "mxfp4", "note": "the published MXFP4 expert weights are used as they are (TensorRT-LLM runs them natively)"}
    from trtllm_dflash.builder.quantize import quantize_target

    target = Path(ctx.upstream["checkpoints"]["summary"]["target"]["path"])
    summary = quantize_target(target, ctx.workdir / "target", spec.quant, spec.kv_cache_dtype, spec.calibration, ctx.status)
    return {**summary, "target_dir": "target"}


def bounds_of(spec: BuildSpec, block_size: int):
    from trtllm_dflash.builder.export import Bounds

    return Bounds(spec.max_batch, spec.max_input_len, spec.max_seq_len, block_size)


def run_export(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    import torch

    from trtllm_dflash.builder import plugin_graphs
    from trtllm_dflash.builder.export import DTYPES, export_pair
    from trtllm_dflash.checkpoints import load_drafter, load_target

    if spec.quant in ("fp8", "nvfp4"):
        raise StageBlocked(
            f"ONNX export of {spec.quant} targets (explicit Q/DQ graphs) is not implemented in this build",
            "build the engines with --quant bf16, or deploy the quantized checkpoint with runtime: trtllm",
        )
    source = _target_source(ctx)
    checkpoints = ctx.upstream["checkpoints"]["summary"]
    block_size = spec.block_size or checkpoints["drafter"]["block_size"]
    dtype = spec.compute_dtype
    ctx.status("loading the checkpoints")
    target = load_target(source, dtype=DTYPES[dtype])
    drafter = load_drafter(checkpoints["drafter"]["path"], target)
    variants = ["native"]
    unavailable = {}
    if "plugin" in spec.graphs:
        reason = plugin_graphs.plugin_support()
        if reason is None:
            variants.append("plugin")
        else:
            unavailable["plugin"] = reason
    torch.manual_seed(0)
    info = export_pair(target.model, drafter, ctx.workdir, dtype, bounds_of(spec, block_size), tuple(variants), ctx.status)
    tokenizer_dir = ctx.workdir / "tokenizer"
    tokenizer_dir.mkdir()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tokenizer_dir / name)
    return {"dtype": dtype, "variants": variants, "unavailable": unavailable, "block_size": block_size, "bounds": info["bounds"]}


def run_validate(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    import torch

    from trtllm_dflash.builder import validate
    from trtllm_dflash.builder.export import DTYPES
    from trtllm_dflash.checkpoints import load_drafter, load_target
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    export = ctx.upstream["export"]["summary"]
    checkpoints = ctx.upstream["checkpoints"]["summary"]
    params = spec.shape.params_b * 1e9 if spec.shape is not None else 0
    if params > CPU_VALIDATION_MAX_PARAMS:
        note = (f"skipped: a {params / 1e9:.1f}B-parameter target is too large to evaluate on CPU here; "
                "the GPU losslessness gate (docs/build.md) checks the engines instead")
        (ctx.workdir / "report.json").write_text(json.dumps({"status": "skipped", "note": note}, indent=2) + "\n")
        return {"status": "skipped", "note": note}
    dtype = export["dtype"]
    ctx.status("loading the torch reference")
    target = load_target(_target_source(ctx), dtype=DTYPES[dtype])
    drafter = load_drafter(checkpoints["drafter"]["path"], target)
    target.model.float()
    drafter.float()  # same rounded weights as the graph, float32 arithmetic
    reference = TorchRuntime(target.model, drafter)
    report: dict[str, Any] = {"dtype": dtype, "variants": {}}
    tolerance = validate.TOLERANCE[dtype]
    for variant in export["variants"]:
        ctx.status(f"evaluating the {variant} graphs on CPU")
        backend = "onnxruntime" if variant == "native" else "reference"
        from trtllm_dflash.builder import plugin_graphs

        candidate = OnnxRuntime(ctx.upstream_dir("export"), variant, backend, plugin_graphs.cpu_evaluators(variant))
        results = validate.compare_runtimes(candidate, reference, export["block_size"])
        validate.check(results, tolerance)
        prompts = [[5 + i for i in range(9)], [40 + 3 * i for i in range(4)]]
        prompts = [[t % reference.vocab_size for t in p] for p in prompts]
        with torch.no_grad():
            expected = validate.greedy_tokens(reference, prompts, 24)
            got = validate.greedy_tokens(candidate, prompts, 24)
        if got != expected and dtype != "fp16":
            raise validate.ValidationError(
                f"a greedy decode through the {variant} graphs diverges from the torch runtime", "this is a bug in the export; report it"
            )
        report["variants"][variant] = {
            "max_relative_error": max(r.rel for r in results),
            "tolerance": tolerance,
            "comparisons": [r.to_dict() for r in results],
            "greedy_decode_equal": got == expected,
        }
    (ctx.workdir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return {"status": "passed", **{v: {"max_relative_error": r["max_relative_error"], "greedy_decode_equal": r["greedy_decode_equal"]} for v, r in report["variants"].items()}}


# ----------------------------------------------------------------------------- engines / trtllm


def run_engines(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    from trtllm_dflash.builder import engines, plugin_graphs

    flavour = engines.load_flavour(spec.trt_flavour)
    engines.check_can_build(flavour, spec.gpu.compute_capability, spec.gpu.label)
    export_dir = ctx.upstream_dir("export")
    export = ctx.upstream["export"]["summary"]
    info = json.loads((export_dir / "graphs.json").read_text())
    bounds = bounds_of(spec, export["block_size"])
    cache_dir = ctx.out / ".cache" / "timing"
    timing_cache = cache_dir / f"{flavour.name}-{flavour.version}-sm{spec.gpu.sm}.cache"
    built: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for variant in export["variants"]:
        reason = plugin_graphs.engine_support(variant, flavour.name)
        if reason is not None:
            skipped[variant] = reason
            continue
        if variant != "native":
            plugin_graphs.register_tensorrt_plugins(flavour.trt)
        built[variant] = {}
        for graph in ("target", "drafter"):
            if graph not in info["variants"][variant]:
                continue
            ctx.status(f"building the {variant} {graph} engine ({flavour.name} {flavour.version}, SM {spec.gpu.cc_text})")
            built[variant][graph] = engines.build_engine(
                flavour,
                export_dir / variant / f"{graph}.onnx",
                ctx.workdir / variant / f"{graph}.engine",
                info["variants"][variant][graph],
                engines.profiles(graph, bounds),
                spec.gpu.compute_capability,
                timing_cache,
            )
    summary = {
        "flavour": flavour.name,
        "tensorrt_version": flavour.version,
        "compute_capability": spec.gpu.cc_text,
        "gpu": spec.gpu.name,
        "aot": flavour.aot,
        "precision": f"{export['dtype']} (strongly typed: precision follows the graph)",
        "engines": built,
        "skipped_variants": skipped,
    }
    (ctx.workdir / "engines.json").write_text(json.dumps({**summary, "graphs": info}, indent=2, sort_keys=True) + "\n")
    return summary


def run_trtllm(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    import yaml

    from trtllm_dflash.builder import trtllm

    checkpoints = ctx.upstream["checkpoints"]["summary"]
    drafter = checkpoints["drafter"]
    options = trtllm.llm_api_options(
        spec, checkpoints["target"]["path"], drafter["path"], drafter["mask_token_id"], drafter["target_layer_ids"],
        spec.block_size or drafter["block_size"],
    )
    checked = trtllm.check_options(options)
    how = trtllm.check_with_tensorrt_llm(options)
    (ctx.workdir / "llm_api.yaml").write_text(yaml.safe_dump(options, sort_keys=True))
    return {"file": "llm_api.yaml", "checked_keys": checked, "validation": how, "serve": "trtllm-serve <target> --config llm_api.yaml"}


def repository_writer():
    """The serving part's repository writer, when it is installed (seam for the serving issue)."""
    if importlib.util.find_spec("trtllm_dflash.serving") is None:
        return None
    try:
        from trtllm_dflash.serving.repository import write_build_repository  # type: ignore[attr-defined]
    except ImportError:
        return None
    return write_build_repository


# ----------------------------------------------------------------------------- the build


def make_stages(spec: BuildSpec, target_dir: Path, drafter_dir: Path) -> list[Stage]:
    tools = mf.tool_versions()
    recipe = spec.fingerprint()
    checkpoints = Stage(
        "checkpoints", "Check and hash the checkpoints",
        lambda ctx: run_checkpoints(ctx, target_dir, drafter_dir),
        inputs={"target": [str(target_dir), listing(target_dir)], "drafter": [str(drafter_dir), listing(drafter_dir)]},
    )
    quant_inputs: dict[str, Any] = {"quant": spec.quant, "kv_cache_dtype": spec.kv_cache_dtype}
    if spec.quant in ("fp8", "nvfp4"):
        quant_inputs.update(calibration=recipe["calibration"], modelopt=tools["modelopt"], torch=tools["torch"])
        if spec.calibration.dataset != "builtin" and Path(spec.calibration.dataset).is_file():
            quant_inputs["calibration_sha256"] = mf.sha256_file(Path(spec.calibration.dataset))
    quantize = Stage("quantize", "Quantize the target (ModelOpt)", lambda ctx: run_quantize(ctx, spec), quant_inputs, ("checkpoints",))
    if spec.runtime == "trtllm":
        trtllm_stage = Stage(
            "trtllm", "Write and check the TensorRT-LLM configuration", lambda ctx: run_trtllm(ctx, spec),
            {"recipe": recipe, "tensorrt_llm": tools["tensorrt_llm"]}, ("checkpoints", "quantize"),
        )
        return [checkpoints, quantize, trtllm_stage]
    export_inputs = {
        "format": EXPORT_FORMAT,
        "dtype": spec.compute_dtype,
        "bounds": [spec.max_batch, spec.max_input_len, spec.max_seq_len, spec.block_size],
        "graphs": list(spec.graphs),
        "tools": {k: tools[k] for k in ("torch", "transformers", "onnx", "onnxscript", "trtllm_dflash")},
    }
    export = Stage("export", "Export the ONNX graphs", lambda ctx: run_export(ctx, spec), export_inputs, ("checkpoints", "quantize"))
    validate_stage = Stage(
        "validate", "Check the graphs on CPU against the torch runtime", lambda ctx: run_validate(ctx, spec),
        {"onnxruntime": tools["onnxruntime"], "torch": tools["torch"]}, ("checkpoints", "quantize", "export"),
    )
    flavour_version = tools["tensorrt_rtx"] if spec.trt_flavour == "tensorrt-rtx" else tools["tensorrt"]
    engines_stage = Stage(
        "engines", f"Build the engines ({spec.trt_flavour})", lambda ctx: run_engines(ctx, spec),
        {"flavour": spec.trt_flavour, "version": flavour_version, "gpu": spec.gpu.name, "cc": spec.gpu.cc_text,
         "bounds": export_inputs["bounds"]},
        ("export", "validate"),
    )
    return [checkpoints, quantize, export, validate_stage, engines_stage]


def write_manifest(out: Path, spec: BuildSpec, records: dict[str, dict], blocked: StageBlocked | None, blocked_stage: str | None) -> dict:
    previous = mf.read_json(out / "manifest.json") or {}
    tools = mf.tool_versions()
    engines = records.get("engines", {}).get("summary", {})
    inputs = records.get("checkpoints", {}).get("summary", {})
    manifest = {
        "format": 1,
        "created": previous.get("created", mf.now()),
        "updated": mf.now(),
        "recipe": spec.to_dict(),
        "inputs": {role: inputs[role]["sha256"] for role in ("target", "drafter") if role in inputs},
        "tools": {
            **tools,
            "tensorrt_flavour": spec.trt_flavour if spec.runtime == "trt" else None,
            "tensorrt_build_version": engines.get("tensorrt_version"),
            "ptx_isa": mf.ptx_isa_versions(),
        },
        "stages": {
            name: {
                "status": "complete",
                "dir": name,
                "key": record["key"],
                "outputs_sha256": record["outputs_sha256"],
                "files": record["files"],
                "summary": record["summary"],
                "finished": record["finished"],
            }
            for name, record in records.items()
        },
        "complete": blocked is None,
    }
    if blocked is not None:
        manifest["stages"][blocked_stage] = {"status": "blocked", "missing": blocked.problem, "how_to_get_it": blocked.fix}
    writer = repository_writer()
    if writer is None:
        manifest["repository"] = {"status": "unavailable", "note": "the Triton repository writer is not installed; run `dflash-trt repo --build DIR`"}
    mf.write_json_atomic(out / "manifest.json", manifest)
    return manifest


def run_build(spec: BuildSpec, out: Path, force: bool = False, reporter: Reporter | None = None) -> BuildResult:
    """Run every stage of the build for `spec` into `out` (skipping unchanged stages)."""
    runner = StageRunner(out, reporter, force)
    target_dir = resolve_checkpoint_dir(spec.target, "target")
    drafter_dir = resolve_checkpoint_dir(spec.drafter, "drafter")
    stages = make_stages(spec, target_dir, drafter_dir)
    with runner:
        result = runner.run(stages, lambda records, blocked, stage: write_manifest(runner.out, spec, records, blocked, stage))
    return result


def load_manifest(out: Path) -> dict:
    manifest = mf.read_json(Path(out) / "manifest.json")
    if not isinstance(manifest, dict):
        raise DFlashError(f"{out} has no manifest.json", "point at the --out directory of a `dflash-trt build`")
    return manifest
