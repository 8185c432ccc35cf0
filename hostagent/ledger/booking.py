"""A container's booking, as its label `gpupin.booking` says (`uid=1001 since=T until=T`): who booked it, when, and
until when. Written once at create; an extension is kept in the agent's `bookings.json`, and a compose service's
booking (`gpupin.booking.for`) runs from the container's own start (docs/policy.md, "Bookings"). A Swarm task books
nothing here: its booking is its service's, which a manager's agent ends.
"""

from __future__ import annotations

import json
import os
import re

from gpupin.core.errors import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

LABEL = "gpupin.booking"
FOR_LABEL = "gpupin.booking.for"  # a compose or swarm service's booking: its length (`4h`), from its start
SWARM_SERVICE_LABEL = "com.docker.swarm.service.id"  # on the containers of a swarm service's tasks
LONGEST_S = 366 * 86400.0  # the longest duration a policy, `--for` or a compose service may say: a year
STATE_FILE = "bookings.json"
_FORM = re.compile(r"^uid=([0-9]{1,10}) since=([0-9]{1,12})(?: until=([0-9]{1,12}))?$")


class Booking:
    __slots__ = ("since", "uid", "until")

    def __init__(self, uid: int | None, since: int, until: int | None) -> None:
        self.uid = uid
        self.since = since
        self.until = until

    def label(self) -> str:
        return f"uid={self.uid} since={self.since}" + (f" until={self.until}" if self.until is not None else "")


# --- durations --------------------------------------------------------------------------------------------------

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_PART = re.compile(r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhdw])")


def parse_duration(text: str) -> float:
    """`90m`, `4h`, `2d`, `45s`, `1w`, `1h30m`, `1.5h` -> seconds (> 0, at most a year). ValueError otherwise, with
    what is wrong (a bare number has no unit: `90` could be seconds or minutes)."""
    if not isinstance(text, str):
        raise ValueError(f"a duration is text such as 90m, 4h or 2d, not {type(text).__name__}")
    s = text.strip().lower()
    pos, total, units = 0, 0.0, []
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"{printable(text)!r} is not a duration (e.g. 45s, 90m, 4h, 2d, 1w, 1h30m)")
        if m[2] in units:
            raise ValueError(f"{printable(text)!r} names {m[2]} twice")
        units.append(m[2])
        total += float(m[1]) * _UNITS[m[2]]
        pos = m.end()
    if not units:
        raise ValueError(f"{printable(text)!r} is not a duration (e.g. 45s, 90m, 4h, 2d, 1w, 1h30m)")
    if not total > 0:
        raise ValueError(f"{printable(text)!r} is no time at all: a duration is more than 0")
    if total > LONGEST_S:
        raise ValueError(f"{printable(text)!r} is longer than a year, the longest duration")
    return total


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


def of(labels: Mapping[str, str], started: float | None = None) -> Booking | None:
    """The booking of a container with these labels: hostagent's label, else a compose service's FOR_LABEL from
    `started` (its State.StartedAt; None: not known, no booking read) as it asks (a value that is no duration: no
    end here; the agent gives it the policy's default)."""
    found = parse(labels.get(LABEL))
    asked = labels.get(FOR_LABEL)
    if found is not None or asked is None or started is None or SWARM_SERVICE_LABEL in labels:
        return found
    since = int(started)
    try:
        return Booking(None, since, since + max(1, round(parse_duration(asked))))
    except ValueError:
        return Booking(None, since, None)


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
