"""The model's config facts for the plan (config.json, a GGUF header or the hub's config.json; never
weights), and the checks that do not run without them."""

from __future__ import annotations

from pathlib import Path

from llmopt.errors import Problem, UsageError
from llmopt.model.hub import hub_config, hub_offline, is_hub_id, local_folder
from llmopt.model.modelinfo import ModelInfo, from_folder, from_gguf, gguf_path, is_gguf
from llmopt.recipe.load import LoadedRecipe


def folder_facts(path: Path) -> ModelInfo | None:
    """Config facts of a model folder or GGUF file given on the command line, or None."""
    try:
        if is_gguf(str(path)):
            return from_gguf(path) if path.is_file() else None
        return from_folder(path) if (path / "config.json").is_file() else None
    except Exception:  # facts only sharpen checks; the stages report real problems
        return None


def model_facts(loaded: LoadedRecipe, problems: list[Problem], facts: bool = True) -> ModelInfo | None:
    """Config facts of the source model, or None with a warning that says why and names the checks that
    then do not run (none without ``facts``: `validate` lists them itself)."""
    if not facts:
        return None
    source = loaded.recipe.model.source
    base = loaded.path.parent
    try:
        if is_gguf(source):
            path = gguf_path(source, base)
            if path.is_file():
                return from_gguf(path)
            why = f"{path} not found"
        elif is_hub_id(source):
            return _hub_facts(loaded, problems, offline=hub_offline())
        else:
            folder = local_folder(source, base)
            if (folder / "config.json").is_file():
                return from_folder(folder)
            why = f"{folder / 'config.json'} not found"
    except Exception as exc:  # a malformed config or header, a missing extra: checks that need facts are skipped
        why = f"could not read them ({exc})"
    problems.append(facts_unknown(loaded, why))
    return None


def _hub_facts(loaded: LoadedRecipe, problems: list[Problem], offline: bool) -> ModelInfo | None:
    """Facts from a hub model's config.json; an unreachable hub or a missing model is an error."""
    model = loaded.recipe.model
    try:
        path = hub_config(model.source, model.revision, offline)
    except UsageError as exc:
        problems.append(Problem(exc.what, loaded.where("model", "source"), exc.fix))
        return None
    if path is None:
        problems.append(facts_unknown(
            loaded, f"offline, and {model.source}'s config.json is not in the local hub cache",
            "plan once with the network (without --offline and HF_HUB_OFFLINE) to cache config.json"))
        return None
    return from_folder(path.parent)


def facts_unknown(loaded: LoadedRecipe, why: str, hint: str = "") -> Problem:
    """The warning of a plan without model facts: why, and which checks did not run."""
    skipped = "; ".join(unchecked_without_facts(loaded))
    return Problem(f"model facts unknown: {why}; these checks did not run: {skipped}",
                   loaded.where("model", "source"), hint, severity="warning")


def unchecked_without_facts(loaded: LoadedRecipe, source: bool = False) -> list[str]:
    """The plan-time checks of this recipe that need model facts (``source``: the source check too),
    as the backends' checks are written: what a plan without facts does not judge."""
    recipe = loaded.recipe
    out = ["the model source: that it exists, and its config.json, weight files or GGUF file"] if source else []
    out += [f"compress[{i}] ({step.method}): the model's architecture, existing quantization and layer shapes"
            for i, step in enumerate(recipe.compress)]
    if recipe.export.format != "hf":
        out.append(f"export ({recipe.export.format}): block size and embeddings against the model's layers")
    out += [f"eval[{i}] ({item.kind}): the window against the model's context" for i, item in enumerate(recipe.eval)
            if hasattr(loaded.options.get(("eval", i)), "window")]
    engines = [e for e in recipe.serve.engines if e != "ort"] if recipe.serve is not None else []
    if engines and recipe.target.gpu:
        out.append(f"serve ({', '.join(engines)}): max_model_len against the model's context, and the memory model")
    out.append("estimates of the weights, the artifact, calibration memory and the KV cache")
    return out
