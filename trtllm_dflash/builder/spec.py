"""The build specification: a recipe (model x GPU) with command-line overrides, checked by the planner.

Recipes, the GPU/model catalogs and the memory planner live in `trtllm_dflash.recipes`,
`trtllm_dflash.catalog` and `trtllm_dflash.planning`; this module picks the recipe for
`--model/--gpu` (or `--recipe`), applies the flags, and refuses at plan time what cannot work
(NVFP4 on Hopper, FP8 below SM 8.9, a model that does not fit), before anything is built.
A local target directory without a recipe gets one written in code with the same defaults.
No torch import.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtllm_dflash.errors import DFlashError, RecipeError

if TYPE_CHECKING:
    from trtllm_dflash.recipes.precision import Precision

GRAPH_VARIANTS = ("native", "plugin")


class SpecError(DFlashError):
    """A build specification that cannot work."""


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """A validated recipe and its plan, with the flattened values the build stages read."""

    recipe: Any  # trtllm_dflash.recipes.Recipe
    plan: Any  # trtllm_dflash.planning.Plan
    notes: tuple[str, ...] = ()  # what the plan should tell the user about the flags (a --target stand-in)

    # ---- identity
    @property
    def model(self) -> str:
        return Path(self.recipe.model.name).name

    @property
    def target(self) -> str:
        return self.recipe.model.checkpoint

    @property
    def drafter(self) -> str:
        return self.recipe.drafter.checkpoint

    @property
    def gpu(self):
        return self.recipe.gpu_spec()

    @property
    def backend(self) -> str:
        """The deployment backend (trt, trtllm or torch; trtllm_dflash.backends)."""
        return self.recipe.backend

    @property
    def source(self) -> str:
        return str(self.recipe.path) if self.recipe.path else f"recipe {self.recipe.name}"

    # ---- precision
    @property
    def precision(self) -> Precision:
        """What the build quantizes and how (trtllm_dflash.recipes.precision.Precision): the value the
        planner made from the recipe (flags applied) and checked against the GPU; every stage asks it."""
        return self.plan.precision

    @property
    def calibration(self):
        from trtllm_dflash.recipes.schema import CalibrationSection

        return self.recipe.quantization.calibration or CalibrationSection()

    # ---- limits and engines
    @property
    def max_batch(self) -> int:
        return self.recipe.limits.max_batch_size

    @property
    def max_input_len(self) -> int:
        return self.recipe.limits.max_input_len

    @property
    def max_seq_len(self) -> int:
        return self.recipe.limits.max_seq_len

    @property
    def block_size(self) -> int:
        return self.recipe.drafter.block_size

    @property
    def graphs(self) -> tuple[str, ...]:
        use_plugins = self.recipe.trt is not None and self.recipe.trt.use_plugins
        return GRAPH_VARIANTS if use_plugins else ("native",)

    @property
    def trt_flavour(self) -> str | None:
        return self.recipe.trt_flavour()

    @property
    def builder_optimization_level(self) -> int:
        return self.recipe.trt.builder_optimization_level if self.recipe.trt is not None else 3

    @property
    def use_timing_cache(self) -> bool:
        return self.recipe.trt is None or self.recipe.trt.timing_cache

    def to_dict(self) -> dict[str, Any]:
        """The recipe as resolved (what the manifest records beside the build's artifact)."""
        return {"name": self.recipe.name, "source": self.source, **self.recipe.model_dump(mode="json")}

    def fingerprint(self) -> dict[str, Any]:
        """The recipe fields that change what the build produces (not where the recipe came from)."""
        out = self.recipe.model_dump(mode="json")
        out.pop("description", None)
        return out


# ----------------------------------------------------------------------------- resolution


def _absolute_if_local(checkpoint: str | Path) -> str:
    """A checkpoint directory that exists here as an absolute path; a name (Hugging Face id, 'demo') as given."""
    path = Path(checkpoint).expanduser()
    return str(path.resolve()) if path.is_dir() else str(checkpoint)


def _local_recipe(target: Path, gpu: str, drafter: str | None, quant: str | None) -> dict[str, Any]:
    """A recipe for a local target directory (no shipped recipe names it): the planner's defaults."""
    if drafter is None:
        raise SpecError(f"--model {target} is a checkpoint directory, so the drafter is not known", "pass --drafter DIR")
    drafter_dir = Path(drafter).expanduser()
    try:
        raw = json.loads((drafter_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        raise SpecError(f"drafter {drafter_dir} has no readable config.json", "pass a z-lab style drafter directory") from None
    block_size = int((raw.get("dflash_config") or {}).get("block_size") or raw.get("block_size") or 0)
    if block_size < 2:
        raise SpecError(f"drafter {drafter_dir} has no block_size >= 2 in config.json", "fix the drafter's config.json")
    return {
        "description": f"local checkpoint {target}",
        "model": {"name": str(target.resolve()), "checkpoint": str(target.resolve())},
        "drafter": {"checkpoint": str(drafter_dir.resolve()), "block_size": block_size},
        "gpu": gpu,
        "backend": "trt",
        "quantization": {"weights": quant or "bf16", "kv_cache": "bf16", "drafter": "bf16"},
        "limits": {"max_batch_size": 8, "max_input_len": 512, "max_seq_len": 1024},
        "triton": {"max_batch_size": 8},
        "trt": {},
    }


def _apply(recipe, overrides: dict[str, Any]):
    """A new Recipe with command-line overrides (re-validated by the schema)."""
    from pydantic import ValidationError

    from trtllm_dflash.recipes import Recipe

    data = recipe.model_dump(mode="python")
    q, limits = data["quantization"], data["limits"]
    if overrides.get("quant"):
        quant = overrides["quant"].lower()
        if q.get("moe_experts") is not None and quant in ("nvfp4", "mxfp4") and q["weights"] == "bf16":
            q["moe_experts"] = quant  # gpt-oss: --quant picks the expert precision (as `dflash-trt plan` does)
        else:
            q["weights"] = quant
            if q.get("moe_experts") is not None:
                q["moe_experts"] = quant
    if overrides.get("calibration"):
        q["calibration"] = {**(q.get("calibration") or {}), "dataset": str(overrides["calibration"])}
    # local directories are recorded absolute: the manifest, the repository and the served model resolve
    # them from other folders (a relative ./my-drafter would be looked for beside the served model)
    if overrides.get("drafter"):
        data["drafter"]["checkpoint"] = _absolute_if_local(overrides["drafter"])
    if overrides.get("target"):
        data["model"]["checkpoint"] = _absolute_if_local(overrides["target"])
    if overrides.get("drafter_section"):
        data["drafter"] = {**overrides["drafter_section"], "checkpoint": data["drafter"]["checkpoint"]}
    backend = (overrides.get("backend") or "").strip().lower()
    if backend and backend != data["backend"]:
        data["backend"] = backend  # the planner refuses one the family cannot use
        for section in ("trt", "trtllm"):  # the other backend's settings do not carry over
            if section != backend:
                data.pop(section, None)
    if overrides.get("native_only"):
        if data["backend"] != "trt":
            raise SpecError(
                f"--native-only chooses the graphs of trt builds, and this build's backend is {data['backend']}", "drop --native-only"
            )
        data["trt"] = {**(data.get("trt") or {}), "use_plugins": False}
    for flag, key in (("max_batch", "max_batch_size"), ("max_input_len", "max_input_len"), ("max_seq_len", "max_seq_len")):
        if overrides.get(flag) is not None:
            limits[key] = int(overrides[flag])
    if overrides.get("max_batch") is not None:
        data["triton"]["max_batch_size"] = min(data["triton"]["max_batch_size"], int(overrides["max_batch"]))
        if data.get("trtllm") and data["trtllm"].get("cuda_graph"):
            data["trtllm"]["cuda_graph"]["max_batch_size"] = min(
                data["trtllm"]["cuda_graph"]["max_batch_size"], int(overrides["max_batch"])
            )
    try:
        updated = Recipe.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(item) for item in first["loc"] if not (isinstance(item, str) and "[" in item))
        message = str(first["msg"]).removeprefix("Value error, ")
        raise SpecError(f"{where}: {message}" if where else message, "fix the flag or the recipe") from None
    updated._path = recipe.path
    return updated


def resolve_spec(
    model: str | None = None,
    gpu: str | None = None,
    recipe: str | Path | None = None,
    quant: str | None = None,
    drafter: str | None = None,
    target: str | None = None,
    **overrides: Any,
) -> BuildSpec:
    """The recipe for model x GPU (or --recipe), with flags applied, accepted by the planner.

    `target` is a local checkpoint standing in for the recipe model's (builder/stand_in.py)."""
    from trtllm_dflash.backends import get_backend
    from trtllm_dflash.catalog.gpus import CPU
    from trtllm_dflash.planning import plan_deployment
    from trtllm_dflash.recipes import Recipe, find_recipe, resolve_recipe

    if recipe is not None:
        chosen = resolve_recipe(recipe)
        if gpu is not None and chosen.gpu != gpu.strip().lower():
            from trtllm_dflash.recipes.loader import canonical_gpu_name

            if canonical_gpu_name(gpu) != chosen.gpu:
                raise SpecError(f"--gpu {gpu} disagrees with recipe {chosen.name}", "drop --gpu or pass the recipe for that GPU")
    else:
        if not model:
            raise SpecError("no model given", "pass --model NAME|DIR (for example --model demo) or --recipe FILE")
        if not gpu:
            raise SpecError("no GPU given", "pass --gpu NAME (see `dflash-trt recipes list`)")
        local = Path(model).expanduser()
        if target is not None and model != "demo" and local.is_dir():
            raise SpecError(
                f"--target {target} stands in for a catalog model's checkpoint, but --model {model} is already a directory",
                "pass the catalog name as --model (for example --model gpt-oss-120b), or drop --target",
            )
        if model != "demo" and local.is_dir():
            from trtllm_dflash.recipes.loader import canonical_gpu_name

            data = _local_recipe(local, canonical_gpu_name(gpu), drafter, quant)
            try:
                chosen = Recipe.model_validate(data)
            except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, one line
                raise SpecError(
                    f"cannot build {local} for {gpu} ({str(exc).splitlines()[0]})", "write a recipe and pass --recipe"
                ) from None
        elif local.exists() and model != "demo":
            raise SpecError(f"--model {model} is a file, not a model name or a checkpoint directory", "pass a name or a directory")
        else:
            chosen = find_recipe(model, gpu)
    if chosen.gpu == CPU or not get_backend(chosen.backend).needs_build:
        raise SpecError(
            f"recipe {chosen.name} runs the torch backend, which needs no build",
            f"serve it directly: `dflash-trt repo --model {chosen.model.name} --out REPO`, or build for a GPU (--gpu rtx-pro-6000)",
        )
    notes: list[str] = []
    if target is not None:
        from trtllm_dflash.builder.stand_in import check_stand_in, drafter_overrides

        stand_in = check_stand_in(chosen.model_spec(), target)
        notes.extend(stand_in.notes)
        overrides["target"] = str(stand_in.path)
        if drafter is not None:
            section, drafter_notes = drafter_overrides(chosen.drafter.model_dump(mode="python"), drafter)
            overrides["drafter_section"] = section
            notes.extend(drafter_notes)
    chosen = _apply(chosen, {"quant": quant, "drafter": drafter, **overrides})
    try:
        plan = plan_deployment(chosen.model.name, chosen.gpu, recipe=chosen, drafter=chosen.drafter.checkpoint)
    except RecipeError:
        raise
    plan.check()  # refusals: precision the GPU cannot run (naming the GPUs that can), layout, does not fit
    return BuildSpec(chosen, plan, tuple(notes))
