"""Whether a caller may book: the length of its booking and its quotas, judged under the ledger lock from the
holders just read, so that two runs of one user at once cannot both pass. The caller is who the kernel named,
never a name a request carries. What no wait can satisfy is 64, a quota used up now 75 (docs/policy.md,
"Quotas").
"""

from __future__ import annotations

import math
import time

from gpupin.core.errors import EX_TEMPFAIL, GpupinError, UsageError
from gpupin.hostagent.ledger import booking
from gpupin.hostagent.ledger.booking import Caller
from gpupin.hostagent.policy import Policy, format_duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    # A uid's finished use since a time: (start, end) of each card's interval that ended after it, from the record
    # (the agent's record: Agent.finished); the holdings add what runs now.
    Past = Callable[[int, float], Sequence[tuple[float, float]]]

    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.ledger.read import LedgerReading


NEVER = "(quota.cards)"  # ends the refusal of more cards than the quota ever allows (64), which no wait can meet


class QuotaError(GpupinError):
    """A quota used up for now (exit 75): the line names the quota, the use, and when it frees."""

    exit_code = EX_TEMPFAIL


class Holding:
    """One container's hold, as a quota counts it: whose, how many cards, since when (its start: the GPU-hours it
    adds while it runs) and when its booking ends."""

    __slots__ = ("cards", "name", "since", "uid", "until")

    def __init__(self, uid: int, cards: int, until: float | None, name: str, since: float | None = None) -> None:
        self.uid = uid
        self.cards = cards
        self.until = until
        self.name = name
        self.since = since


WINDOWS = (("day", 86400.0, "24 hours"), ("week", 7 * 86400.0, "7 days"))


def used_seconds(spans: Iterable[tuple[float, float]], live: Iterable[Holding], window: float, t: float) -> float:
    """GPU-seconds in the window (t - window, t]: the finished `spans` (one card each), and the `live` holdings as
    if they still run at t."""
    lo = t - window
    done = sum(max(0.0, min(b, t) - max(a, lo)) for a, b in spans)
    return done + sum(h.cards * max(0.0, t - max(t if h.since is None else h.since, lo)) for h in live)


def frees_at(
    spans: Sequence[tuple[float, float]], live: Sequence[Holding], window: float, limit: float, now: float
) -> float | None:
    """When the use in a rolling window first falls below `limit` (GPU-seconds), the live holdings running on
    meanwhile; None: not while they run. The use is linear between the times an edge of a span, or a holding's
    start, leaves the window: one sweep over those times (a week of a busy user is a thousand spans, looked at
    under the ledger lock), solved within the first piece that falls below."""
    slope, changes = 0.0, []  # d(use)/dt now, and (time, change of the slope) after now
    for a, b in spans:  # counts b - a until a leaves the window, then falls by 1 s a second until b has left
        for at, change in ((a + window, -1.0), (b + window, 1.0)):
            if at <= now:
                slope += change
            else:
                changes.append((at, change))
    for h in live:  # grows by its cards until its start leaves the window, then stays
        if h.since is not None and h.since + window > now:
            slope += h.cards
            changes.append((h.since + window, -float(h.cards)))
    changes.sort()
    t, use = now, used_seconds(spans, live, window, now)
    for at, change in [*changes, (now + window, 0.0)]:
        if slope < 0 and use + slope * (at - t) < limit:
            return t + (use - limit) / -slope
        use, t = use + slope * (at - t), at
        slope += change
    return None


def check(
    policy: Policy,
    caller: Caller,
    cards: int,
    holdings: Iterable[Holding],
    past: Past,
    now: float | None = None,
) -> None:
    """QuotaError (75) when `cards` more would pass a quota of the caller's; UsageError (64) when they never
    could. `past(uid, since)`: the caller's finished use (the record's); its holdings add what runs now."""
    uid = caller.uid
    if uid is None:  # quotas are a person's; a service's own label is no one's
        return
    q = policy.quota(uid, caller.gids)
    now = time.time() if now is None else now
    mine = [h for h in holdings if h.uid == uid]
    if q.cards is not None:
        if cards > q.cards:
            raise UsageError(
                f"{cards} card(s) asked, but the policy's quota lets {caller.who()} hold at most {q.cards} at once "
                + NEVER,
                f"ask for at most {q.cards}",
            )
        held = sum(h.cards for h in mine)
        if held + cards > q.cards:
            ends = sorted((h.until, h.name) for h in mine if h.until is not None)
            frees = (
                f"the first frees when {ends[0][1]} ends, in {format_duration(ends[0][0] - now)}"
                if ends
                else "it frees when one of them ends (they have no end: stop one)"
            )
            raise QuotaError(
                f"quota cards: {caller.who()} holds {held} of {q.cards} card(s) at once, and asks {cards} more; "
                + frees,
                "wait for it (--wait), or stop one of your containers",
            )
    for (name, window, said), hours in zip(WINDOWS, (q.gpu_hours_per_day, q.gpu_hours_per_week), strict=True):
        if hours is None:
            continue
        spans = [(a, b) for a, b in past(uid, now - window) if b > now - window]
        limit = hours * 3600
        used = used_seconds(spans, mine, window, now)
        if used < limit:
            continue
        at = frees_at(spans, mine, window, limit, now)
        running = ", ".join(sorted(h.name for h in mine))
        if at is None:
            frees = f"it does not free while what it holds runs ({running}): stop it first"
        else:
            end = math.ceil(at)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(end))
            frees = f"it frees in {format_duration(end - now)}, at {when}"
            if running:
                frees += f", counting {running} as running on"
        raise QuotaError(
            f"quota gpu_hours_per_{name}: {caller.who()} used {used / 3600:.1f} of {hours:g} GPU-hours in the last "
            f"{said}; {frees}",
            "wait for it (--wait), or ask the host's owner",
        )


def never(policy: Policy, caller: Caller, cards: int) -> UsageError | None:
    """The refusal (64) of a request that no wait can meet (more cards than the caller may ever hold at once)."""
    try:
        check(policy, caller, cards, (), nothing)
    except UsageError as err:
        return err
    except QuotaError:
        pass
    return None


def nothing(_uid: int, _since: float) -> list[tuple[float, float]]:
    """No finished use known: a run without the agent, which alone keeps the record (docs/policy.md, "Quotas")."""
    return []


def over(policy: Policy, caller: Caller, cards: int, holdings: Iterable[Holding], past: Past) -> str | None:
    """Why the caller may not take `cards` now (the refusal's message), or None: the queue's question."""
    try:
        check(policy, caller, cards, holdings, past)
    except GpupinError as err:
        return err.message
    return None


def started(booking_since: float, started_at: str | None) -> float:
    """When a holding began to count: its container's own start (State.StartedAt; a restarted container's last),
    else its booking's."""
    from gpupin.hostagent.engine.reads import created_time

    try:
        return max(float(booking_since), created_time(started_at)) if started_at else float(booking_since)
    except (ValueError, IndexError):
        return float(booking_since)


def since(booking_since: float | None, started_at: str | None) -> float | None:
    """`started`, for a holding that may have no booking (a granted compose service's): its container's start,
    None where not known (it counts from now)."""
    if booking_since is not None:
        return started(booking_since, started_at)
    from gpupin.hostagent.engine.reads import created_time

    try:
        return created_time(started_at) if started_at else None
    except (ValueError, IndexError):
        return None


def holdings(holders: Iterable[Holder], extensions: Mapping[str, int], owners: Mapping[str, int]) -> list[Holding]:
    """The holds among the ledger's holders whose owner is proven, each counted for the uid the agent created it
    for, or admitted it by a grant (`owners`: container id -> uid, gpupin.hostagent.ledger.owners). A booking label
    on any other container is a claim, no one's to count: anyone with the daemon's socket writes any label, and a
    compose service's own names no one."""
    return [
        Holding(
            owners[h.id],
            len(h.uuids),
            booking.ends(h.id, h.booking.until, extensions) if h.booking is not None else None,
            h.name,
            since(h.booking.since if h.booking is not None else None, h.started),
        )
        for h in holders
        if h.holds and h.id in owners
    ]


def for_run(
    policy: Policy,
    caller: Caller,
    asked: float | None,
    extensions: Mapping[str, int],
    owners: Callable[[], Mapping[str, int]],
    past: Past = nothing,
    cards: int | None = None,
) -> Callable[[LedgerReading, int], dict[str, str]]:
    """The admission of one run, for gpupin.hostagent.run.launch.reserve: the booking's length, and `cards` more
    than the caller may ever hold, are judged now (64 before any lock or wait: the same request gets the same code
    however many cards are free), the quotas under the lock with the holders just read, each counted for the uid
    the agent created it for (`owners()`, read then). `past`: the record's finished intervals (the agent's);
    without the agent, none."""
    seconds = booking.length(policy, caller, asked)
    refusal = never(policy, caller, cards) if cards else None
    if refusal is not None:
        raise refusal

    def admit(reading: LedgerReading, cards: int) -> dict[str, str]:
        check(policy, caller, cards, holdings(reading.holders, extensions, owners()), past)
        return booking.labels(caller, seconds)

    return admit
