"""Which cards each service gets: the booking rule (one card, one service, unless all of them share it; never a
card a running container holds or another process uses, unless shared) and the placement of counts onto the
best free cards.

Pure over the cards (gpupin.core.nvml.Card), the requests, and the ledger's holders (card UUID -> running
holders, and the processes that no grant explains); the choice of free cards is hostagent.gpus's, as for
`hostagent run --count`.
"""

from __future__ import annotations

from gpupin.core.contract import SHARED_LABEL
from gpupin.core.errors import EX_TEMPFAIL, CardUnhealthyError, GpuSpecError
from gpupin.hostagent import gpus
from gpupin.hostagent.compose.gpurequest import KEY
from gpupin.hostagent.compose.problems import Problem
from gpupin.hostagent.ledger.holders import blocking

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpupin.core.nvml import Card
    from gpupin.core.resolve import Target
    from gpupin.hostagent.compose.gpurequest import GpuRequest
    from gpupin.hostagent.ledger.holders import Holder

_SHARE = (
    f"mark every service that shares it `{KEY}: {{share: true}}` (or, in the standard forms, label {SHARED_LABEL}=true)"
)
_RENDER_PLACES = "`hostagent compose render` places each count on a free card of its own"


class Assignment:
    """Cards given to a service: named ones, or (as_written) the first cards by index that Docker gives a count
    in the file as written, which render places elsewhere. Cards a service holds by device file are booked like
    named ones, but are no pin (pinned False: render writes no device request for them)."""

    __slots__ = ("as_written", "pinned", "req", "targets")

    def __init__(
        self, req: GpuRequest, targets: Sequence[Target], as_written: bool = False, pinned: bool = True
    ) -> None:
        self.req = req
        self.targets = list(targets)
        self.as_written = as_written
        self.pinned = pinned


def keys(target: Target) -> list[str]:
    """The UUIDs that collide with a card: its own, its parent card's (MIG) or its MIG devices' (a whole card)."""
    out = [target.uuid]
    if target.mig is not None and target.card.uuid:
        out.append(target.card.uuid)
    if target.mig is None:
        out.extend(m.uuid for m in target.card.mig_devices)
    return out


def holders_of(target: Target, busy: Mapping[str, Sequence[Holder]]) -> list[Holder]:
    found = {h.id: h for k in keys(target) for h in busy.get(k, [])}
    return list(found.values())


def whom(holders: Sequence[Holder]) -> str:
    """Who holds a card: the running containers, and the processes that use it (gpupin.hostagent.ledger.processes)."""
    containers = ", ".join(h.describe() for h in holders if not h.process)
    processes = ", ".join(h.describe() for h in holders if h.process)
    return " and ".join(
        ([f"running container {containers}"] if containers else []) + ([processes] if processes else [])
    )


def bookings(assignments: Sequence[Assignment], busy: Mapping[str, Sequence[Holder]]) -> list[Problem]:
    """Every card given to two services (not all sharing it) or held by a running container (not shared), in file
    order. A problem that involves a card given as written (a count) is one render fixes."""
    problems: list[Problem] = []
    given: dict[str, list[Assignment]] = {}
    for a in assignments:
        service = a.req.service
        lead = (
            f"as written, {a.req.describe_count()} gets "
            if a.as_written
            else ""
            if a.pinned
            else "its device file gives it "
        )
        for t in a.targets:
            prior = list({id(b): b for k in keys(t) for b in given.get(k, []) if b.req.service != service}.values())
            if prior and not (a.req.share and all(b.req.share for b in prior)):
                fixes = a.as_written or any(b.as_written for b in prior)
                others = ", ".join(
                    dict.fromkeys(b.req.service + ("" if b.pinned else " (by device file)") for b in prior)
                )
                hint = (
                    _RENDER_PLACES
                    if fixes
                    else "give each service its own card (name another, or ask for a "
                    f"`count` and let render place it), or {_SHARE}"
                )
                problems.append(
                    Problem(
                        service,
                        f"{lead}{t.describe()}{', which' if lead else ''} is also given to "
                        f"service {others}: both would run on one card",
                        hint,
                        render_fixes=fixes,
                    )
                )
            # A sharing service may join holders that share; an exclusive holder keeps its card (the ledger's rule).
            holders = holders_of(t, blocking(busy, a.req.share))
            if holders:
                who = whom(holders)
                if a.as_written:
                    problems.append(
                        Problem(
                            service,
                            f"{lead}{t.describe()}, which {who} holds",
                            _RENDER_PLACES,
                            exit_code=EX_TEMPFAIL,
                            render_fixes=True,
                        )
                    )
                else:
                    problems.append(
                        Problem(
                            service,
                            f"{t.describe()} is held by {who}",
                            "stop it, pick a free card (`hostagent ls`), ask for a `count` instead, or share it on "
                            f"purpose with {a.req.form.share_how}",
                            exit_code=EX_TEMPFAIL,
                        )
                    )
        for t in a.targets:
            given.setdefault(t.uuid, []).append(a)
    return problems


def place(
    named: Sequence[Assignment],
    counted: Sequence[GpuRequest],
    cards: Sequence[Card],
    busy: Mapping[str, Sequence[Holder]],
) -> tuple[dict[str, list[Target]], list[Problem]]:
    """The cards of every service: the named ones (checked by the booking rule; in file order, those held by
    device file too), then each count (file order) on the best cards no other service and no running container
    has. Returns the plan (the pinned cards) and every problem found."""
    problems = bookings(named, busy)
    plan = {a.req.service: a.targets for a in named if a.pinned}
    in_file = {k for a in named for t in a.targets for k in keys(t)}
    for req in counted:
        held = set(blocking(busy, req.share))
        assert req.count is not None
        try:
            chosen = gpus.choose_free(req.count, cards, held | in_file)
        except (GpuSpecError, CardUnhealthyError) as err:  # more than the host has (fit for use): "--count N: ..."
            # is hostagent run's wording
            problems.append(
                Problem(
                    req.service,
                    f"{req.describe_count()}: {err.message.split(': ', 1)[-1]}",
                    "ask for fewer cards, or split the work" if isinstance(err, GpuSpecError) else err.hint,
                    exit_code=err.exit_code,
                )
            )
            continue
        if chosen is None:
            left = len(gpus.free_cards(cards, in_file))
            if gpus.choose_free(req.count, cards, in_file) is None:
                problems.append(
                    Problem(
                        req.service,
                        f"{req.describe_count()}, but only {left} card(s) are left after the other "
                        f"services' ({', '.join(sorted(in_file)) or 'none'})",
                        "this host has too few cards for the file: lower a count or drop a service",
                    )
                )
            else:
                free = len(gpus.free_cards(cards, held | in_file))
                who = "; ".join(f"{u} by {', '.join(h.describe() for h in busy[u])}" for u in sorted(busy))
                problems.append(
                    Problem(
                        req.service,
                        f"{req.describe_count()}, but only {free} card(s) are left free by the other "
                        f"services and the running containers and processes (held: {who})",
                        "wait for the holders to finish, or stop them (`hostagent ls` shows who holds what)",
                        exit_code=EX_TEMPFAIL,
                    )
                )
            continue
        plan[req.service] = chosen
        in_file.update(k for t in chosen for k in keys(t))
    return plan, problems
