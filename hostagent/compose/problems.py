"""What `check` reports and `render` refuses on: one Problem type, printed one line each, for both commands.

A problem is about one service (or, with service None, the whole file). Its severity says whether `check` fails
(error) or only says it (warning); `render_fixes` marks a problem of the file *as written* (what docker compose
would do with it unrendered: a count that lands on index 0, an index, a UUID prefix) which the rendered file no
longer has, so `check` reports it and `render` does not refuse for it. `exit_code` is what `render` exits with
when it refuses: 64, or 75 when only running containers stand in the way.
"""

from __future__ import annotations

import re

from gpupin.entrypoint.errors import EX_USAGE, GpupinError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

ERROR = "error"
WARNING = "warning"
# Anything that would break "one line per problem" or a terminal: control characters (newlines included) and
# lone surrogates, which YAML's "\uD800" escape can put into a string.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """Text with control characters and lone surrogates written as escapes, so that it stays on one line."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape", "backslashreplace").decode("ascii"), text)


def shown(value: Any, limit: int = 60) -> str:
    """A value from the file as a message shows it: its repr, on one line, cut short."""
    text = printable(repr(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Problem:
    """One finding: the service it is about (None: the file), what is wrong, what to do."""

    __slots__ = ("exit_code", "hint", "problem", "render_fixes", "service", "severity")

    def __init__(self, service: str | None, problem: str, hint: str | None = None, severity: str = ERROR,
                 exit_code: int = EX_USAGE, render_fixes: bool = False) -> None:
        self.service = service
        self.problem = problem
        self.hint = hint
        self.severity = severity
        self.exit_code = exit_code
        self.render_fixes = render_fixes

    @property
    def refuses_render(self) -> bool:
        return self.severity == ERROR and not self.render_fixes

    def line(self, file: str) -> str:
        """`FILE: service NAME: [warning: ]what. HINT: what to do` (one line, whatever the file holds)."""
        where = f"{file}: service {self.service}: " if self.service is not None else f"{file}: "
        level = "warning: " if self.severity == WARNING else ""
        hint = f" HINT: {self.hint}" if self.hint else ""
        return printable(f"{where}{level}{self.problem}.{hint}")

    def to_dict(self) -> dict[str, Any]:
        return {"service": self.service, "problem": self.problem, "hint": self.hint, "severity": self.severity,
                "render_fixes": self.render_fixes}

    def __repr__(self) -> str:
        return f"Problem({self.line('-')})"


class ServiceError(GpupinError):
    """A problem raised where it is found (reading a service, loading the file), caught and reported as a Problem."""

    @classmethod
    def wrap(cls, service: str | None, err: GpupinError, prefix: str = "") -> ServiceError:
        return cls(service, prefix + err.message, err.hint, err.exit_code)

    def __init__(self, service: str | None, message: str, hint: str | None = None,
                 exit_code: int = EX_USAGE) -> None:
        super().__init__(message, hint)
        self.service = service
        self.exit_code = exit_code

    def problem(self) -> Problem:
        return Problem(self.service, self.message, self.hint, ERROR, self.exit_code)


class RenderRefused(GpupinError):
    """Every reason a render was refused; the exit code is 64 when any is a usage error, else the lowest of
    the others (69 a card NVML cannot read, 75 cards held by running containers)."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(p.problem for p in problems))
        self.problems = problems
        codes = {p.exit_code for p in problems}
        self.exit_code = EX_USAGE if EX_USAGE in codes or not codes else min(codes)
