"""The typer app and the option aliases every command shares."""

from __future__ import annotations

from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Optional

import typer

from llmopt.output import Output

app = typer.Typer(
    name="llmopt",
    help="Compress, evaluate, export and deploy LLMs from one declarative recipe.\n\n"
    "Start with: llmopt cp quickstart && llmopt run quickstart.toml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        import llmopt

        typer.echo(f"llmopt {llmopt.__version__}")
        raise typer.Exit()


@app.callback()
def _top(version: Annotated[bool, typer.Option("--version", "-V", callback=_print_version, is_eager=True,
                                               help="Print llmopt's version and exit.")] = False) -> None:
    pass


def click_command():
    """The click command that runs `app`, its help texts escaped for Rich: a recipe's table names in them
    (`[sweep.axes]`, `[serve].workload`, `[[eval]]`) are words, which Rich's markup would drop as unknown
    styles. docs/cli.md is made from the unescaped texts."""
    import typer.main
    from rich.markup import escape

    group = typer.main.get_command(app)
    for cmd in (group, *group.commands.values()):
        cmd.help = escape(cmd.help) if cmd.help else cmd.help
        for param in cmd.params:
            if getattr(param, "help", None):
                param.help = escape(param.help)
    return group


RecipeArg = Annotated[Path, typer.Argument(help="Recipe TOML file.", show_default=False)]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="Output: human, json (one JSON document on stdout) or quiet.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", "-s", help="Override a recipe key: -s calibration.samples=16 (repeatable).")]
CacheOpt = Annotated[Optional[Path], typer.Option("--cache-dir", help="Stage cache folder (default: $LLMOPT_CACHE or ~/.cache/llmopt).")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help=(
    "Work without the Hugging Face hub, as HF_HUB_OFFLINE=1 does: a hub model's config.json and files come from the "
    "local hub cache; plan-time checks that need a config.json not there are skipped with a warning."))]
StrictOpt = Annotated[bool, typer.Option("--strict", help=(
    "Treat every plan-time warning as an error (exit 2): e.g. calibration data that yields fewer sequences than "
    "samples asks for, or eval data from the calibration data's source."))]
OutputOpt = Annotated[Optional[Path], typer.Option("--output", "-o", help="Artifact folder (default: the recipe's output.dir or artifacts/<name>).")]


# The sink of the command now running: the entry point writes its JSON document when it ends.
CURRENT: ContextVar[Optional[Output]] = ContextVar("llmopt_output", default=None)


def sink(fmt: str) -> Output:
    """The command's output sink (every command makes one, first thing)."""
    from llmopt.errors import UsageError
    from llmopt.output import MODES

    if fmt not in MODES:
        raise UsageError(f"unknown output format {fmt!r}", fix=f"use one of: {', '.join(MODES)}")
    out = Output(fmt)
    CURRENT.set(out)
    return out
