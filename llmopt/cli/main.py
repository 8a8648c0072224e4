"""Entry point: runs the typer app and turns errors into exit codes.

Only this module exits. Tracebacks are shown only with LLMOPT_DEBUG=1. With ``--format json``
it writes the command's one JSON document when the command has ended: the result, with the
error inside it when the command failed (``llmopt.output.document``; docs/cli.md).
"""

from __future__ import annotations

import errno
import os
import sys


from llmopt.cli import bench, cp, doctor, eval, gate, init, ls, plan, run, schema, serve, validate, verify  # noqa: F401  (registers commands)
from llmopt.cli import sweep  # noqa: F401  (registers the command)
from llmopt.cli import tune  # noqa: F401  (registers the command)
from llmopt.cli.app import CURRENT, click_command
from llmopt.errors import (EXIT_CODES, EXIT_INTERRUPTED, EXIT_OK, EXIT_STDOUT_CLOSED, EXIT_USAGE, InternalError,
                           Interrupted, LlmoptError, UsageError)
from llmopt.output import document, write_json

import typer
from typer.exceptions import TyperException

JSON_DOCUMENT = """\
## One JSON document

With `--format json` every command prints exactly one JSON document on stdout, whether it
succeeds or fails (`llmopt schema` always prints JSON). Logs, progress and the error in words
go to stderr.

- Success: the command's result, as each command's section describes it.
- Failure after the command computed a result (`run`, `eval` or `gate` with a failed gate,
  `plan` with a failed check, `verify` with changed files): the result's keys and `"error"`.
- Failure with no result (an invalid recipe, a failed stage, a missing extra, a bad command
  line, an internal error): `{"error": {...}}` alone.

The `error` object:

| key | what it holds |
|---|---|
| `type` | the error's class, such as `RecipeError`, `UsageError`, `StageFailed`, `GateFailed`, `VerifyFailed`, `MissingExtra`, `MissingDependency`, `InternalError`, `Interrupted` |
| `exit_code` | the process's exit code (the table below) |
| `what` | what is wrong |
| `where` | the file, line and key, or the stage (may be empty) |
| `fix` | how to fix it (may be empty) |
| `problems` | every problem found, for a recipe or plan: `severity`, `where`, `message`, `hint` |

So `doc.get("error")` tells failure from success, and `doc["error"]["exit_code"]` equals the
exit status.

`llmopt serve` writes its document (the URL and model) when it starts listening; an error
after that goes to stderr only. A closed stdout (`llmopt ls --format json | head -1`) ends
the command quietly, with no traceback, with exit code 141.
"""


def reference() -> str:
    """The output and exit-code section of docs/cli.md."""
    codes = ["| code | meaning |", "|---|---|", *(f"| {code} | {meaning} |" for code, meaning in EXIT_CODES.items())]
    version = "## llmopt --version\n\n`llmopt --version` (or `-V`) prints llmopt's version (`llmopt X.Y.Z`).\n"
    return "\n".join([version, JSON_DOCUMENT, "## Exit codes", "", *codes, ""])


def _json_mode(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        if arg in ("--format", "-f") and i + 1 < len(argv):
            return argv[i + 1] == "json"
        if arg.startswith("--format="):
            return arg.split("=", 1)[1] == "json"
    return False


def _run(argv: list[str]) -> tuple[int, LlmoptError | None]:
    """Run the command; say on stderr what went wrong; return the exit code and the error."""
    debug = os.environ.get("LLMOPT_DEBUG") == "1"
    try:
        code = click_command()(args=argv, prog_name="llmopt", standalone_mode=False)  # an int from typer.Exit (--help)
        if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C inside a command into Exit(130)
            raise KeyboardInterrupt
        return (code if isinstance(code, int) else EXIT_OK), None
    except TyperException as exc:  # the command line itself: an unknown option, a missing argument
        exc.show()
        ctx = getattr(exc, "ctx", None)
        return EXIT_USAGE, UsageError(exc.format_message(), fix=f"see `{ctx.command_path} --help`" if ctx else "")
    except SystemExit as exc:  # typer exits by itself (code 1) when it meets a closed stdout
        if isinstance(exc.__context__, OSError) and exc.__context__.errno == errno.EPIPE:
            return EXIT_STDOUT_CLOSED, None
        raise
    except (typer.Abort, KeyboardInterrupt):
        error: LlmoptError = Interrupted("interrupted")
    except LlmoptError as exc:
        if debug:
            raise
        error = exc
    except Exception as exc:  # a bug in llmopt or a library: say so, briefly
        if debug:
            raise
        error = InternalError(exc)
    sys.stderr.write(f"error: {error.render()}\n")
    return error.exit_code, error


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    token = CURRENT.set(None)
    try:
        code, error = _run(argv)
        if code == EXIT_STDOUT_CLOSED:
            return code
        out = CURRENT.get()
        if out is not None:
            out.finish(error.to_dict() if error else None)
        elif error is not None and _json_mode(argv):  # failed before the command made its sink
            write_json(document(None, error.to_dict()))
        return code
    except BrokenPipeError:  # stdout closed while the document was written
        return EXIT_STDOUT_CLOSED
    finally:
        CURRENT.reset(token)


def entry() -> None:
    code = main()
    if code == EXIT_STDOUT_CLOSED:  # nothing may reach the closed pipe when Python flushes stdout on exit
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    sys.exit(code)


if __name__ == "__main__":
    entry()
