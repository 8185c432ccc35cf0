"""Whether a caller may book: the length of its booking (--for, the policy's default and maximum) and its quotas
(cards held at once, GPU-hours per day and per week), judged under the ledger lock from the holders just read, so
that two runs of one user at once cannot both pass (docs/policy.md, "Quotas").

The caller is who the kernel named (through the agent: the identity taken at accept; without it: this process's
uid and groups), never a name a request carries. A holding counts for the uid of its booking label
(gpupin.hostagent.ledger.booking), which only hostagent writes.

Exit codes (docs/exit-codes.md): a request no wait can ever satisfy (a --for past the maximum, more cards at once
than the quota allows at all) is 64; a quota used up now (cards held, GPU-hours) is 75, as a held card: `--wait`
waits until it frees, and the agent's queue gives no turn to a waiter over its quota."""

from __future__ import annotations

import time

from gpupin.core.errors import EX_TEMPFAIL, GpupinError, UsageError
from gpupin.hostagent.ledger.booking import LABEL, Booking
from gpupin.hostagent.policy import Policy, format_duration

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping
    from typing import Any

    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.ledger.read import LedgerReading


class QuotaError(GpupinError):
    """A quota used up for now (exit 75): the line names the quota, the use, and when it frees."""

    exit_code = EX_TEMPFAIL


class Caller:
    __slots__ = ("gids", "uid")

    def __init__(self, uid: int, gids: Iterable[int]) -> None:
        self.uid = uid
        self.gids = frozenset(gids)

    @classmethod
    def me(cls) -> Caller:
        import os

        return cls(os.getuid(), {os.getgid(), *os.getgroups()})

    def who(self) -> str:
        import pwd

        try:
            return f"uid {self.uid} ({pwd.getpwuid(self.uid).pw_name})"
        except KeyError:
            return f"uid {self.uid}"


class Holding:
    """One container's hold, as a quota counts it: whose, how many cards, and when its booking ends."""

    __slots__ = ("cards", "name", "uid", "until")

    def __init__(self, uid: int, cards: int, until: float | None, name: str) -> None:
        self.uid = uid
        self.cards = cards
        self.until = until
        self.name = name


def length(policy: Policy, caller: Caller, asked: float | None) -> float | None:
    """The booking's length in seconds (None: no end): --for within the caller's maximum, else the default."""
    longest = policy.booking_max(caller.uid, caller.gids)
    if asked is None:
        return policy.booking_default(caller.uid, caller.gids)
    if longest is not None and asked > longest:
        raise UsageError(
            f"--for {format_duration(asked)} is longer than the longest booking the policy gives {caller.who()}, "
            f"{format_duration(longest)} (booking.max)",
            f"ask for at most --for {format_duration(longest)}, and `hostagent extend` later within it",
        )
    return asked


def labels(caller: Caller, seconds: float | None, now: float | None = None) -> dict[str, str]:
    """The booking label written at create."""
    since = int(time.time() if now is None else now)
    until = None if seconds is None else since + max(1, round(seconds))
    return {LABEL: Booking(caller.uid, since, until).label()}


def check(
    policy: Policy,
    caller: Caller,
    cards: int,
    holdings: Iterable[Holding],
    gpu_seconds: Callable[[int, float], float],
    now: float | None = None,
) -> None:
    """QuotaError (75) when `cards` more would pass a quota of the caller's; UsageError (64) when they never
    could. `gpu_seconds(uid, since)`: the caller's use since then (the record's)."""
    q = policy.quota(caller.uid, caller.gids)
    now = time.time() if now is None else now
    if q.cards is not None:
        if cards > q.cards:
            raise UsageError(
                f"{cards} card(s) asked, but the policy's quota lets {caller.who()} hold at most {q.cards} at once "
                "(quota.cards)",
                f"ask for at most {q.cards}",
            )
        mine = [h for h in holdings if h.uid == caller.uid]
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
    for hours, window, name in ((q.gpu_hours_per_day, 86400.0, "day"), (q.gpu_hours_per_week, 7 * 86400.0, "week")):
        if hours is None:
            continue
        used = gpu_seconds(caller.uid, now - window) / 3600
        if used >= hours:
            raise QuotaError(
                f"quota gpu_hours_per_{name}: {caller.who()} used {used:.1f} of {hours:g} GPU-hours in the last "
                f"{'24 hours' if name == 'day' else '7 days'}; it frees as that use leaves the window",
                "wait for it (--wait), or ask the host's owner",
            )


def never(policy: Policy, caller: Caller, cards: int) -> UsageError | None:
    """The refusal (64) of a request that no wait can meet (more cards than the caller may ever hold at once)."""
    try:
        check(policy, caller, cards, (), lambda _uid, _since: 0.0)
    except UsageError as err:
        return err
    except QuotaError:
        pass
    return None


def over(
    policy: Policy,
    caller: Caller,
    cards: int,
    holdings: Iterable[Holding],
    gpu_seconds: Callable[[int, float], float],
) -> str | None:
    """Why the caller may not take `cards` now (the refusal's message), or None: the queue's question."""
    try:
        check(policy, caller, cards, holdings, gpu_seconds)
    except GpupinError as err:
        return err.message
    return None


def held_seconds(uid: int, since: float, holdings: Iterable[tuple[int, int, float]], now: float | None = None) -> float:
    """GPU-seconds from what is held now ((uid, cards, held since) each): what the quotas count until the record
    (gpupin.hostagent.record) keeps the past."""
    now = time.time() if now is None else now
    return sum(n * max(0.0, now - max(start, since)) for u, n, start in holdings if u == uid)


def holdings(holders: Iterable[Holder], extensions: Mapping[str, int]) -> list[Holding]:
    """The booked holds among the ledger's holders (a container without a booking label is no one's to count)."""
    return [
        Holding(h.booking.uid, len(h.uuids), extensions.get(h.id, h.booking.until), h.name)
        for h in holders
        if h.holds and h.booking is not None
    ]


def for_run(
    policy: Policy,
    caller: Caller,
    asked: float | None,
    extensions: Mapping[str, int],
    gpu_seconds: Callable[[int, float], float] | None = None,
) -> Callable[[LedgerReading, int], dict[str, str]]:
    """The admission of one run, for gpupin.hostagent.run.launch.reserve: the booking's length is judged now (64
    before any lock or wait), the quotas under the lock with the holders just read. `gpu_seconds`: the record's;
    None: what is held now (held_seconds)."""
    seconds = length(policy, caller, asked)

    def admit(reading: LedgerReading, cards: int) -> dict[str, str]:
        held = holdings(reading.holders, extensions)
        if gpu_seconds is not None:
            used = gpu_seconds
        else:
            since = [
                (h.booking.uid, len(h.uuids), float(h.booking.since)) for h in reading.holders if h.holds and h.booking
            ]

            def used(uid: int, start: float) -> float:
                return held_seconds(uid, start, since)

        check(policy, caller, cards, held, used)
        return labels(caller, seconds)

    return admit


def view_holdings(view: Mapping[str, Any]) -> tuple[list[Holding], list[tuple[int, int, float]]]:
    """The booked holds in an `ls` object (the agent's view), and (uid, cards, since) each for held_seconds."""
    seen: dict[str, dict[str, Any]] = {}
    cards: dict[str, int] = {}
    for card in view.get("gpus", ()):
        for h in card.get("holders", ()):
            if h.get("holds") and h.get("booking") is not None:
                seen[h["id"]] = h
                cards[h["id"]] = cards.get(h["id"], 0) + 1
    held = [Holding(h["booking"]["uid"], cards[i], h["booking"]["until"], h["name"]) for i, h in seen.items()]
    since = [(h["booking"]["uid"], cards[i], float(h["booking"]["since"])) for i, h in seen.items()]
    return held, since
