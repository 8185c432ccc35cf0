"""What `check` reports and `render` refuses on: one Problem per service (or the whole file), printed one line
each, on the finding type hostagent.findings.Finding. `render_fixes` marks a problem of the file as written that
the rendered file no longer has; `exit_code` is render's: 64, or 75 when only running containers stand in the way.
"""

from __future__ import annotations

from gpupin.core.errors import EX_USAGE, GpupinError
from gpupin.hostagent.findings import ERROR, WARNING, Finding, printable, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.core import JSONObject

__all__ = ["ERROR", "WARNING", "Problem", "RenderRefused", "ServiceError", "printable", "quoted"]


class Problem(Finding):
    """A finding about one service (None: the file): hostagent.findings.Finding, which also says whether render
    fixes it."""

    ABOUT = "service"
    __slots__ = ("render_fixes",)

    def __init__(
        self,
        service: str | None,
        problem: str,
        hint: str | None = None,
        severity: str = ERROR,
        exit_code: int = EX_USAGE,
        render_fixes: bool = False,
    ) -> None:
        super().__init__(service, problem, hint, severity, exit_code)
        self.render_fixes = render_fixes

    @property
    def service(self) -> str | None:
        return self.about

    @property
    def refuses_render(self) -> bool:
        return self.is_error and not self.render_fixes

    def subject(self) -> str:
        return f"service {self.about}: " if self.about is not None else ""

    def to_dict(self) -> JSONObject:
        return dict(super().to_dict(), render_fixes=self.render_fixes)


class ServiceError(GpupinError):
    """A problem raised where it is found (reading a service, loading the file), caught and reported as a Problem."""

    @classmethod
    def wrap(cls, service: str | None, err: GpupinError, prefix: str = "") -> ServiceError:
        return cls(service, prefix + err.message, err.hint, err.exit_code)

    def __init__(self, service: str | None, message: str, hint: str | None = None, exit_code: int = EX_USAGE) -> None:
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
