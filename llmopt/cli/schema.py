"""llmopt schema: the recipe's JSON Schema, for editor completion."""

from __future__ import annotations

import json

from llmopt.cli.app import app


@app.command()
def schema() -> None:
    """Print the recipe's JSON Schema (draft 2020-12), with the options of every installed backend.

    A backend table takes the keys of the backend it names: group_size completes where method = "gptq".

    Editors: with taplo / Even Better TOML, put `#:schema ./recipe.schema.json` on a recipe's first line.

    Examples:

        llmopt schema > recipe.schema.json
    """
    from llmopt import api

    print(json.dumps(api.json_schema(), indent=2))
