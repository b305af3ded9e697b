"""The stages of `dflash-trt build`, in order, and the top-level manifest.json they produce.

    checkpoints  validate the target/drafter pair, check and hash every weight file
    quantize     ModelOpt FP8 / NVFP4 of the target (nothing to do for BF16/FP16)
    export       ONNX graphs of the target and the drafter (plain-op and plugin variants)
    validate     the graphs on CPU against the torch runtime (numerics + a greedy decode)
    engines      TensorRT / TensorRT-RTX engines from the graphs
    trtllm       (backend `trtllm`, instead of export/validate/engines) TensorRT-LLM's options
    repository   the Triton model repository (the serving part's writer)

Which stages a build has is the backend's answer (trtllm_dflash.backends); what can run is
decided once, in feasibility.py, for this and for the stage plan (`--dry-run`).

A stage that cannot run on this machine (no GPU, no TensorRT) is recorded as blocked; the stages
that do not need it still run (the repository then serves the torch runtime), and the same
command on a suitable machine continues from the finished stages.

manifest.json lists the planned stages and is rewritten (atomically) before each stage starts and
after it ends: `complete` is true only when every planned stage finished, and a build killed or
failed mid-stage leaves that stage `running` or `failed`, which `dflash-trt repo --build` refuses.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from pathlib import Path
from typing import Any

from trtllm_dflash.backends import write_build_repository
from trtllm_dflash.builder import manifest as mf
from trtllm_dflash.builder.artifact import build_artifact
from trtllm_dflash.builder.feasibility import backend_of, export_support, repository_writer, validation_skip_reason
from trtllm_dflash.builder.spec import BuildSpec
from trtllm_dflash.builder.stage_plan import hf_offline
from trtllm_dflash.builder.stages import BuildResult, Reporter, Stage, StageBlocked, StageContext, StageRunner
from trtllm_dflash.errors import CheckpointError, DFlashError
from trtllm_dflash.extras import require

EXPORT_FORMAT = 2  # bump when the graphs change (2: exact attention scale, verifying plugin target), so old export stages are rebuilt
VALIDATE_FORMAT = 2  # bump when the checks or the report change (2: dtype-derived tolerance, validated variants)


# ----------------------------------------------------------------------------- checkpoints


def resolve_checkpoint_dir(name: str, role: str) -> Path:
    """A local directory for a checkpoint: a path, `demo`, or a Hugging Face id (cache or download)."""
    from trtllm_dflash.checkpoints import resolve_checkpoint

    if name == "demo" or Path(name).expanduser().exists():
        return resolve_checkpoint(name, role)
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=patterns, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or no huggingface_hub)
        pass
    # the flag that takes a local copy instead: --target stands in for a catalog model's checkpoint
    fix = f"download it where there is a network (`hf download {name} --local-dir DIR`) and rerun this command with --{role} DIR"
    if hf_offline():
        raise CheckpointError(f"{role} {name} is not a local directory and not in the Hugging Face cache (HF_HUB_OFFLINE is set)", fix)
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001 - network, authentication, unknown repository
        raise CheckpointError(f"cannot download {role} {name} ({str(exc).splitlines()[0]})", fix) from None


def listing(path: Path) -> list[list[Any]]:
    """Cheap fingerprint of a checkpoint directory: (name, size, mtime) of every file."""
    return sorted(
        [str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns]
        for p in path.rglob("*")
        if p.is_file() and ".cache" not in p.parts
    )


def _target_config(path: Path) -> Any:
    from types import SimpleNamespace

    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise CheckpointError(f"target {path} has no readable config.json", "point --model at a Hugging Face model directory") from None
    return SimpleNamespace(**raw.get("text_config", raw))


class CheckpointPair:
    """The build's target and drafter: each config.json parsed once per build and validate_pair run
    once, by the first stage that needs the pair (checkpoints; export or validate when the
    checkpoints stage finished in an earlier run). The stages after it load the drafter from
    this parse, without checking the pair again."""

    def __init__(self, target_dir: Path, drafter_dir: Path) -> None:
        self.target_dir, self.drafter_dir = target_dir, drafter_dir
        self._checked = False

    @functools.cached_property
    def drafter(self) -> Any:
        """The drafter's DrafterCheckpoint (its directory, config.json and DrafterConfig)."""
        from trtllm_dflash.checkpoints import read_drafter_checkpoint

        return read_drafter_checkpoint(self.drafter_dir)

    @functools.cached_property
    def target_config(self) -> Any:
        return _target_config(self.target_dir)

    def checked(self) -> Any:
        """The drafter's DrafterCheckpoint, once validate_pair has found that it fits the target."""
        if not self._checked:
            from trtllm_dflash.checkpoints import validate_pair

            drafter = self.drafter  # the drafter's config first, as a drafter-only check would report it
            validate_pair(self.target_config, drafter.config)
            self._checked = True
        return self.drafter


def run_checkpoints(ctx: StageContext, pair: CheckpointPair) -> dict[str, Any]:
    from trtllm_dflash.checkpoints import check_safetensors_headers, require_safetensors
    from trtllm_dflash.checkpoints.mxfp4 import check_mxfp4_tensors, is_mxfp4_checkpoint, tensor_index

    target_dir, drafter_dir = pair.target_dir, pair.drafter_dir
    drafter_config = pair.checked().config
    target_config = pair.target_config
    cache = mf.HashCache(ctx.out / ".cache" / "hashes.json")
    summary: dict[str, Any] = {}
    for role, path in (("target", target_dir), ("drafter", drafter_dir)):
        check_safetensors_headers(require_safetensors(path, role))
        digests = {}
        files = sorted(p for p in path.iterdir() if p.is_file())
        for index, file in enumerate(files):
            ctx.status(f"hashing the {role}'s {file.name}", index, len(files))
            digests[file.name] = cache.digest(file)
        summary[role] = {"path": str(path), "sha256": digests}
    cache.save()
    if is_mxfp4_checkpoint(vars(target_config)):  # gpt-oss as published: every expert's blocks and scales are there
        ctx.status("checking the MXFP4 experts")
        projections = check_mxfp4_tensors(tensor_index(require_safetensors(target_dir, "target")), vars(target_config), target_dir)
        summary["target"]["experts"] = {"format": "mxfp4", "projections": projections}
    summary["drafter"].update(
        block_size=drafter_config.block_size,
        mask_token_id=drafter_config.mask_token_id,
        target_layer_ids=list(drafter_config.target_layer_ids),
    )
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
    """ModelOpt PTQ of the target (FP8 / NVFP4, or gpt-oss's MXFP4 experts cast to NVFP4) and of an NVFP4 drafter."""
    precision = spec.precision
    if not precision.needs_modelopt:
        what = backend_of(spec).unquantized_note(precision.weights)
        return {"quant": precision.weights, "experts": precision.moe_experts, "note": f"no quantization: {what}"}
    from trtllm_dflash.builder.quantize import quantize_target
    from trtllm_dflash.builder.quantize_drafter import quantize_drafter

    checkpoints = ctx.upstream["checkpoints"]["summary"]
    target = Path(checkpoints["target"]["path"])
    summary: dict[str, Any] = {"quant": precision.weights, "experts": precision.moe_experts}
    if precision.quantized or precision.converts_experts:
        summary = {**quantize_target(target, ctx.workdir / "target", precision, spec.calibration, ctx.status), "target_dir": "target"}
    if precision.quantizes_drafter:
        from trtllm_dflash.builder.validate import quantized_drafter_acceptance

        source = Path(checkpoints["drafter"]["path"])
        drafter = quantize_drafter(source, target, ctx.workdir / "drafter", spec.calibration, ctx.status)
        # what the quantization cost: tau of the written drafter (loaded by our loader) beside the original's
        acceptance = quantized_drafter_acceptance(target, source, ctx.workdir / "drafter", spec.calibration, ctx.status)
        tau = acceptance["tau"]
        note = (
            f"drafter {drafter['quant']}: tau {tau['quantized']:.2f} vs {tau['unquantized']:.2f} unquantized "
            f"on {acceptance['prompts']} prompts, output = the target's"
        )
        summary.update(
            drafter_quantization={**drafter, "acceptance": acceptance},
            drafter_dir="drafter",
            note="; ".join(n for n in (summary.get("note"), note) if n),
        )
    return summary


def quantized_drafter_dir(ctx: StageContext) -> Path:
    """The NVFP4 drafter when the quantize stage wrote one, else the drafter as given."""
    written = ctx.upstream["quantize"]["summary"].get("drafter_dir")
    return ctx.upstream_dir("quantize") / written if written else Path(ctx.upstream["checkpoints"]["summary"]["drafter"]["path"])


def load_graph_target(spec: BuildSpec, source: Path, dtype: str):
    """The target as the graphs hold it: FP8 layers (Q/DQ) for an FP8 checkpoint, else cast to dtype."""
    from trtllm_dflash.builder.export import DTYPES
    from trtllm_dflash.checkpoints import Target, load_target

    if spec.precision.fp8_weights:
        from trtllm_dflash.checkpoints.modelopt import load_modelopt_model

        return Target(load_modelopt_model(source, "cpu", DTYPES[dtype], fp8_modules=True), None, source)
    return load_target(source, dtype=DTYPES[dtype])


def bounds_of(spec: BuildSpec, block_size: int):
    from trtllm_dflash.builder.export import Bounds

    return Bounds(spec.max_batch, spec.max_input_len, spec.max_seq_len, block_size)


def run_export(ctx: StageContext, spec: BuildSpec, pair: CheckpointPair) -> dict[str, Any]:
    import torch

    from trtllm_dflash.builder import plugin_graphs
    from trtllm_dflash.builder.export import export_pair
    from trtllm_dflash.checkpoints import BUILD_TOKENIZER_FILES, load_drafter

    for module in ("onnx", "onnxscript"):  # torch.onnx's exporter imports them deep inside
        require(module, "export", "ONNX export")
    reason = export_support(spec)
    if reason is not None:
        raise StageBlocked(f"cannot export NVFP4 graphs: {reason.split(';')[0]}", reason.split("; ", 1)[-1])
    source = _target_source(ctx)
    checkpoints = ctx.upstream["checkpoints"]["summary"]
    block_size = spec.block_size or checkpoints["drafter"]["block_size"]
    dtype = spec.precision.compute_dtype
    ctx.status("loading the checkpoints")
    target = load_graph_target(spec, source, dtype)
    drafter = load_drafter(pair.checked(), target, pair_checked=True)
    variants, unavailable = ["native"], {}
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
    for name in BUILD_TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, tokenizer_dir / name)
    # bytes each engine moves per verify step at the recipe's max batch, half the cache filled
    from trtllm_dflash.builder.traffic import TrafficError, write_traffic_json

    ctx.status("counting the bytes per verify step")
    try:
        bytes_per_step: dict[str, Any] = write_traffic_json(ctx.workdir)
    except TrafficError as exc:  # a report, not a reason to fail the export
        bytes_per_step = {"not_counted": str(exc)}
    return {
        "dtype": dtype,
        "variants": variants,
        "unavailable": unavailable,
        "block_size": block_size,
        "bounds": info["bounds"],
        "bytes_per_verify_step": bytes_per_step,
    }


def run_validate(ctx: StageContext, spec: BuildSpec, pair: CheckpointPair) -> dict[str, Any]:
    """Every exported variant (native, plugin) against the torch runtime: the engines stage builds only these."""
    from trtllm_dflash.builder import validate
    from trtllm_dflash.checkpoints import load_drafter
    from trtllm_dflash.runtime.onnx_runtime import OnnxRuntime
    from trtllm_dflash.runtime.torch_runtime import TorchRuntime

    export = ctx.upstream["export"]["summary"]
    note = validation_skip_reason(spec)
    if note is not None:
        (ctx.workdir / "report.json").write_text(json.dumps({"status": "skipped", "note": note}, indent=2) + "\n")
        return {"status": "skipped", "note": note}
    dtype = export["dtype"]
    ctx.status("loading the torch reference")
    target = load_graph_target(spec, _target_source(ctx), dtype)
    drafter = load_drafter(pair.checked(), target, pair_checked=True)
    # like with like: the graphs' rounded weights in float32 arithmetic, as the graphs are evaluated here
    target.model.float()
    drafter.float()
    reference = TorchRuntime(target.model, drafter)
    report: dict[str, Any] = {"dtype": dtype, "evaluated_in": "float32", "variants": {}}
    for index, variant in enumerate(export["variants"]):
        ctx.status(f"evaluating the {variant} graphs on CPU", index, len(export["variants"]))
        candidate = OnnxRuntime(ctx.upstream_dir("export"), variant)  # plugin nodes: onnx.reference + their CPU evaluators
        report["variants"][variant] = validate.validate_graphs(candidate, reference, export["block_size"], graphs=f"the {variant} graphs")
    (ctx.workdir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return {
        "status": "passed",
        "variants": list(report["variants"]),
        "max_relative_error": {v: r["max_relative_error"] for v, r in report["variants"].items()},
        "tolerance": {v: r["tolerance"] for v, r in report["variants"].items()},
    }


# ----------------------------------------------------------------------------- engines / trtllm / repository


def check_validated(export: dict[str, Any], validation: dict[str, Any]) -> None:
    """Engines are built only from graphs the validate stage passed (every variant, unless it was skipped for size)."""
    if validation.get("status") == "skipped":
        return
    missing = [v for v in export["variants"] if v not in validation.get("variants", [])]
    if validation.get("status") != "passed" or missing:
        raise DFlashError(
            f"the {', '.join(missing) or 'exported'} graphs were not validated", "rebuild with --force so the validate stage checks them"
        )


def run_engines(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    from trtllm_dflash.builder import engines, plugin_graphs

    check_validated(ctx.upstream["export"]["summary"], ctx.upstream["validate"]["summary"])
    flavour = engines.load_flavour(spec.trt_flavour)
    engines.check_can_build(flavour, spec.gpu.compute_capability, spec.gpu.full_name)
    export_dir = ctx.upstream_dir("export")
    export = ctx.upstream["export"]["summary"]
    info = json.loads((export_dir / "graphs.json").read_text())
    bounds = bounds_of(spec, export["block_size"])
    timing_cache = None
    if spec.use_timing_cache:
        timing_cache = ctx.out / ".cache" / "timing" / f"{flavour.name}-{flavour.version}-sm{spec.gpu.sm}.cache"
    built: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    plugins: dict[str, list[str]] = {}
    support = {variant: plugin_graphs.engine_support(variant, flavour.name) for variant in export["variants"]}
    jobs = [
        (variant, graph)
        for variant, reason in support.items()
        if reason is None  # one engine per graph file
        for graph in ("target", "drafter")
        if info["variants"][variant][graph].get("dir", variant) == variant
    ]
    for variant in export["variants"]:
        reason = support[variant]
        if reason is not None:
            skipped[variant] = reason
            continue
        if variant != "native":
            plugins[variant] = plugin_graphs.register_tensorrt_plugins(spec.gpu.sm_arch)
        built[variant] = {}
        for graph in ("target", "drafter"):
            graph_info = info["variants"][variant][graph]
            if graph_info.get("dir", variant) != variant:  # a graph shared with another variant: one engine
                built[variant][graph] = {**built[graph_info["dir"]][graph], "dir": graph_info["dir"]}
                continue
            ctx.status(
                f"building the {variant} {graph} engine ({flavour.name} {flavour.version}, SM {spec.gpu.compute_capability_str})",
                jobs.index((variant, graph)),
                len(jobs),
            )
            built[variant][graph] = engines.build_engine(
                flavour,
                export_dir / variant / f"{graph}.onnx",
                ctx.workdir / variant / f"{graph}.engine",
                graph_info,
                engines.profiles(graph, bounds),
                spec.gpu.compute_capability,
                timing_cache,
                spec.builder_optimization_level,
            )
    for skipped_variant, reason in list(skipped.items()):
        if skipped_variant == "native":
            raise StageBlocked(reason, "build the native graphs with another TensorRT flavour")
    # the engines folder is self-contained for the TensorRT runtime: graph I/O, drafter config, tokenizer
    shutil.copytree(export_dir / "drafter", ctx.workdir / "drafter")
    shutil.copytree(export_dir / "tokenizer", ctx.workdir / "tokenizer")
    summary = {
        "flavour": flavour.name,
        "tensorrt_version": flavour.version,
        "compute_capability": spec.gpu.compute_capability_str,
        "gpu": spec.gpu.name,
        "aot": flavour.aot,
        "dtype": export["dtype"],
        "precision": f"{spec.precision.weights} weights (FP8 as Q/DQ), {export['dtype']} activations; strongly typed"
        if spec.precision.fp8_weights
        else f"{export['dtype']}, strongly typed (precision follows the graph)",
        "engines": built,
        "skipped_variants": skipped,
        "plugins": plugins,
        "block_size": export["block_size"],
        "bounds": export["bounds"],
    }
    (ctx.workdir / "engines.json").write_text(json.dumps({**summary, "graphs": info}, indent=2, sort_keys=True) + "\n")
    return summary


def run_trtllm(ctx: StageContext, spec: BuildSpec) -> dict[str, Any]:
    import yaml

    from trtllm_dflash.backends.trtllm.drafters import local_drafter_overlay, write_drafter_overlay
    from trtllm_dflash.backends.trtllm.llm_args_check import pinned_source
    from trtllm_dflash.backends.trtllm.options import check_installed_tensorrt_llm

    target = _target_source(ctx)  # the quantized checkpoint when there is one
    drafter = quantized_drafter_dir(ctx)
    options, notes = backend_of(spec).checked_options(spec.recipe, str(drafter), ctx.out / "trtllm" / "drafter")
    overlay = local_drafter_overlay(drafter, spec.recipe.trtllm.attention_backend)
    if overlay is not None:  # TensorRT-LLM reads the drafter's semantics from this config.json (backends/trtllm/drafters.py)
        write_drafter_overlay(drafter, ctx.workdir / "drafter", overlay)
    checked_by = check_installed_tensorrt_llm(options, f"the options of {spec.recipe.name}")
    (ctx.workdir / "llm_api.yaml").write_text(
        f"# {spec.recipe.name}: trtllm-serve {target} --backend pytorch --config llm_api.yaml\n"
        f"# every key checked against TensorRT-LLM {pinned_source()}\n" + yaml.safe_dump(options, sort_keys=False)
    )
    return {
        "file": "llm_api.yaml",
        "checked_by": checked_by,
        "tensorrt_llm": pinned_source(),
        "notes": [*spec.notes, *notes],
        "speculative_config": options["speculative_config"],
    }


def run_repository(ctx: StageContext, spec: BuildSpec, llmapi_model: Path | None) -> dict[str, Any]:
    """The build's backend writes the repository from this build's artifact (engines when built)."""
    repository = repository_writer()
    write_build_repository(build_artifact(spec, ctx.out, ctx.upstream, llmapi_model), ctx.workdir / "triton", force=True)
    written = json.loads((ctx.workdir / "triton" / repository.MANIFEST).read_text())
    models = written.get("models", {})
    backends = sorted({str(m.get("backend")) for m in models.values()})
    return {"dir": "triton", "models": sorted(models), "backend": ",".join(backends)}


# ----------------------------------------------------------------------------- the build


def make_stages(spec: BuildSpec, target_dir: Path, drafter_dir: Path, llmapi_model: Path | None = None) -> list[Stage]:
    tools = mf.tool_versions()
    recipe = spec.fingerprint()
    pair = CheckpointPair(target_dir, drafter_dir)
    checkpoints = Stage(
        "checkpoints",
        "Check and hash the checkpoints",
        lambda ctx: run_checkpoints(ctx, pair),
        inputs={"target": [str(target_dir), listing(target_dir)], "drafter": [str(drafter_dir), listing(drafter_dir)]},
    )
    quant_inputs: dict[str, Any] = {"quantization": recipe["quantization"], "backend": spec.backend}
    if spec.precision.needs_modelopt:
        quant_inputs.update(modelopt=tools["modelopt"], torch=tools["torch"], transformers=tools["transformers"])
        dataset = Path(spec.calibration.dataset).expanduser()
        if spec.calibration.dataset != "builtin" and dataset.is_file():
            quant_inputs["calibration_sha256"] = mf.sha256_file(dataset)
    quantize = Stage("quantize", "Quantize the target (ModelOpt)", lambda ctx: run_quantize(ctx, spec), quant_inputs, ("checkpoints",))
    repository = Stage(
        "repository",
        "Write the Triton model repository",
        lambda ctx: run_repository(ctx, spec, llmapi_model),
        {"recipe": recipe, "toolkit": tools["trtllm_dflash"], "llmapi_model": str(llmapi_model) if llmapi_model else None},
        ("checkpoints",),
        ("quantize", "engines", "trtllm"),
    )
    bounds = [spec.max_batch, spec.max_input_len, spec.max_seq_len, spec.block_size]
    flavour_version = tools["tensorrt_rtx"] if spec.trt_flavour == "tensorrt-rtx" else tools["tensorrt"]
    own_stages = {
        "trtllm": lambda: Stage(
            "trtllm",
            "Write and check the TensorRT-LLM configuration",
            lambda ctx: run_trtllm(ctx, spec),
            {"recipe": recipe, "tensorrt_llm": tools["tensorrt_llm"]},
            ("checkpoints", "quantize"),
        ),
        "export": lambda: Stage(
            "export",
            "Export the ONNX graphs",
            lambda ctx: run_export(ctx, spec, pair),
            {
                "format": EXPORT_FORMAT,
                "dtype": spec.precision.compute_dtype,
                "bounds": bounds,
                "graphs": list(spec.graphs),
                "tools": {k: tools[k] for k in ("torch", "transformers", "onnx", "onnxscript", "trtllm_dflash")},
            },
            ("checkpoints", "quantize"),
        ),
        "validate": lambda: Stage(
            "validate",
            "Check the graphs on CPU against the torch runtime",
            lambda ctx: run_validate(ctx, spec, pair),
            {"format": VALIDATE_FORMAT, "onnxruntime": tools["onnxruntime"], "torch": tools["torch"]},
            ("checkpoints", "quantize", "export"),
        ),
        "engines": lambda: Stage(
            "engines",
            f"Build the engines ({spec.trt_flavour})",
            lambda ctx: run_engines(ctx, spec),
            {
                "flavour": spec.trt_flavour,
                "version": flavour_version,
                "gpu": spec.gpu.name,
                "bounds": bounds,
                "optimization_level": spec.builder_optimization_level,
            },
            ("export", "validate"),
        ),
    }
    stages = [checkpoints, quantize] + [own_stages[name]() for name in backend_of(spec).build_stages]
    if repository_writer() is not None:
        stages.append(repository)
    return stages


def write_manifest(out: Path, spec: BuildSpec, result: BuildResult, command: str | None = None, llmapi_model: Path | None = None) -> dict:
    """manifest.json: recipe, input digests, tool versions, every planned stage's status (outputs and
    digests when finished), `command`, the build command a rerun repeats to finish it, and `artifact`,
    what the build has made (backends/artifact.py: what `repo --build` reads)."""
    records = result.records
    previous = mf.read_json(out / "manifest.json") or {}
    engines = records.get("engines", {}).get("summary", {})
    checkpoints = records.get("checkpoints", {}).get("summary", {})
    quantize = records.get("quantize", {}).get("summary", {})
    stages: dict[str, Any] = {
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
    }
    for name, blocked in result.blocked.items():
        stages[name] = {"status": "blocked", "missing": blocked.problem, "how_to_get_it": blocked.fix}
    for name, needs in result.not_run.items():
        stages[name] = {"status": "not run", "needs": needs}
    for name, started in result.running.items():
        stages[name] = {"status": "running", "started": started, "pid": os.getpid()}
    for name, why in result.failed.items():
        stages[name] = {"status": "failed", "error": why}
    for name in result.planned:  # not reached yet (finished ones of an earlier run are checked when reached)
        stages.setdefault(name, {"status": "pending"})
    manifest: dict[str, Any] = {
        "format": 1,
        "created": previous.get("created", mf.now()),
        "updated": mf.now(),
        "complete": result.complete,
        "planned": list(result.planned),
        "command": command or previous.get("command"),
        "recipe": spec.to_dict(),
        "inputs": {role: checkpoints[role]["sha256"] for role in ("target", "drafter") if role in checkpoints},
        "tools": {
            **mf.tool_versions(),
            "tensorrt_flavour": spec.trt_flavour,
            "tensorrt_build_version": engines.get("tensorrt_version"),
            "ptx_isa": mf.ptx_isa_versions(),
        },
        "stages": stages,
    }
    # the target the build deploys (the quantized checkpoint when there is one), for the GPU gate
    if checkpoints:
        target = (
            "demo"
            if spec.target == "demo" and not quantize.get("target_dir")
            else (str(out / "quantize" / quantize["target_dir"]) if quantize.get("target_dir") else checkpoints["target"]["path"])
        )
        drafter = (
            str(out / "quantize" / quantize["drafter_dir"])
            if quantize.get("drafter_dir")
            else ("demo" if spec.drafter == "demo" else checkpoints["drafter"]["path"])
        )
        manifest["checkpoints"] = {"target": target, "drafter": drafter}
    if "engines" in records:
        manifest["engines"] = "engines"
    if "repository" in records:
        manifest["repository"] = "repository/triton"
    artifact = build_artifact(spec, out, records, llmapi_model)
    if artifact is not None:
        manifest["artifact"] = artifact.model_dump(mode="json")
    mf.write_json_atomic(out / "manifest.json", manifest)
    return manifest


def run_build(
    spec: BuildSpec,
    out: Path,
    force: bool = False,
    reporter: Reporter | None = None,
    command: str | None = None,
    plan: Any = None,
    llmapi_model: Path | None = None,
) -> BuildResult:
    """Run every stage of the build for `spec` into `out` (skipping unchanged stages).

    `command` (the CLI's own words) is recorded so that a refusal of the unfinished build can say
    what to rerun; `plan` (stage_plan.BuildPlan, made here when not given) gives each stage the
    size of its output, named when the disk fills; `llmapi_model` (trtllm, checked by the caller) is
    NVIDIA's LLM-API Triton model folder the repository names."""
    runner = StageRunner(out, reporter, force)
    target_dir = resolve_checkpoint_dir(spec.target, "target")
    drafter_dir = resolve_checkpoint_dir(spec.drafter, "drafter")
    stages = make_stages(spec, target_dir, drafter_dir, llmapi_model)
    if plan is None:
        from trtllm_dflash.builder.stage_plan import make_build_plan

        plan = make_build_plan(spec)
    sizes = {s.name: s.output for s in plan.stages if s.output.startswith("~")}
    for stage in stages:
        stage.size = sizes.get(stage.name)
    with runner:
        return runner.run(stages, lambda result: write_manifest(runner.out, spec, result, command, llmapi_model))
