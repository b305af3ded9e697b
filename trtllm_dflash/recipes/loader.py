"""Reading recipes: YAML -> validated Recipe, with errors that name the file, the key and the line.

YAML is composed first (nodes keep their line numbers), then validated with pydantic; each
validation error's location (a key path) is walked back through the node tree to the line that
holds it. Duplicate keys, which PyYAML would silently collapse to the last one, are errors too.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from trtllm_dflash.catalog.models import check_model_link
from trtllm_dflash.errors import RecipeError
from trtllm_dflash.recipes.schema import Recipe


def recipes_dir() -> Path:
    """engine_recipes/ as installed (imported as trtllm_dflash.engine_recipes)."""
    import trtllm_dflash.engine_recipes as package

    return Path(package.__file__).resolve().parent


class RecipeValidationError(RecipeError):
    """A recipe with one or more problems; `.errors` lists every one as 'file:line: key: problem'."""

    def __init__(self, errors: list[str], fix: str) -> None:
        self.errors = errors
        more = f" (and {len(errors) - 1} more; `dflash-trt recipes validate FILE` lists them all)" if len(errors) > 1 else ""
        super().__init__(errors[0] + more, fix)


def load_recipe(path: str | Path) -> Recipe:
    """Read and validate one recipe file."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist", "pass an existing YAML file, or a name from `dflash-trt recipes list`")
    text = path.read_text()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise RecipeValidationError([f"{path}:{line}: invalid YAML: {exc.problem or exc}"], "fix the YAML syntax") from None
    if not isinstance(root, yaml.MappingNode):
        raise RecipeValidationError(
            [f"{path}:1: a recipe must be a YAML mapping of sections"], "start from an existing recipe (`dflash-trt recipes show NAME`)"
        )
    duplicates = _duplicate_keys(root, ())
    if duplicates:
        raise RecipeValidationError([f"{path}:{line}: {_dotted(loc)}: key given twice" for loc, line in duplicates], "keep one of the two")
    data = yaml.safe_load(text)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as exc:
        errors = [_describe(path, root, error) for error in exc.errors()]
        raise RecipeValidationError(errors, "fix the recipe (`dflash-trt recipes show NAME` prints a valid one)") from None
    _check_location(path, root, recipe)
    _check_precisions(path, root, recipe)
    recipe._path = path
    return recipe


def list_recipes() -> list[Recipe]:
    """Every recipe shipped in engine_recipes/, sorted by name."""
    return sorted((load_recipe(p) for p in sorted(recipes_dir().glob("*/*.yaml"))), key=lambda r: r.name)


def find_recipe(model: str, gpu: str) -> Recipe:
    """The shipped recipe for a model on a GPU (names or aliases: 'gpt-oss-120b', 'B300', ...)."""
    check_model_link(model)
    model_key, gpu_key = canonical_model_name(model), canonical_gpu_name(gpu)
    path = recipes_dir() / model_key / f"{gpu_key}.yaml"
    if path.is_file():
        return load_recipe(path)
    others = sorted(p.stem for p in (recipes_dir() / model_key).glob("*.yaml"))
    where = f"recipes for {model_key} exist for: {', '.join(others)}" if others else f"there is no recipe for {model_key}"
    raise RecipeError(
        f"no recipe for {model_key} on {gpu_key} ({where})",
        "pick a listed GPU, or write a recipe (start from `dflash-trt recipes show NAME`) and pass --recipe FILE",
    )


def resolve_recipe(name_or_path: str | Path) -> Recipe:
    """A recipe from a file path or a '<model>/<gpu>' name."""
    text = str(name_or_path)
    if text.endswith((".yaml", ".yml")) or Path(text).is_file():
        return load_recipe(text)
    if "/" in text:
        model, _, gpu = text.rpartition("/")
        return find_recipe(model, gpu)
    raise RecipeError(f"{text!r} is neither a recipe file nor a '<model>/<gpu>' name", "see `dflash-trt recipes list`")


def canonical_model_name(model: str) -> str:
    """The catalog name for a model name or alias; other names are kept as given."""
    from trtllm_dflash.catalog.models import MODELS, resolve_model

    key = model.strip().lower()
    for spec in MODELS.values():
        if key == spec.name or key == spec.checkpoint.lower() or key in spec.aliases:
            return spec.name
    if key == "demo":
        return "demo"
    return resolve_model(model).name if Path(model).is_dir() else key


def canonical_gpu_name(gpu: str) -> str:
    from trtllm_dflash.catalog.gpus import CPU, resolve_gpu

    return CPU if gpu.strip().lower() == CPU else resolve_gpu(gpu).name


# ----- mapping validation errors back to YAML lines -----


def _duplicate_keys(node: yaml.Node, loc: tuple) -> list[tuple[tuple, int]]:
    found = []
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key, value in node.value:
            name = key.value
            if name in seen:
                found.append(((*loc, name), key.start_mark.line + 1))
            seen.add(name)
            found += _duplicate_keys(value, (*loc, name))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found += _duplicate_keys(item, (*loc, index))
    return found


def _node_at(root: yaml.Node, loc: tuple) -> yaml.Node:
    """The node that holds the value at `loc`, or the closest enclosing key when the path stops early.

    A scalar is reported at its own line; a section (mapping/sequence) at the line of its key.
    """
    node, anchor = root, root
    for depth, item in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if str(k.value) == str(item)), None)
            if match is None:
                return anchor
            key, value = match
            if depth == len(loc) - 1:
                return key if isinstance(value, (yaml.MappingNode, yaml.SequenceNode)) else value
            node, anchor = value, key
        elif isinstance(node, yaml.SequenceNode) and isinstance(item, int) and 0 <= item < len(node.value):
            node = anchor = node.value[item]
        else:
            return anchor
    return anchor


def _dotted(loc: tuple) -> str:
    out = ""
    for item in loc:
        out += f"[{item}]" if isinstance(item, int) and out else (f".{item}" if out else str(item))
    return out or "(top level)"


def _describe(path: Path, root: yaml.Node, error: dict) -> str:
    # pydantic adds markers such as '[key]' or 'function-after[...]' to locations: not YAML keys
    loc = tuple(item for item in error["loc"] if not (isinstance(item, str) and "[" in item))
    kind = error["type"]
    node = _node_at(root, loc)
    line = node.start_mark.line + 1
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        message = f"unknown key{hint}; allowed here: {', '.join(allowed)}"
    elif kind == "missing":
        message = "required key is missing"
    elif "input" in error and kind.endswith(("_type", "_parsing", "literal_error", "enum")):
        message = f"{message} (got {error['input']!r})"
    return f"{path}:{line}: {_dotted(loc)}: {message}"


def _allowed_keys(loc: tuple) -> list[str]:
    """Field names of the schema section at `loc` (for 'unknown key' messages)."""
    cls: Any = Recipe
    for item in loc:
        field = cls.model_fields.get(str(item)) if isinstance(cls, type) and issubclass(cls, BaseModel) else None
        if field is None:
            return []
        cls = _section_type(field.annotation)
    return list(cls.model_fields) if isinstance(cls, type) and issubclass(cls, BaseModel) else []


def _section_type(annotation: Any) -> Any:
    for arg in typing.get_args(annotation) or (annotation,):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def _check_location(path: Path, root: yaml.Node, recipe: Recipe) -> None:
    """A shipped recipe lives at engine_recipes/<model>/<gpu>.yaml: the path must agree with its content."""
    try:
        relative = path.resolve().relative_to(recipes_dir())
    except ValueError:
        return  # a user's recipe elsewhere: no naming rule
    if len(relative.parts) != 2:
        return
    folder, stem = relative.parts[0], Path(relative.parts[1]).stem
    errors = []
    model_key = canonical_model_name(recipe.model.name)
    if model_key != folder:
        node = _node_at(root, ("model", "name"))
        errors.append(f"{path}:{node.start_mark.line + 1}: model.name: {recipe.model.name!r} is not the folder's model {folder!r}")
    if recipe.gpu != stem:
        node = _node_at(root, ("gpu",))
        errors.append(f"{path}:{node.start_mark.line + 1}: gpu: {recipe.gpu!r} does not match the file name {stem!r}.yaml")
    if errors:
        raise RecipeValidationError(errors, "shipped recipes live at engine_recipes/<model>/<gpu>.yaml")


def _check_precisions(path: Path, root: yaml.Node, recipe: Recipe) -> None:
    """Refuse at configuration time what the GPU cannot run (NVFP4 on Hopper, FP8 below SM 8.9)."""
    from trtllm_dflash.catalog.gpus import gpus_supporting

    gpu = recipe.gpu_spec()
    if gpu is None:
        return
    q = recipe.quantization
    errors = []
    for key, precision in (("weights", q.weights), ("moe_experts", q.experts), ("kv_cache", q.kv_cache), ("drafter", q.drafter)):
        if key == "moe_experts" and q.moe_experts is None:
            continue
        if not gpu.supports(precision):
            node = _node_at(root, ("quantization", key))
            names = ", ".join(g.name for g in gpus_supporting(precision))
            errors.append(
                f"{path}:{node.start_mark.line + 1}: quantization.{key}: {precision} does not run on "
                f"{gpu.name} (SM {gpu.compute_capability_str}); GPUs that run it: {names}"
            )
    if errors:
        raise RecipeValidationError(errors, "choose a precision this GPU supports (`dflash-trt plan` suggests one)")
