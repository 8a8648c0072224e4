"""llmopt verify: check an artifact's files against the checksums in its manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmopt.cli.app import FormatOpt, app, sink


@app.command()
def verify(
    artifact: Annotated[Path, typer.Argument(help="Artifact folder (the one holding manifest.json).", show_default=False)],
    format: FormatOpt = "human",
) -> None:
    """Recompute every file's checksum (BLAKE3, or SHA-256 when the manifest says so) and compare with
    manifest.json: changed, missing and extra files.

    Exits 0 when the artifact is untouched, 1 when any file differs, is missing or is not
    listed, 2 when the folder has no readable manifest.json.

    Examples:

        llmopt verify artifacts/quickstart

        llmopt verify artifacts/quickstart --format json
    """
    from llmopt.store.verify import failure, verify_artifact

    out = sink(format)
    report = verify_artifact(artifact)
    out.result(report, lambda c: _show(c, report))
    if not report["ok"]:
        raise failure(report)


def _show(console, report: dict) -> None:
    if report["ok"]:
        console.print(f"[green]ok[/]: {report['artifact']}: {report['checked']} files match manifest.json "
                      f"({report['checksum']})")
        return
    for kind, colour in (("changed", "red"), ("missing", "red"), ("extra", "yellow")):
        for path in report[kind]:
            console.print(f"[{colour}]{kind}[/]: {path}")
