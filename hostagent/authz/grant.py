"""The agent's grants: a label (`gpupin.grant`) that the agent writes on a container it creates for a caller,
bound to the container's name, its cards, the caller's uid and an expiry, signed (HMAC-SHA256) with a key the agent
draws at start and keeps in memory, so no docker-group user can make one, and good for one create: the plugin lets
an ungranted create take no card under enforce mode `on`. A grant outlives neither its expiry nor the agent. A
Swarm service's grant (issue_service) binds the service and its reservation instead, and admits its redeploys.
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
SERVICE_FORMAT = "s1"  # a Swarm service's grant: bound to the service and its reservation, not to cards


class GrantRefused(Exception):
    """Why a grant does not admit this create, in words the user reads after `docker run`'s error."""


class ServiceGrant:
    """A service grant whose signature this agent checked: for whom, what reservation (request.Reserved's text), and
    until when."""

    __slots__ = ("expiry", "nonce", "reserved", "uid")

    def __init__(self, nonce: str, expiry: int, uid: int, reserved: str) -> None:
        self.nonce = nonce
        self.expiry = expiry
        self.uid = uid
        self.reserved = reserved


class Grants:
    """Issues grants and admits each once. Thread-safe: the agent's runs issue while the plugin's checks come in."""

    def __init__(self, key: bytes | None = None, ttl: float = GRANT_S) -> None:
        self._key = key if key is not None else os.urandom(32)
        self.ttl = ttl
        self._used: dict[str, float] = {}  # nonce -> expiry, until then
        self._services: dict[str, tuple[str, float]] = {}  # a service grant's nonce -> the service it admitted
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

    # A Swarm service's grant (docs/authz.md, Swarm): Swarm picks each task's cards, so it binds no card but the
    # service (its compose key: render does not know the stack's name), its reservation, the uid and an expiry. A
    # redeploy sends the same spec again, so it admits the first service it is used for, and that service's creates
    # and updates again until it expires, never another service.

    def _service_mac(self, nonce: str, expiry: int, uid: int, key: str, reserved: str) -> str:
        signed = "|".join((SERVICE_FORMAT, nonce, str(expiry), str(uid), key, reserved))
        return hmac.new(self._key, signed.encode(), hashlib.sha256).hexdigest()[:32]

    def issue_service(
        self, key: str, reserved: str, uid: int, now: float | None = None, ttl: float | None = None
    ) -> str:
        """The label's value for the service `key` (a stack's STACK_key, or that name) reserving `reserved`."""
        expiry = int((time.time() if now is None else now) + (self.ttl if ttl is None else ttl))
        nonce = os.urandom(8).hex()
        mac = self._service_mac(nonce, expiry, uid, key, reserved)
        return ".".join((SERVICE_FORMAT, nonce, str(expiry), str(uid), reserved, mac))

    def open_service(self, value: str, key: str, now: float | None = None) -> ServiceGrant:
        """The grant in `value`, checked to be this agent's for service `key` and not expired (GrantRefused)."""
        now = time.time() if now is None else now
        parts = value.split(".")  # the reservation's text may hold dots: it is everything between uid and mac
        if len(parts) < 6 or parts[0] != SERVICE_FORMAT or not (parts[2].isdigit() and parts[3].isdigit()):
            raise GrantRefused(f"its {LABEL} label is not a service grant of this agent's")
        nonce, expiry, uid, mac, reserved = parts[1], int(parts[2]), int(parts[3]), parts[-1], ".".join(parts[4:-1])
        if not hmac.compare_digest(mac, self._service_mac(nonce, expiry, uid, key, reserved)):
            raise GrantRefused(
                f"its {LABEL} label was not signed by this agent for a service {key} reserving what it says "
                "(a grant is the agent's alone, and ends when the agent restarts)"
            )
        if now > expiry:
            raise GrantRefused(f"its grant expired {now - expiry:.0f}s ago")
        return ServiceGrant(nonce, expiry, uid, reserved)

    def spend_service(self, grant: ServiceGrant, name: str, now: float | None = None) -> None:
        """Bind `grant` to the service `name` it now admits; GrantRefused when it admitted another one."""
        now = time.time() if now is None else now
        with self._mutex:
            for old in [n for n, (_, until) in self._services.items() if until < now]:
                del self._services[old]
            bound = self._services.setdefault(grant.nonce, (name, grant.expiry))[0]
        if bound != name:
            raise GrantRefused(f"its grant admitted service {bound} already (a service grant admits one service)")
