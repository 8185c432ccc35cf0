"""The last hour of each card's load and memory, from the agent's own refresh samples (the dashboard's charts,
`GET /api/samples`).

Bounded whatever the agent's uptime: one point per STEP seconds (the mean load and the highest memory of the
refreshes in it), at most POINTS of them per card, in a ring of fixed size; a card that has not been read for
that long (gone, or its UUID unreadable) is forgotten. At 8 cards that is some 3,000 points, under a megabyte."""

from __future__ import annotations

import threading
from array import array

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.core import JSONObject
    from gpupin.hostagent.ls.model import Listing

STEP = 10.0  # seconds per point
POINTS = 360  # an hour of them
NONE = -1.0  # a reading that could not be made, in the ring's float arrays


class CardSeries:
    """One card's points: three float arrays of POINTS, filled round; `head` is the next slot to write."""

    __slots__ = ("_acc", "at", "count", "head", "load", "memory")

    def __init__(self) -> None:
        self.at = array("d", [0.0]) * POINTS  # the point's start, seconds since the epoch
        self.load = array("d", [NONE]) * POINTS  # percent, the mean of its samples
        self.memory = array("d", [NONE]) * POINTS  # MiB in use, the highest of its samples
        self.head = 0
        self.count = 0
        # The point being filled: [start, sum of load, samples with a load, highest memory].
        self._acc: list[float] = [0.0, 0.0, 0.0, NONE]

    def add(self, now: float, load: float | None, memory: float | None) -> None:
        start = now - now % STEP
        if not self.count:
            self.count = 1
            self._acc = [start, 0.0, 0.0, NONE]
        elif start != self._acc[0]:
            self._close()
            self._acc = [start, 0.0, 0.0, NONE]
        acc = self._acc
        if load is not None:
            acc[1] += load
            acc[2] += 1
        if memory is not None:
            acc[3] = max(acc[3], memory)
        self._write(self.head)

    def _write(self, slot: int) -> None:
        start, total, n, memory = self._acc
        self.at[slot] = start
        self.load[slot] = total / n if n else NONE
        self.memory[slot] = memory

    def _close(self) -> None:
        """The current point is complete: the next one takes the following slot (the oldest, once full)."""
        self.head = (self.head + 1) % POINTS
        self.count = min(self.count + 1, POINTS)

    def points(self, since: float) -> list[list[float | None]]:
        """[start, load, memory] from the oldest, those that start at `since` or later; unread values null."""
        out: list[list[float | None]] = []
        for i in range(self.count):
            slot = (self.head - self.count + 1 + i) % POINTS
            if self.at[slot] >= since:
                load, memory = self.load[slot], self.memory[slot]
                out.append(
                    [self.at[slot], None if load == NONE else round(load, 1), None if memory == NONE else memory]
                )
        return out


class Samples:
    """Per card UUID, its CardSeries; fed by the agent's refresh, read by any thread."""

    def __init__(self) -> None:
        self._rings: dict[str, CardSeries] = {}
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def add(self, listing: Listing, now: float) -> None:
        """One refresh's readings (a gather() object): each card's utilization and memory used."""
        with self._lock:
            for card in listing.gpus:
                uuid = card.uuid
                if not uuid:
                    continue
                ring = self._rings.get(uuid)
                if ring is None:
                    ring = self._rings[uuid] = CardSeries()
                ring.add(now, card.utilization_gpu, card.memory_used_mib)
                self._seen[uuid] = now
            for gone in [u for u, t in self._seen.items() if now - t > STEP * POINTS]:
                del self._rings[gone], self._seen[gone]

    def listing(self, now: float, seconds: float = STEP * POINTS) -> JSONObject:
        """The `/api/samples` object: the step, and per card UUID its points of the last `seconds`."""
        since = now - seconds
        with self._lock:
            cards = {u: r.points(since) for u, r in self._rings.items()}
        return {"step_s": STEP, "window_s": seconds, "fields": ["time", "load", "memory_mib"], "cards": cards}
