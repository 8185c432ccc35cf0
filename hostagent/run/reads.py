"""What a run's options read beside their text: the current folder (`-v ./data`) and the files they name (env
files, seccomp profiles), read by `hostagent run` with its user's rights, or taken from what the caller sent in the
resident agent, which opens nothing for a caller. Kept apart from the options' conversions
(gpupin.hostagent.run.values) so that a run through the agent finds its folder without importing them."""

from __future__ import annotations

import contextvars
import errno
import os


class Reads:
    """What a run's options read beside their text: the current folder (relative bind sources) and the files they
    name (env files, seccomp profiles). `hostagent run` reads them itself, with its user's rights, and keeps what it
    read (`given` False); the resident agent, root, reads nothing of the caller's: it converts the same options
    against what the caller sent (`given` True), so that a path never opens a file as root
    (gpupin.hostagent.run.request_json)."""

    __slots__ = ("cwd", "files", "given")

    def __init__(self, cwd: str | None = None, files: dict[str, bytes] | None = None, given: bool = False) -> None:
        self.cwd = cwd
        self.files = {} if files is None else files
        self.given = given


class CallersOwn(Exception):
    """A check the agent leaves to the caller's own run, which makes it with the caller's rights (the walk of a
    `--device` folder): the caller runs without the agent."""


def in_the_agent() -> bool:
    """Whether the request being converted is a caller's, sent to the agent (root)."""
    r = reads.get(None)
    return r is not None and r.given


# The reads of the request being converted (a context variable: the agent converts many at once, one per thread).
reads: contextvars.ContextVar[Reads] = contextvars.ContextVar("reads")


def read_file(path: str, limit: int = 1 << 20) -> bytes:
    """A file an option names, as this process reads it, or as the caller sent it (not sent: ENOENT). Read here,
    only a regular file of at most `limit` bytes (gpupin.core.files: a FIFO or /dev/zero is refused at once, never
    waited on): OSError whose strerror says why."""
    r = reads.get(None)
    if r is not None and r.given:
        if path not in r.files:
            raise FileNotFoundError(errno.ENOENT, "not sent with the run request", path)
        return r.files[path]
    from gpupin.core import files  # only when an option names a file: run's start-up stays as it was

    try:
        data = files.read_bounded(path, limit)
    except files.FileRefused as err:
        raise OSError(err.errno or errno.EINVAL, err.reason, path) from None
    if r is not None:
        r.files[path] = data
    return data


def workdir() -> str:
    """The current folder as Go's os.Getwd gives it to the docker CLI: $PWD when it is this folder (a path through
    a symbolic link kept as the user sees it), else the physical path; the caller's, in the agent."""
    r = reads.get(None)
    if r is not None and r.cwd is not None:
        return r.cwd
    cwd = _workdir()
    if r is not None:
        r.cwd = cwd
    return cwd


def _workdir() -> str:
    pwd = os.environ.get("PWD", "")
    try:
        if os.path.isabs(pwd) and os.path.samefile(pwd, "."):
            return pwd
    except OSError:
        pass
    return os.getcwd()
