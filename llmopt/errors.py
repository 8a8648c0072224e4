"""The one exception type users see, and the exit codes it maps to.

Library code raises; only the CLI entry point turns an error into an exit code.
Every error says what is wrong, where, and how to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_STAGE_FAILED = 1
EXIT_USAGE = 2
EXIT_GATE_FAILED = 3
EXIT_MISSING_EXTRA = 4
EXIT_INTERNAL = 70  # EX_SOFTWARE of sysexits.h: a bug in llmopt or a library, not the user's input
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, as a shell reports `cat` stopped by `| head -1`

EXIT_CODES = {
    EXIT_OK: "ok",
    EXIT_STAGE_FAILED: "a stage failed (or `llmopt verify` found changed files)",
    EXIT_USAGE: "bad usage or an invalid recipe (including a plan check that failed)",
    EXIT_GATE_FAILED: "an accuracy gate failed (the artifact and reports are written)",
    EXIT_MISSING_EXTRA: "a needed extra is not installed (checked for every stage that will run, before the first "
                        "starts), or an installed library cannot be imported",
    EXIT_INTERNAL: "internal error: an unexpected exception in llmopt or a library (a bug; "
                   "LLMOPT_DEBUG=1 shows the traceback)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
    EXIT_STDOUT_CLOSED: "stdout was closed before the output was written (a reader such as `head -1` stopped "
                        "early); llmopt stops quietly, with no traceback",
}


@dataclass
class Problem:
    """One finding about a recipe or plan: an error stops the run, a warning does not."""

    message: str
    where: str = ""  # "recipe.toml:12: compress[0].group_size" or a stage name
    hint: str = ""
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_dict(self) -> dict:
        return {"severity": self.severity, "where": self.where, "message": self.message, "hint": self.hint}


def near_name(word: str, valid) -> str:
    """`` (did you mean 'x'?)`` for a near miss of one of ``valid``, else nothing."""
    import difflib

    close = difflib.get_close_matches(word, list(valid), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def on_command_line(problems: list[Problem]) -> bool:
    """Every problem is of an option given on the command line (-s, -o, --candidate, ...), none of the recipe."""
    return all(" (command line)" in p.where for p in problems)


class LlmoptError(Exception):
    """A user-facing error: what is wrong, where, how to fix it."""

    exit_code = EXIT_STAGE_FAILED

    def __init__(self, what: str, *, where: str = "", fix: str = "", problems: list[Problem] | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        self.problems = problems or []
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.where}: {self.what}" if self.where else self.what]
        lines += [f"  {p}".replace("\n", "\n  ") for p in self.problems]
        if self.fix:
            lines.append(f"fix: {self.fix}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The ``error`` object of the command's JSON document (docs/cli.md)."""
        return {
            "type": type(self).__name__,
            "exit_code": self.exit_code,
            "what": self.what,
            "where": self.where,
            "fix": self.fix,
            "problems": [p.to_dict() for p in self.problems],
        }


class UsageError(LlmoptError):
    """Bad command-line usage or an invalid recipe."""

    exit_code = EXIT_USAGE


class RecipeError(UsageError):
    """A recipe with one or more problems; all of them are reported at once."""


class StageFailed(LlmoptError):
    exit_code = EXIT_STAGE_FAILED


class GateFailed(LlmoptError):
    exit_code = EXIT_GATE_FAILED


class MissingExtra(LlmoptError):
    """A backend needs a package that is not installed."""

    exit_code = EXIT_MISSING_EXTRA

    def __init__(self, package: str, extra: str, needed_by: str):
        super().__init__(
            f"{needed_by} needs the Python package '{package}', which is not installed",
            fix=f"pip install 'llmopt[{extra}]'",
        )
        self.package = package
        self.extra = extra


class MissingDependency(LlmoptError):
    """A library that is installed cannot be imported: a module it imports is missing or fails."""

    exit_code = EXIT_MISSING_EXTRA


class InternalError(LlmoptError):
    """An unexpected exception in llmopt or a library it runs: a bug to report, not a mistake in the input."""

    exit_code = EXIT_INTERNAL

    def __init__(self, exc: BaseException):
        super().__init__(f"internal error: {type(exc).__name__}: {exc}",
                         fix="set LLMOPT_DEBUG=1 to see the traceback, and report it with the command that failed")


class Interrupted(LlmoptError):
    """The user stopped the command (Ctrl-C)."""

    exit_code = EXIT_INTERRUPTED
