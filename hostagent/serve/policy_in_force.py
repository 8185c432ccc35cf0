"""The agent's current policy (gpupin.hostagent.policy): read at start from --policy, read again on SIGHUP.

No file: nothing is enforced (`Policy.empty()`), and a file that appears later is read at the next SIGHUP. A file
with mistakes (or one that cannot be read) never replaces a good policy: the agent keeps the last good one, logs
each mistake once, and says so in /api/agent (`policy.error`) until a good file is read, so that `hostagent doctor`
and a person reading the agent can see it (docs/policy.md, "Reloading")."""

from __future__ import annotations

import os
import threading
import time

from gpupin.core.errors import UsageError
from gpupin.hostagent.policy import Policy, PolicyError, load_policy
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from gpupin.core import JSONObject


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

    @property
    def policy(self) -> Policy:
        with self._lock:
            return self._policy

    def load(self) -> None:
        """Read the file (at start, and on SIGHUP); a bad one keeps what is in force."""
        if not os.path.lexists(self.path):
            with self._lock:
                was = self._policy
                self._policy, self.loaded_at, self.error = Policy.empty(), time.time(), None
            self._loaded(Policy.empty())
            if was.path is not None or was.enforced:
                say(f"policy: {self.path} is gone: nothing is enforced")
            else:
                say(f"policy: no {self.path}: nothing is enforced")
            return
        try:
            new = load_policy(self.path)
        except PolicyError as err:
            self._refused(err.mistakes)
            return
        except UsageError as err:  # cannot be read
            self._refused([err.message])
            return
        with self._lock:
            self._policy, self.loaded_at, self.error = new, time.time(), None
        say(f"policy: {self.path}: {new.summary()}")
        self._loaded(new)

    def _loaded(self, policy: Policy) -> None:
        if self._on_load is not None:
            self._on_load(policy)

    def _refused(self, mistakes: list[str]) -> None:
        with self._lock:
            self.error = mistakes
            kept = self._policy
        for m in mistakes:
            say(f"policy: {m}")
        say(
            f"policy: {self.path} has {len(mistakes)} mistake(s): the agent keeps "
            + (
                f"the policy it read at {time.strftime('%H:%M:%S', time.localtime(self.loaded_at))}"
                if self.loaded_at
                else "none"
            )
            + (f" ({kept.summary()})" if self.loaded_at else ": nothing is enforced")
        )

    def status(self) -> JSONObject:
        """The policy as /api/agent shows it."""
        with self._lock:
            policy, loaded_at, error = self._policy, self.loaded_at, self.error
        return {
            "file": self.path,
            "read": policy.path is not None,
            "loaded_at": loaded_at,
            "summary": policy.summary(),
            "error": error,  # None, or the mistakes of a file that was not taken (the policy in force is older)
        }
