"""The agent's grants: a label (`gpupin.grant`) that the agent writes on a container it creates for a caller,
bound to the container's name, its cards, the caller's uid and an expiry, signed (HMAC-SHA256) with a key the agent
draws at start and keeps in memory, so no docker-group user can make one, and good for one create: the plugin lets
an ungranted create take no card under enforce mode `on`. A grant outlives neither its expiry nor the agent.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

LABEL = "gpupin.grant"
GRANT_S = 120.0  # from the agent's signature to the daemon's create: a run creates at once
RENDER_S = 900.0  # a rendered compose file's: from `compose render` to `docker compose up`
ANY_NAME = "*"  # a grant for whatever name the create gives (compose names its containers itself)
_FORMAT = "1"


class GrantRefused(Exception):
    """Why a grant does not admit this create, in words the user reads after `docker run`'s error."""


class Grants:
    """Issues grants and admits each once. Thread-safe: the agent's runs issue while the plugin's checks come in."""

    def __init__(self, key: bytes | None = None, ttl: float = GRANT_S) -> None:
        self._key = key if key is not None else os.urandom(32)
        self.ttl = ttl
        self._used: dict[str, float] = {}  # nonce -> expiry, until then
        self._mutex = threading.Lock()

    def _mac(self, nonce: str, expiry: int, uid: int, name: str, uuids: Iterable[str]) -> str:
        signed = "|".join((_FORMAT, nonce, str(expiry), str(uid), name, ",".join(sorted(set(uuids)))))
        return hmac.new(self._key, signed.encode(), hashlib.sha256).hexdigest()[:32]

    def issue(
        self, name: str, uuids: Iterable[str], uid: int, now: float | None = None, ttl: float | None = None
    ) -> str:
        """The label's value for a create of `name` ("" for a name the daemon picks, ANY_NAME for any) on `uuids`,
        for `uid`, good for `ttl` seconds (the Grants' own by default)."""
        expiry = int((time.time() if now is None else now) + (self.ttl if ttl is None else ttl))
        nonce = os.urandom(8).hex()
        return ".".join((_FORMAT, nonce, str(expiry), str(uid), self._mac(nonce, expiry, uid, name, uuids)))

    def admit(self, value: str, name: str, uuids: Iterable[str], now: float | None = None) -> tuple[int, bool]:
        """The uid the grant was issued for, and whether it was for any name (a rendered compose file's, whose
        quotas were not judged at a booking), once; GrantRefused says why it does not admit this create."""
        now = time.time() if now is None else now
        parts = value.split(".")
        if len(parts) != 5 or parts[0] != _FORMAT or not (parts[2].isdigit() and parts[3].isdigit()):
            raise GrantRefused(f"its {LABEL} label is not a grant of this agent's")
        _, nonce, expiry_s, uid_s, mac = parts
        expiry, uid = int(expiry_s), int(uid_s)
        uuids = list(uuids)
        named = hmac.compare_digest(mac, self._mac(nonce, expiry, uid, name, uuids))
        if not (named or hmac.compare_digest(mac, self._mac(nonce, expiry, uid, ANY_NAME, uuids))):
            raise GrantRefused(
                f"its {LABEL} label was not signed by this agent for this name and these cards "
                "(a grant is the agent's alone, for one container, and ends when the agent restarts)"
            )
        if now > expiry:
            raise GrantRefused(f"its grant expired {now - expiry:.0f}s ago")
        with self._mutex:
            for old in [n for n, until in self._used.items() if until < now]:
                del self._used[old]
            if nonce in self._used:
                raise GrantRefused("its grant was used already (a grant admits one create)")
            self._used[nonce] = expiry
        return uid, not named
