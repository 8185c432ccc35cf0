"""One finding type for every command that reports what is wrong with what a user wrote: `compose check|render`
(hostagent.compose.problems.Problem, about one service of a compose file) and `swarm node-config --check` (about
one of a node's files).

A finding says what it is about, what is wrong and what to do, and how bad it is: an error fails the command, a
warning is only said. It prints as one line whatever the input held (`WHERE: ABOUT: [warning: ]what. HINT: do`),
and as JSON for scripts.
"""

from __future__ import annotations

from gpupin.core.errors import EX_USAGE
from gpupin.core.errors import printable as printable
from gpupin.core.errors import quoted as quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.core import JSONObject

ERROR = "error"
WARNING = "warning"


class Finding:
    """One problem: what it is about (`about`: a file's path here; None: the whole input), what is wrong, what to
    do, its severity, and the exit code a command that refuses for it exits with (64 unless said)."""

    ABOUT = "path"  # the JSON key that names `about`
    __slots__ = ("about", "exit_code", "hint", "problem", "severity")

    def __init__(
        self, about: str | None, problem: str, hint: str | None = None, severity: str = ERROR, exit_code: int = EX_USAGE
    ) -> None:
        self.about = about
        self.problem = problem
        self.hint = hint
        self.severity = severity
        self.exit_code = exit_code

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    def subject(self) -> str:
        """How the line names what the finding is about."""
        return f"{self.about}: " if self.about is not None else ""

    def line(self, where: str = "") -> str:
        """`[WHERE: ]ABOUT: [warning: ]what. HINT: what to do`, on one line whatever the input held."""
        level = "warning: " if self.severity == WARNING else ""
        hint = f" HINT: {self.hint}" if self.hint else ""
        return printable(f"{where + ': ' if where else ''}{self.subject()}{level}{self.problem}.{hint}")

    def to_dict(self) -> JSONObject:
        return {self.ABOUT: self.about, "problem": self.problem, "hint": self.hint, "severity": self.severity}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.line()})"
