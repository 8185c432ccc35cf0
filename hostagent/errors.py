"""hostagent's failures beyond the shared tree (gpupin.entrypoint.errors), with `docker run`'s exit codes."""

from __future__ import annotations

from gpupin.entrypoint.errors import EX_TEMPFAIL, EX_UNAVAILABLE, GpupinError

EX_DOCKER_REFUSED = 125  # as `docker run`: the daemon refused the container (no image, bad option, conflict)
EX_CANNOT_INVOKE = 126  # as `docker run`: the command cannot be invoked
EX_NOT_FOUND = 127  # as `docker run`: the command was not found


EX_SOFTWARE = 70  # sysexits: an internal error, i.e. a bug


class InternalError(GpupinError):
    """Anything unexpected: one line like every refusal, never a bare traceback (exit 70)."""

    exit_code = EX_SOFTWARE

    def __init__(self, message: str) -> None:
        super().__init__(message, "this is a bug in hostagent: run again with --debug and report the traceback")


class CardHeldError(GpupinError):
    """The asked card is held by another pinned container, and no --wait (exit 75)."""

    exit_code = EX_TEMPFAIL


class DockerUnavailableError(GpupinError):
    """The docker SDK is missing or the Docker daemon does not answer (exit 69)."""

    exit_code = EX_UNAVAILABLE


class DockerRefusedError(GpupinError):
    """The daemon refused to create or start the container (exit 125, 126 or 127, as `docker run`)."""

    exit_code = EX_DOCKER_REFUSED

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EX_DOCKER_REFUSED) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code
