"""The agent's current policy (gpupin.hostagent.policy): read at start from --policy, read again on SIGHUP.

No file: nothing is enforced (`Policy.empty()`), and a file that appears later is read at the next SIGHUP. A file
with mistakes (or one that cannot be read) never replaces a good policy, and never leaves the host without one: on
SIGHUP the agent keeps the policy in force; at start, the last good policy it saved (a copy of each good file it
read, kept in its own folder: the record's, which outlives a reboot), and with none saved it does not start (64, one
line per mistake). Each mistake is logged once, and said in /api/agent (`policy.error`) until a good file is read,
so that `hostagent doctor` and a person reading the agent can see it (docs/policy.md, "Reloading"). A user or group
the host no longer has is a warning (gpupin.hostagent.policy), never a mistake."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time

from gpupin.core.errors import UsageError, printable
from gpupin.hostagent.policy import FILE_LIMIT, Policy, PolicyError, parse_policy, read_policy
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpupin.core import JSONObject

SAVED_FILE = "policy.last-good.toml"  # in the agent's folder: the last good policy it read


class PolicyInForce:
    """The policy in force, and what the last read of its file found."""

    def __init__(self, path: str, on_load: Callable[[Policy], None] | None = None) -> None:
        """`on_load(policy)`: each policy taken into force (the agent's hooks take its notify rule)."""
        self.path = path
        self._on_load = on_load
        self._lock = threading.Lock()
        self._policy = Policy.empty()
        self.loaded_at: float | None = None  # when the policy in force was read (None: none read, nothing enforced)
        self.error: list[str] | None = None  # the last read's mistakes, while the policy in force is an older one
        self.saved: str | None = None  # where the last good policy is kept (None: nowhere, `keep_in` not called)
        self.kept_from: str | None = None  # the saved copy in force, while the file has mistakes since the start

    def attach(self, on_load: Callable[[Policy], None]) -> None:
        """Call `on_load` for each policy taken from now on, and for the one in force now."""
        self._on_load = on_load
        on_load(self.policy)

    @property
    def policy(self) -> Policy:
        with self._lock:
            return self._policy

    def keep_in(self, directory: str) -> None:
        """Save each good policy in `directory` (the agent's own: the record's folder, else the socket's), for a
        start that finds the file with mistakes. A folder that is missing now may be made later (the record's is)."""
        self.saved = os.path.join(directory, SAVED_FILE)

    def start(self) -> None:
        """The first read. A file with mistakes (or that cannot be read) takes the last good policy saved; with none
        saved, PolicyError (64) with every mistake: an agent that enforces nothing is no fallback for a host that
        has a policy."""
        found = self._read()
        if isinstance(found, Policy) or found is None:
            return
        saved = self._saved()
        if saved is None:
            raise PolicyError(self.path, found)
        policy, at = saved
        with self._lock:
            self._policy, self.loaded_at, self.error, self.kept_from = policy, at, found, self.saved
        for m in found:
            say(f"policy: {m}")
        say(
            f"policy: {printable(self.path)} has {len(found)} mistake(s): the agent keeps the last good policy it "
            f"saved ({printable(str(self.saved))}, saved at {_clock(at)}): {policy.summary()}"
        )
        self._warn(policy)
        self._loaded(policy)

    def load(self) -> None:
        """Read the file again (SIGHUP); a bad one keeps what is in force."""
        found = self._read()
        if isinstance(found, list):
            self._refused(found)

    def _read(self) -> Policy | list[str] | None:
        """Read the file: the good policy taken into force (None: no file, nothing enforced), or its mistakes (the
        policy in force is left as it is)."""
        if not os.path.lexists(self.path):
            with self._lock:
                was = self._policy
                self._policy, self.loaded_at, self.error, self.kept_from = Policy.empty(), time.time(), None, None
            self._loaded(Policy.empty())
            if was.path is not None or was.enforced:
                say(f"policy: {printable(self.path)} is gone: nothing is enforced")
            else:
                say(f"policy: no {printable(self.path)}: nothing is enforced")
            self._forget()  # the owner's last word is "no policy": a later start keeps none
            return None
        try:
            new, text = read_policy(self.path)
        except PolicyError as err:
            return err.mistakes
        except UsageError as err:  # cannot be read
            return [err.message]
        with self._lock:
            self._policy, self.loaded_at, self.error, self.kept_from = new, time.time(), None, None
        say(f"policy: {printable(self.path)}: {new.summary()}")
        self._warn(new)
        self._save(text)
        self._loaded(new)
        return new

    def _loaded(self, policy: Policy) -> None:
        if self._on_load is not None:
            self._on_load(policy)

    @staticmethod
    def _warn(policy: Policy) -> None:
        for w in policy.warnings:
            say(f"policy: warning: {w}")

    def _refused(self, mistakes: list[str]) -> None:
        with self._lock:
            self.error = mistakes
            kept = self._policy
        for m in mistakes:
            say(f"policy: {m}")
        say(
            f"policy: {printable(self.path)} has {len(mistakes)} mistake(s): the agent keeps "
            + (f"the policy it read at {_clock(self.loaded_at, '%H:%M:%S')}" if self.loaded_at else "none")
            + (f" ({kept.summary()})" if self.loaded_at else ": nothing is enforced")
        )

    # --- the saved copy ---

    def _own_folder(self) -> str | None:
        """The saved copy's folder, when it is the agent's own (nothing another user may write is trusted)."""
        if self.saved is None:
            return None
        folder = os.path.dirname(self.saved)
        try:
            st = os.stat(folder)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return None
        return folder

    def _save(self, text: str) -> None:
        """Keep a copy of a good policy (a failure is said, and leaves the previous copy)."""
        if self._own_folder() is None or self.saved is None:
            return
        from gpupin.core.files import write_atomic

        head = self._head()
        try:
            with contextlib.suppress(FileNotFoundError):
                if _read_own(self.saved) == head + text:
                    return
            write_atomic(self.saved, (head + text).encode())
        except (OSError, UsageError) as err:
            say(f"policy: the good policy could not be saved in {printable(self.saved)}: {err}")

    def _head(self) -> str:
        """The saved copy's first line: which file it is a copy of (a copy of another file is not this one's)."""
        return f"# The last good policy the agent read, from {printable(self.path)} (docs/policy.md, Reloading).\n"

    def _saved(self) -> tuple[Policy, float] | None:
        """The last good policy saved, and when it was saved; None when there is none the agent may trust."""
        if self._own_folder() is None or self.saved is None:
            return None
        try:
            text = _read_own(self.saved)
            at = os.stat(self.saved).st_mtime
            if not text.startswith(self._head()):
                raise UsageError(f"it is the copy of another file than {printable(self.path)}")
            return parse_policy(text, self.saved), at
        except (OSError, UsageError, UnicodeDecodeError) as err:  # gone, another's, or no longer good
            if not isinstance(err, FileNotFoundError):
                say(f"policy: the saved policy {printable(self.saved)} is not used: {err}")
            return None

    def _forget(self) -> None:
        if self._own_folder() is not None and self.saved is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.saved)

    def status(self) -> JSONObject:
        """The policy as /api/agent shows it."""
        with self._lock:
            policy, loaded_at, error, kept = self._policy, self.loaded_at, self.error, self.kept_from
        return {
            "file": self.path,
            "read": policy.path is not None,
            "loaded_at": loaded_at,
            "summary": policy.summary(),
            "error": error,  # None, or the mistakes of a file that was not taken (the policy in force is older)
            "saved": kept,  # the saved copy in force, while the file has had mistakes since the start
            "warnings": list(policy.warnings),
        }


def _read_own(path: str) -> str:
    """A file of the agent's own, not a link, owned by it and written by no one else."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UsageError(f"{printable(path)} is not the agent's own regular file")
        if st.st_size > FILE_LIMIT:
            raise UsageError(f"{printable(path)} is larger than a policy")
        return os.read(fd, FILE_LIMIT + 1).decode("utf-8")
    finally:
        os.close(fd)


def _clock(at: float | None, form: str = "%Y-%m-%d %H:%M:%S") -> str:
    return time.strftime(form, time.localtime(at or 0))
