"""Renewing a container's lease on the daemon while its start takes long, for the clients that cannot see its
owner (gpupin.hostagent.ledger.lease): labels cannot change after a create, so the owner renews through objects it
creates, whose creation the daemon dates. A renewal is a volume named `gpupin-lease-<container>-<n>`, labelled
with the container's ID; the lease is renewed at the newest one's `CreatedAt` (the daemon's clock). Each renewal
removes the one before; the owner removes the last once the start is over, and a client that removes an abandoned
container removes its renewals with it. No volume is made for a start shorter than a third of the lease."""

from __future__ import annotations

import contextlib
import json
import threading

from gpupin.hostagent import background, engine
from gpupin.hostagent.ledger import lease

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

OF_LABEL = "gpupin.lease.of"
EVERY_S = lease.LEASE_S / 3


def _name(cid: str, n: int) -> str:
    return f"gpupin-lease-{cid[:12]}-{n}"


def _renewals(api: Any, cid: str) -> list[dict[str, Any]]:
    data, _ = engine.fetch(api, "/volumes", {"filters": json.dumps({"label": [f"{OF_LABEL}={cid}"]})})
    return list(data.get("Volumes") or [])


def renewed_at(api: Any, cid: str) -> float | None:
    """When the container's owner last renewed its lease (the daemon's clock), or None when it never did."""
    times = [engine.created_time(str(v.get("CreatedAt"))) for v in _renewals(api, cid) if v.get("CreatedAt")]
    return max(times, default=None)


def forget(api: Any, cid: str) -> None:
    """Remove the container's renewals (its start is over, or it was abandoned)."""
    for v in _renewals(api, cid):
        with contextlib.suppress(Exception):  # gone already, or in use by nothing that matters: best effort
            api.remove_volume(v["Name"], force=True)


class Renewal:
    """`with Renewal(cid, version):` around a start: renews the container's lease every EVERY_S on a thread of its
    own, then removes what it made. Its client (the SDK, in the container's API version) is made only when a start
    takes that long: a quick start costs nothing."""

    def __init__(self, cid: str, version: str) -> None:
        self.cid = cid
        self.version = version
        self._api: Any = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._made = False

    def _run(self) -> None:
        n = 0
        while not self._done.wait(EVERY_S):
            n += 1
            try:
                self._api = api = self._api or engine.connect(version=self.version)
                api.create_volume(_name(self.cid, n), labels={OF_LABEL: self.cid, **lease.claim()})
                self._made = True
                if n > 1:
                    api.remove_volume(_name(self.cid, n - 1), force=True)
            except Exception:  # a failed renewal is tried again next time; the start decides the run's fate
                continue

    def __enter__(self) -> Renewal:
        self._thread = background.start(self._run, "hostagent-lease")
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._made:
            forget(self._api, self.cid)
