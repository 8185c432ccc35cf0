"""Bookings' rules, in one place: what a booking label says (`gpupin.booking`: `uid=1001 since=T until=T`), how
long a booking may be under the policy, when it ends, and how far it may be extended. The label is written once at
create; an extension is kept in the agent's `bookings.json`, and a compose service's booking (`gpupin.booking.for`)
runs from the container's own start (docs/policy.md, "Bookings"). A Swarm task books nothing here: its booking is
its service's, which a manager's agent ends. The agent's part (the thread that ends bookings, POST /api/extend)
is gpupin.hostagent.serve.bookings.
"""

from __future__ import annotations

import json
import os
import re
import time

from gpupin.core.errors import UsageError, printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Protocol, TypeVar

    End = TypeVar("End", int, float)  # a label's end is whole seconds; a listed one may be a float

    class Rules(Protocol):
        """The policy's part that bookings read (gpupin.hostagent.policy.Policy): the ledger sits below it."""

        def booking_max(self, uid: int | None, gids: frozenset[int]) -> float | None: ...

        def booking_default(self, uid: int | None, gids: frozenset[int]) -> float | None: ...


LABEL = "gpupin.booking"
FOR_LABEL = "gpupin.booking.for"  # a compose or swarm service's booking: its length (`4h`), from its start
SWARM_SERVICE_LABEL = "com.docker.swarm.service.id"  # on the containers of a swarm service's tasks
LONGEST_S = 366 * 86400.0  # the longest duration a policy, `--for` or a compose service may say: a year
STATE_FILE = "bookings.json"
# The ends the agent gave the bookings it did not make (a claim's, a compose service's own), by the policy in force:
# what `ls` without the agent shows, where the label alone would say more.
JUDGED_FILE = "judged.json"
_FORM = r"^uid=([0-9]{1,10}) since=([0-9]{1,12})(?: until=([0-9]{1,12}))?$"


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
_PART = r"([0-9]{1,9}(?:\.[0-9]{1,6})?)([smhdw])"


def parse_duration(text: str) -> float:
    """`90m`, `4h`, `2d`, `45s`, `1w`, `1h30m`, `1.5h` -> seconds (> 0, at most a year). ValueError otherwise, with
    what is wrong (a bare number has no unit: `90` could be seconds or minutes)."""
    if not isinstance(text, str):
        raise ValueError(f"a duration is text such as 90m, 4h or 2d, not {type(text).__name__}")
    s = text.strip().lower()
    if s.startswith("-") and re.compile(_PART).match(s, 1):  # `--for -5m`: said as what it is, not as unreadable
        raise ValueError(f"{printable(text)!r} is negative: a duration is more than 0 (e.g. 45s, 90m, 4h)")
    pos, total, units = 0, 0.0, []
    while pos < len(s):
        m = re.compile(_PART).match(s, pos)
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
    m = re.match(_FORM, value or "")
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


def read_judged(folder: str) -> dict[str, int | None]:
    """The ends the agent judged (container id -> until, None: no end), {} when there are none, the file cannot be
    read, or it or its folder could have been written by another user than root (gpupin.hostagent.ledger.owners)."""
    from gpupin.core.files import read_bounded
    from gpupin.hostagent.ledger.owners import trusted

    path = os.path.join(folder, JUDGED_FILE)
    try:
        if not trusted(os.stat(folder)) or not trusted(os.lstat(path)):
            return {}
        data = json.loads(read_bounded(path, 1 << 22))
    except Exception:  # absent, unreadable, not JSON: the labels' own ends
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: v
        for k, v in data.items()
        if isinstance(k, str) and (v is None or (isinstance(v, int) and not isinstance(v, bool)))
    }


# --- who books, and for how long ----------------------------------------------------------------------------------


class Caller:
    """Who asks: the uid and groups the kernel named; uid None is no one it named (a compose or swarm service's
    own label, gpupin.booking.for: the policy's rules for everyone apply)."""

    __slots__ = ("gids", "uid")

    def __init__(self, uid: int | None, gids: Iterable[int]) -> None:
        self.uid = uid
        self.gids = frozenset(gids)

    @classmethod
    def me(cls) -> Caller:
        return cls(os.getuid(), {os.getgid(), *os.getgroups()})

    def who(self) -> str:
        import pwd

        if self.uid is None:
            return "everyone (a service's own label names no one)"
        try:
            return f"uid {self.uid} ({pwd.getpwuid(self.uid).pw_name})"
        except KeyError:
            return f"uid {self.uid}"


NO_ONE = Caller(None, ())  # a service's own label: no one the kernel named


def length(policy: Rules, caller: Caller, asked: float | None, key: str = "--for") -> float | None:
    """The booking's length in seconds (None: no end): `key` (--for, x-gpupin.for) within the caller's maximum,
    else the default."""
    longest = policy.booking_max(caller.uid, caller.gids)
    if asked is None:
        return policy.booking_default(caller.uid, caller.gids)
    if longest is not None and asked > longest:
        later = ", and `hostagent extend` later within it" if caller.uid is not None else ""
        raise UsageError(
            f"{key} {format_duration(asked)} is longer than the longest booking the policy gives {caller.who()}, "
            f"{format_duration(longest)} (booking.max)",
            f"ask for at most {key} {format_duration(longest)}{later}",
        )
    return asked


def label_length(policy: Rules, asked: float | None) -> float | None:
    """The length of a running container's own booking (gpupin.booking.for; None: a value that is no duration), by
    run's rule for everyone (length). The container runs already, so what run would refuse is cut to the maximum,
    and a value that cannot be read books the default, else the maximum: a label never escapes the policy."""
    try:
        got = length(policy, NO_ONE, asked)
    except UsageError:
        got = None
    return got if got is not None else policy.booking_max(None, frozenset())


def labels(caller: Caller, seconds: float | None, now: float | None = None) -> dict[str, str]:
    """The booking label written at create (by hostagent run, for a caller the kernel named)."""
    assert caller.uid is not None
    since = int(time.time() if now is None else now)
    until = None if seconds is None else since + max(1, round(seconds))
    return {LABEL: Booking(caller.uid, since, until).label()}


# --- when it ends, and extending it -------------------------------------------------------------------------------


def ends(cid: str, until: End | None, extensions: Mapping[str, int]) -> End | int | None:
    """When a container's booking ends: its extension's end, else its label's (`until`; None: no end)."""
    return extensions.get(cid, until)


def left_s(until: float | None, now: float) -> int | None:
    """The whole seconds a booking has left (None: no end)."""
    return None if until is None else max(0, int(until - now))


def extended(
    name: str,
    uid: int | None,
    since: float,
    until: float | None,
    seconds: float,
    caller: Caller,
    policy: Rules,
    claimed: int | None = None,
) -> int:
    """The new end of a booking (its owner `uid`, the one the agent proves; `since`, its end now `until`) that
    `caller` extends by `seconds`: only its owner or root extends it (no owner proven: root alone), a booking with no
    end is not extended, and the booking stays within the longest the policy gives the caller (booking.max).
    `name`: the container, as the refusals say it; `claimed`: the uid its label names where none is proven."""
    if uid is None and claimed is not None and caller.uid != 0:
        raise UsageError(
            f"{name}'s label names uid {claimed}, but the agent did not create it: its owner is unverified, and only "
            "root extends it",
            "extend the bookings the agent made for you (hostagent run through the agent)",
        )
    if uid is None and caller.uid != 0:
        raise UsageError(
            f"{name} is booked by its own label ({FOR_LABEL}), which names no owner: only root extends it",
            "ask the host's owner, or start it again with a longer x-gpupin.for",
        )
    if caller.uid not in (0, uid):
        raise UsageError(
            f"{name} is booked by uid {uid}: only its owner or root extends it", "extend your own bookings"
        )
    if until is None:
        raise UsageError(f"{name}'s booking has no end: there is nothing to extend", "it runs until it stops")
    new = int(max(until, time.time()) + round(seconds))
    longest = policy.booking_max(caller.uid, caller.gids)
    if longest is not None and new - since > longest:
        raise UsageError(
            f"extending {name} by {format_duration(seconds)} makes its booking "
            f"{format_duration(new - since)} long, past the longest the policy gives uid {caller.uid}, "
            f"{format_duration(longest)} (booking.max)",
            f"extend by at most {format_duration(max(0, longest - (until - since)))}",
        )
    return new
