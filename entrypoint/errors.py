"""The exception tree shared by both sides: each class carries the exit code DESIGN.md gives it.

A CLI catches `GpupinError`, prints `ERROR: <message>` and, when there is one, `HINT: <hint>`, and exits with
`exit_code`. Messages say what was asked and what was found; hints say what to do.

No `from __future__ import annotations` here (nor in gpupin.entrypoint, .cli, .isolation): those are imported
before the entrypoint takes the workload's paths out of sys.path, and `__future__` is a module like any other.
"""

EX_USAGE = 64  # bad usage or a malformed request / expectation
EX_UNAVAILABLE = 69  # no usable GPU (NVML or the CUDA driver), or the Docker daemon unavailable
EX_TEMPFAIL = 75  # hostagent: the card is held by another pinned container
EX_MISALIGNED = 78  # the entrypoint refuses: cuda:k is not the card that was asked for
EX_SIGNAL_BASE = 128  # a signal N stopped it before the workload started: 128 + N, as a shell reports it


def shorten(value: str, limit: int = 120) -> str:
    """`repr(value)`, cut to `limit` characters with the full length said: one refusal line stays one line that a
    person can read, even for a megabyte of environment."""
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def shown(value: str, limit: int = 120) -> str:
    """`value` as it is when it prints on one line as itself, else as `shorten` writes it."""
    return value if len(value) <= limit and value.isprintable() else shorten(value, limit)


class GpupinError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: "str | None" = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self, prog: str) -> str:
        """The refusal as every CLI prints it: one line, what was asked and found, then what to do."""
        hint = f" HINT: {self.hint}" if self.hint else ""
        return f"{prog}: ERROR: {self.message}.{hint}\n"


class UsageError(GpupinError):
    """Bad command line or malformed input (exit 64)."""

    exit_code = EX_USAGE


class ExpectationError(UsageError):
    """A malformed GPUPIN_EXPECT (or NVIDIA_VISIBLE_DEVICES / DOCKER_RESOURCE_*) value (exit 64)."""


class GpuSpecError(UsageError):
    """A GPU request that names no card, or more than one (exit 64)."""

    def __init__(self, message: str, hint: "str | None" = None, matches: "tuple[str, ...]" = ()) -> None:
        super().__init__(message, hint)
        self.matches = matches


class GpuUnavailableError(GpupinError):
    """NVML or the CUDA driver cannot be used (exit 69)."""

    exit_code = EX_UNAVAILABLE


class MisalignedError(GpupinError):
    """A cuda:k that is not the expected card, or an expected card that is not there (exit 78)."""

    exit_code = EX_MISALIGNED


class StoppedError(GpupinError):
    """A signal (docker stop's SIGTERM, Ctrl-C's SIGINT) arrived before the workload started (exit 128 + N)."""

    def __init__(self, signum: int, name: str, doing: str) -> None:
        super().__init__(f"stopped by {name} while {doing}; the workload was not started")
        self.exit_code = EX_SIGNAL_BASE + signum
