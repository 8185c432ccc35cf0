"""The exception tree of both sides: each class carries its exit code (docs/design.md, "Exit codes"), and a CLI
prints it as `ERROR: what was asked, what was found. HINT: what to do`. `shown` and its helpers are the one
rule for putting a user's value in such a line. No `from __future__ import annotations` here, nor in the other
modules loaded before isolation (docs/design.md, Import rules).
"""

EX_SOFTWARE = 70  # an internal error, i.e. a bug (sysexits)
EX_USAGE = 64  # bad usage or a malformed request / expectation
EX_UNAVAILABLE = 69  # no usable GPU (NVML or the CUDA driver), or the Docker daemon unavailable
EX_TEMPFAIL = 75  # hostagent: the card is held (by a container or a process), and no --wait
EX_MISALIGNED = 78  # the entrypoint refuses: cuda:k is not the card that was asked for
# gpupin-entrypoint --watch: a pinned card was lost while the workload ran, and the workload was stopped. Outside
# sysexits (64-78) and below the shell's 126/127/128+N, so a restart policy or a script tells it from the
# workload's own failures.
EX_CARD_LOST = 79
# As `docker run`: the daemon refused the container (no image, bad option, conflict); the command cannot be invoked;
# the command was not found. gpupin-entrypoint uses 126 and 127 as Docker does.
EX_DOCKER_REFUSED = 125
EX_CANNOT_INVOKE = 126
EX_NOT_FOUND = 127
EX_SIGNAL_BASE = 128  # a signal N stopped it before the workload started: 128 + N, as a shell reports it


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


class CardUnhealthyError(GpuUnavailableError):
    """The asked card is unhealthy: a critical XID, uncorrectable ECC errors, memory repair pending or failed, or
    lost (exit 69; gpupin.core.health says why)."""


class MisalignedError(GpupinError):
    """A cuda:k that is not the expected card, or an expected card that is not there (exit 78)."""

    exit_code = EX_MISALIGNED


class CardLostError(GpupinError):
    """gpupin-entrypoint --watch: NVML stopped answering, or a pinned card went away or turned unhealthy, while
    the workload ran; the workload was stopped (exit 79)."""

    exit_code = EX_CARD_LOST


class StoppedError(GpupinError):
    """A signal (docker stop's SIGTERM, Ctrl-C's SIGINT) arrived before the workload started (exit 128 + N)."""

    def __init__(self, signum: int, name: str, doing: str) -> None:
        super().__init__(f"stopped by {name} while {doing}; the workload was not started")
        self.exit_code = EX_SIGNAL_BASE + signum


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


class AgentUnavailableError(GpupinError):
    """No resident agent (`hostagent serve`) answers at the address asked (`ls --host`; exit 69)."""

    exit_code = EX_UNAVAILABLE


class AgentBusyError(GpupinError):
    """Another resident agent already listens on the socket asked for (exit 75, as a held card: try later)."""

    exit_code = EX_TEMPFAIL


class DockerRefusedError(GpupinError):
    """The daemon refused to create or start the container (exit 125, 126 or 127, as `docker run`)."""

    exit_code = EX_DOCKER_REFUSED

    def __init__(self, message: str, hint: "str | None" = None, exit_code: int = EX_DOCKER_REFUSED) -> None:
        super().__init__(message, hint)
        self.exit_code = exit_code


# --- a user's value in a message ---------------------------------------------------------------------------------

# Anything that would break "one line per message" or a terminal: control characters (newlines included) and lone
# surrogates, each mapped to its escape. A table for str.translate, made at the first use: not a regular
# expression, whose module costs every command that imports this one ~9 ms (the entrypoint, `hostagent run`).
_UNPRINTABLE = (*range(0x00, 0x20), *range(0x7F, 0xA0), *range(0xD800, 0xE000))
_ESCAPES: "dict[int, str] | None" = None
LIMIT = 120


def printable(text: str) -> str:
    """Text with control characters and lone surrogates written as escapes, so that it stays on one line."""
    global _ESCAPES
    if _ESCAPES is None:  # made whole, then published: a thread never sees half a table
        _ESCAPES = {c: chr(c).encode("unicode_escape", "backslashreplace").decode("ascii") for c in _UNPRINTABLE}
    return text.translate(_ESCAPES)


def shorten(value: object, limit: int = LIMIT) -> str:
    """`repr(value)` on one line, cut to `limit` characters with the full length said."""
    text = printable(repr(value))
    if len(text) <= limit:
        return text
    full = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return f"{text[:limit]}...{full}"


def quoted(value: object, limit: int = LIMIT) -> str:
    """A value whose type matters to the reader (a YAML scalar: `'2.4'` is not `2.4`), always as its repr."""
    return shorten(value, limit)


def shown(value: object, limit: int = LIMIT) -> str:
    """A string that prints on one line as itself is shown as itself; anything else (other types, unprintable or
    long text) as `shorten` writes it."""
    if isinstance(value, str) and len(value) <= limit and value.isprintable():
        return value
    return shorten(value, limit)
