"""Recipes: the TOML file a user writes, its schema and its loader."""

from llmopt.recipe.load import LoadedRecipe, apply_override, load_recipe, parse_recipe
from llmopt.recipe.schema import SCHEMA_VERSION, Recipe

__all__ = ["LoadedRecipe", "Recipe", "SCHEMA_VERSION", "apply_override", "load_recipe", "parse_recipe"]
