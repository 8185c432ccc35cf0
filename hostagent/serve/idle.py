"""Idle holders: a held card whose utilization has stayed at 0% for `idle_after` seconds, by the agent's samples.

One reading of NVML cannot tell idle from a pause between two batches, so `hostagent ls` alone leaves the fields
null; the agent samples every card at each refresh and keeps, per card, when its current holders' idle stretch
began. The stretch starts again when a sample shows any utilization, when the card's holders change (a new job is
not idle for its predecessor's minutes), and when utilization cannot be read (unknown is never counted as idle).
The card's utilization stands for its holders' processes: a card used by anyone else is busy, and shown so.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class IdleTracker:
    """Per card UUID: (the holders' ids, when their 0% stretch began, on the agent's monotonic clock)."""

    def __init__(self, idle_after: float) -> None:
        self.idle_after = idle_after
        self._since: dict[str, tuple[frozenset[str], float]] = {}

    def annotate(self, listing: dict[str, Any], now: float) -> None:
        """Fill each card's `idle_seconds` and `idle` in `listing` (a gather() object) from this sample."""
        seen = set()
        docker_known = bool(listing["docker"]["available"])
        for card in listing["gpus"]:
            uuid = card.get("uuid")
            holders = frozenset(h["id"] for h in card.get("holders", ()) if h.get("holds"))
            util = card.get("utilization_gpu")
            if not docker_known or not uuid or not holders or util is None or util > 0 or card.get("error"):
                # Not held (nothing to reclaim), unknown or busy: no stretch, and an unknown reading is no claim.
                known = docker_known and uuid and not card.get("error") and (not holders or util is not None)
                card["idle_seconds"] = 0.0 if known and holders else None
                card["idle"] = False if known else None
                continue
            seen.add(uuid)
            held, since = self._since.get(uuid, (holders, now))
            if held != holders:
                since = now
            self._since[uuid] = (holders, since)
            card["idle_seconds"] = int(now - since)  # whole seconds: the view changes once a second, not per sample
            card["idle"] = now - since >= self.idle_after
        for gone in set(self._since) - seen:
            del self._since[gone]
