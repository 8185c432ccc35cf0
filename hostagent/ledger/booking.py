"""A container's booking, as its label says: who booked it (the uid the kernel named, or the uid of a run without the
agent), when, and until when (`hostagent run --for`, or the policy's default; docs/policy.md).

    gpupin.booking = "uid=1001 since=1764662400 until=1764676800"      (until absent: no end)

Written once at create (a label cannot change); an extension (`hostagent extend`) is kept by the agent in its state
file beside its socket (`bookings.json`: container id -> until), read by the agent and by `hostagent ls`. The label
is refused when set by hand (gpupin.hostagent.pin.OWNED_LABELS): through the agent it is the agent's to write."""

from __future__ import annotations

import json
import os
import re
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

LABEL = "gpupin.booking"
STATE_FILE = "bookings.json"
_FORM = re.compile(r"^uid=([0-9]{1,10}) since=([0-9]{1,12})(?: until=([0-9]{1,12}))?$")


class Booking:
    __slots__ = ("since", "uid", "until")

    def __init__(self, uid: int, since: int, until: int | None) -> None:
        self.uid = uid
        self.since = since
        self.until = until

    def label(self) -> str:
        return f"uid={self.uid} since={self.since}" + (f" until={self.until}" if self.until is not None else "")

    def to_dict(self, now: float | None = None, until: float | None = None) -> dict[str, Any]:
        """As `ls --json` and /api/ls carry it: `until` (an extension's, when given) and `left_s` (whole seconds,
        0 once past)."""
        end = until if until is not None else self.until
        now = time.time() if now is None else now
        return {
            "uid": self.uid,
            "since": self.since,
            "until": end,
            "left_s": None if end is None else max(0, int(end - now)),
        }


def format_duration(seconds: float) -> str:
    """Seconds as people read a time left: `45s`, `12m`, `1h12m`, `2d3h` (rounded down to the unit shown)."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        h, m = divmod(s // 60, 60)
        return f"{h}h{m:02d}m" if m else f"{h}h"
    d, h = divmod(s // 3600, 24)
    return f"{d}d{h}h" if h else f"{d}d"


def parse(value: str | None) -> Booking | None:
    """The label's booking; None when absent or not of its form (a hand-made label books nothing)."""
    m = _FORM.match(value or "")
    if m is None:
        return None
    return Booking(int(m[1]), int(m[2]), int(m[3]) if m[3] else None)


def of(labels: Mapping[str, str]) -> Booking | None:
    return parse(labels.get(LABEL))


def agent_folder() -> str:
    """Where the resident agent keeps its state: its socket's folder (GPUPIN_AGENT_SOCKET)."""
    from gpupin.hostagent import agentlink

    return os.path.dirname(os.path.abspath(agentlink.socket_path()))


def extend(listing: Mapping[str, Any], extensions: Mapping[str, int], now: float | None = None) -> None:
    """Each holder's booking in `listing` (an `ls` object) with its extension, and its seconds left."""
    now = time.time() if now is None else now
    for card in listing.get("gpus", ()):
        for h in card.get("holders", ()):
            b = h.get("booking")
            if b is not None:
                b["until"] = extensions.get(h["id"], b["until"])
                b["left_s"] = None if b["until"] is None else max(0, int(b["until"] - now))


def read_extensions(folder: str) -> dict[str, int]:
    """The agent's extensions (container id -> until), {} when there are none or the file cannot be read (a user
    who may not read the agent's folder sees the label's end)."""
    from gpupin.core.files import read_bounded

    try:
        data = json.loads(read_bounded(os.path.join(folder, STATE_FILE), 1 << 20))
    except (ValueError, OSError, Exception):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)}
