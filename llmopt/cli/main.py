"""Entry point: runs the typer app and turns errors into exit codes.

Only this module exits. Tracebacks are shown only with LLMOPT_DEBUG=1.
"""

from __future__ import annotations

import json
import os
import sys


from llmopt.cli import bench, cp, doctor, eval, gate, init, ls, plan, run, schema, serve, validate, verify  # noqa: F401  (registers commands)
from llmopt.cli.app import app
from llmopt.errors import EXIT_STAGE_FAILED, EXIT_USAGE, LlmoptError

import typer
from typer.exceptions import TyperException


def _json_mode(argv: list[str]) -> bool:
    for i, arg in enumerate(argv):
        if arg in ("--format", "-f") and i + 1 < len(argv):
            return argv[i + 1] == "json"
        if arg.startswith("--format="):
            return arg.split("=", 1)[1] == "json"
    return False


def _report(err: LlmoptError, argv: list[str]) -> None:
    if _json_mode(argv):
        sys.stdout.write(json.dumps(err.to_dict(), indent=2) + "\n")
    sys.stderr.write(f"error: {err.render()}\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("LLMOPT_DEBUG") == "1"
    try:
        app(args=argv, prog_name="llmopt", standalone_mode=False)
        return 0
    except LlmoptError as err:
        if debug:
            raise
        _report(err, argv)
        return err.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except TyperException as exc:
        exc.show()
        return EXIT_USAGE
    except (typer.Abort, KeyboardInterrupt):
        sys.stderr.write("interrupted\n")
        return 130
    except Exception as exc:  # a bug in llmopt or a library: say so, briefly
        if debug:
            raise
        sys.stderr.write(f"error: internal error: {type(exc).__name__}: {exc}\n(set LLMOPT_DEBUG=1 for the traceback)\n")
        return EXIT_STAGE_FAILED


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
