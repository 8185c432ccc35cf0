"""The daemon's and the SDK's failures turned into hostagent's one-line errors, with docker run's exit codes."""

from __future__ import annotations

import sys

from gpupin.core.errors import EX_CANNOT_INVOKE, EX_NOT_FOUND, DockerRefusedError, DockerUnavailableError, GpupinError
from gpupin.hostagent.engine.address import DAEMON_HINT, docker_host

LOG_HINT = "see the daemon's log (journalctl -u docker), then retry"  # a daemon that fails what it was asked


def _short(err: BaseException) -> str:
    text = str(getattr(err, "explanation", None) or err)
    return text.strip().splitlines()[-1] if text.strip() else type(err).__name__


def _os_error(err: BaseException, depth: int = 0) -> OSError | None:
    """The OSError under a failure to reach the daemon: the error itself, its cause, or one the SDK's layers
    (requests, urllib3) wrapped in their arguments (`('Connection aborted.', PermissionError(13, ...))`)."""
    if isinstance(err, OSError) and err.errno is not None:
        return err
    if depth > 4:
        return None
    for inner in (err.__cause__, err.__context__, *(a for a in err.args if isinstance(a, BaseException))):
        if inner is not None:
            found = _os_error(inner, depth + 1)
            if found is not None:
                return found
    return None


def _me() -> str:
    """This process's user as the kernel names it (never $USER, which a setuid or setpriv leaves as it was)."""
    import os
    import pwd

    uid = os.getuid()
    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"


def unavailable(err: BaseException) -> DockerUnavailableError:
    import errno

    found = _os_error(err)
    if found is not None and found.errno in (errno.EACCES, errno.EPERM):
        # The daemon answers; this user may not use its socket (not in the docker group). Starting dockerd would
        # not help, and the SDK's tuple of wrapped errors is no message.
        return DockerUnavailableError(
            f"the Docker daemon at {docker_host()} refused this user ({_me()}): permission denied on its socket",
            "ask the host's owner for the docker group (then log in again), or run through the resident agent, whose "
            "socket group may book for you (`hostagent serve --group`)",
        )
    why = _short(found if found is not None else err)  # `[Errno 111] Connection refused`, never the SDK's tuple
    return DockerUnavailableError(
        f"the Docker daemon at {docker_host()} does not answer: {why}",
        DAEMON_HINT + " (`docker info` says whether it answers)",
    )


def refused(err: BaseException, doing: str) -> DockerRefusedError:
    """A daemon refusal, coded as `docker run` codes it: 127 command not found, 126 not runnable, else 125."""
    text = _short(err)
    code = 125
    low = text.lower()
    if "executable file not found" in low or ("no such file or directory" in low and "exec" in low):
        code = EX_NOT_FOUND
    elif "permission denied" in low and "exec" in low:
        code = EX_CANNOT_INVOKE
    hint = {
        EX_NOT_FOUND: "check the command's name (or --entrypoint), or give its full path",
        EX_CANNOT_INVOKE: "the command must be an executable file in the image",
    }.get(code, "fix what the daemon names above; `hostagent run --dry-run` prints the equivalent docker run line")
    return DockerRefusedError(f"{doing}: {text}", hint, code)


def _status(err: BaseException) -> int | None:
    code = getattr(err, "status_code", None)
    if code is None:
        code = getattr(getattr(err, "response", None), "status_code", None)
    return int(code) if isinstance(code, int) else None


def failure(err: BaseException, doing: str) -> GpupinError:
    """Any failure of a daemon call as one line: the daemon's own errors (5xx) and a daemon that cannot be
    reached or drops the connection are 69; what it refuses (4xx) is 125, as `docker run` has it."""
    if isinstance(err, GpupinError):
        return err
    status = _status(err)
    if status is not None and status < 500:
        return refused(err, doing)
    if status is not None:
        return DockerUnavailableError(
            f"{doing}: the Docker daemon at {docker_host()} failed ({status}): {_short(err)}", LOG_HINT
        )
    return unavailable(err)


class EngineError(Exception):
    """The daemon's refusal of a call of the unix socket's client (gpupin.hostagent.engine.unix):
    its status and its message, under the names the SDK's APIError gives them."""

    def __init__(self, status_code: int, explanation: str) -> None:
        super().__init__(f"{status_code}: {explanation}")
        self.status_code = status_code
        self.explanation = explanation


def is_daemon_failure(err: BaseException) -> bool:
    """An error of the daemon or of the way to it (the SDK's, requests', urllib3's, a socket's), not a bug here."""
    return isinstance(err, (OSError, EngineError)) or type(err).__module__.split(".")[0] in (
        "docker",
        "requests",
        "urllib3",
    )


def is_api_error(err: BaseException) -> bool:
    """An answer of the daemon that refuses (rather than a daemon that cannot be reached)."""
    if isinstance(err, EngineError):
        return True
    errors = sys.modules.get("docker.errors")
    return errors is not None and isinstance(err, errors.APIError)


def is_sdk_error(err: BaseException) -> bool:
    errors = sys.modules.get("docker.errors")
    return errors is not None and isinstance(err, errors.DockerException)


class EngineNotFound(Exception):
    """A 404 from a read (the SDK raises docker.errors.NotFound)."""


def is_not_found(err: BaseException) -> bool:
    if isinstance(err, EngineNotFound) or (isinstance(err, EngineError) and err.status_code == 404):
        return True
    errors = sys.modules.get("docker.errors")  # never import the SDK just to classify an error
    return errors is not None and isinstance(err, errors.NotFound)


# Podman 4.3 answers a create whose name is taken with 500, not Docker's 409 (measured): libpod's ErrCtrExists,
# "...: that name is already in use". Docker answers 500 "name is not reserved" when the name was taken as it
# reserved it and let go before it looked up by whom (moby's reserveName: a removal between the two; seen on Engine
# 26 under 32 clients at once): the name was in use a moment ago, a conflict like any other.
_NAME_TAKEN = ("that name is already in use", "name is not reserved")


def is_conflict(err: BaseException) -> bool:
    status = _status(err)
    return status == 409 or (status == 500 and _short(err).endswith(_NAME_TAKEN))
