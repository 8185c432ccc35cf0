"""The ledger as the daemon has it: one list of the containers, an inspect for each that may hold a card."""

from __future__ import annotations

from gpupin.hostagent.engine.failures import EngineNotFound
from gpupin.hostagent.engine.info import info, runtimes
from gpupin.hostagent.engine.reader import fetch
from gpupin.hostagent.ledger import holders as ledger
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.ledger.holding import worth_inspecting

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card


class Book:
    """One reading of the ledger: the holders, the abandoned containers (created by a hostagent whose lease is
    dead or expired, never started), the name of every container (id -> name: whose a GPU process is) and the
    daemon's clock at the reading."""

    __slots__ = ("holders", "names", "now", "orphans")

    def __init__(self, holders: list[ledger.Holder], orphans: list[dict[str, Any]], now: float,
                 names: dict[str, str] | None = None) -> None:
        self.holders = holders
        self.orphans = orphans
        self.now = now
        self.names = names if names is not None else {}


def read_ledger(api: Any, cards: Sequence[Card], daemon_info: Mapping[str, Any] | None = None) -> Book:
    """Every container that holds a card (ledger.FORMS, ledger.holding), every pinned container that does not
    (for `ls`), and the abandoned ones. One list; an inspect for each container that may hold. `daemon_info`: the
    daemon's /info when the caller has it (else it is asked only if a container names a runtime)."""
    import time

    summaries, now = fetch(api, "/containers/json", {"all": "1"})
    now = now if now is not None else time.time()  # the Go server always sends Date; just in case
    host = ledger.Host(cards, lambda: runtimes(daemon_info if daemon_info is not None else info(api)))
    holders: list[ledger.Holder] = []
    orphans: list[dict[str, Any]] = []
    names = {str(s["Id"]): ledger.name_of(s) for s in summaries}
    for s in summaries:
        state = str(s.get("State") or "")
        labels = s.get("Labels") or {}
        lease_state = None
        if state == "created" and lease.OWNER_LABEL in labels:
            lease_state = lease.state(labels, float(s.get("Created") or 0), now)
            if lease_state != lease.LIVE:
                orphans.append(s)
        h: ledger.Holder | None
        if worth_inspecting(state, lease_state):
            try:
                h = ledger.holder(fetch(api, f"/containers/{s['Id']}/json")[0], host, lease_state)
            except EngineNotFound:
                continue  # it went away between the list and the inspect
        else:
            h = ledger.label_holder(s, cards)
        if h is not None:
            holders.append(h)
    return Book(holders, orphans, now, names)


def read_holders(api: Any, cards: Sequence[Card], daemon_info: Mapping[str, Any] | None = None
                 ) -> list[ledger.Holder]:
    """The holders of read_ledger (what `run --dry-run`, `ls` and compose read)."""
    return read_ledger(api, cards, daemon_info).holders
