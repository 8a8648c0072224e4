"""llmopt schema: the recipe's JSON Schema, for editor completion."""

from __future__ import annotations

import json

from llmopt.cli.app import app


@app.command()
def schema() -> None:
    """Print the recipe JSON Schema (always JSON).

    Examples:

        llmopt schema > recipe.schema.json
    """
    from llmopt import api

    print(json.dumps(api.json_schema(), indent=2))
