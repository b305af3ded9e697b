"""Recipes: one YAML file per model x GPU (engine_recipes/<model>/<gpu>.yaml), validated by schema.py.

from trtllm_dflash.recipes import find_recipe, load_recipe, list_recipes

recipe = find_recipe("gpt-oss-120b", "b300")
recipe.backend, recipe.quantization.experts, recipe.parallelism.tp, recipe.max_draft_len
recipe.precision.needs_modelopt  # what is quantized and how, decided once (precision.py)
"""

from trtllm_dflash.recipes.loader import (
    RecipeValidationError,
    find_recipe,
    list_recipes,
    load_recipe,
    recipes_dir,
    resolve_recipe,
)
from trtllm_dflash.recipes.precision import Precision
from trtllm_dflash.recipes.schema import Recipe

__all__ = [
    "Precision",
    "Recipe",
    "RecipeValidationError",
    "find_recipe",
    "list_recipes",
    "load_recipe",
    "recipes_dir",
    "resolve_recipe",
]
