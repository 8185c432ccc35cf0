"""The record: who used which card, when, for how long and how much energy (docs/serve.md, "The record").

`store` is the SQLite file and its queries, `keeper` the agent's writer, `report` the `hostagent usage` command.
The seams other parts of the agent call are here, on the record the agent opened (`use`); without one (no agent,
or no record) they do nothing and read nothing.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.hostagent.record.keeper import Keeper

_keeper: Keeper | None = None


def use(keeper: Keeper | None) -> None:
    """The agent's record (None: none)."""
    global _keeper
    _keeper = keeper


def current() -> Keeper | None:
    return _keeper


def end_reason(container_id: str, reason: str) -> None:
    """How `container_id`'s intervals end ("expiry", "idle", "lost", "stop", "exit"), noted by whoever stops it
    before or as it stops; read when its intervals close."""
    if _keeper is not None:
        _keeper.end_reason(container_id, reason)


def note_owner(container_id: str, uid: int) -> None:
    """The caller the agent created `container_id` for: its uid at accept owns the container's intervals."""
    if _keeper is not None:
        _keeper.note_owner(container_id, uid)


def finished(uid: int, since: float) -> list[tuple[float, float]]:
    """`uid`'s closed intervals that ended after `since` (the GPU-hour quotas' past; what runs now is the
    ledger's); none without a record, or while it cannot be read (a degraded record must not refuse runs)."""
    if _keeper is None:
        return []
    try:
        return _keeper.store.finished(uid, since)
    except Exception:  # sqlite3.Error, a closed store: the record's trouble is said by its keeper
        return []


def usage(since: float | None, by: str) -> list[dict[str, Any]]:
    """Usage per `by` (user, card, image, day) since `since` (None: all): gpupin.hostagent.record.store.usage."""
    if _keeper is None:
        return []
    return _keeper.store.usage(since, by, time.time())
