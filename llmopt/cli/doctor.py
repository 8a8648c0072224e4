"""llmopt doctor: what this machine has: torch, CUDA, GPUs, extras, engines."""

from __future__ import annotations

from llmopt.cli.app import FormatOpt, app, sink


@app.command()
def doctor(format: FormatOpt = "human") -> None:
    """Report torch and CUDA, GPUs, installed extras and serving engines found on PATH.

    Examples:

        llmopt doctor

        llmopt doctor --format json
    """
    from llmopt import api

    out = sink(format)
    report = api.doctor()
    out.result(report, lambda c: _show(c, report))


def _show(console, report) -> None:
    console.print(f"python {report['python']} on {report['platform']}")
    console.print(f"torch {report['torch'] or 'not installed'}; CUDA {report['cuda'] or 'not available'}")
    for gpu in report["gpus"]:
        console.print(f"  GPU {gpu['name']} (CC {gpu['cc']}, {gpu['memory_gib']} GiB)")
    for extra, dists in report["extras"].items():
        have = ", ".join(f"{d} {v}" if v else f"[dim]{d} missing[/]" for d, v in dists.items())
        console.print(f"extra [bold]{extra}[/]: {have}")
    for engine, path in report["engines"].items():
        console.print(f"engine {engine}: {path or '[dim]not on PATH[/]'}")
