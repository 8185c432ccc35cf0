"""The fair queue's rule: which waiters may take a turn now, read from the agent's view. Pure: the queue
(gpupin.hostagent.serve.queue) keeps the waiters, this decides. First come, first served, and no waiter takes a
card an earlier waiter waits for, so that a `--count N` at the head is never starved by smaller requests
(docs/run.md, "--wait with the agent: a fair queue"; docs/serve.md, "The queue").
"""

from __future__ import annotations

from gpupin.core.identity import BusId
from gpupin.core.nvml import Card, MigDevice
from gpupin.core.resolve import resolve_all
from gpupin.hostagent.ls.model import CardShown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Protocol

    from gpupin.core.resolve import Target
    from gpupin.hostagent.ls.model import Listing, MigShown

    class Waiting(Protocol):
        """A waiter as the rule sees it."""

        @property
        def ask(self) -> QueueRequest: ...
        @property
        def offered(self) -> list[str] | None: ...  # the cards of the turn that is out
        @property
        def lapsed(self) -> bool: ...  # its turn lapsed: passed over until it asks again
        @property
        def cooling(self) -> bool: ...  # it asked again a moment ago: it keeps its place, but no turn yet


class QueueRequest:
    """What a waiter asks for: named cards as the user wrote them, or a count; --share; --count's limits."""

    __slots__ = ("count", "gpus", "max_load", "max_memory", "share")

    def __init__(
        self,
        gpus: Sequence[str] = (),
        count: int | None = None,
        share: bool = False,
        max_load: float | None = None,
        max_memory: float | None = None,
    ) -> None:
        self.gpus = list(gpus)
        self.count = count
        self.share = share
        self.max_load = max_load
        self.max_memory = max_memory

    def shown(self) -> str:
        """As the user asked, in run's options (`hostagent queue`'s REQUEST)."""
        words = [f"--gpu {g}" for g in self.gpus] or [f"--count {self.count}"]
        words += ["--share"] if self.share else []
        words += [f"--max-load {self.max_load:g}"] if self.max_load is not None else []
        words += [f"--max-memory {self.max_memory:g}"] if self.max_memory is not None else []
        return " ".join(words)


def cards_of(view: Listing) -> list[Card]:
    """The view's cards as NVML's, enough to resolve a spec (gpupin.core.resolve) the way `run` does."""
    out = []
    for g in view.gpus:
        card = Card(g.index, g.uuid, BusId.parse(g.bus_id) if g.bus_id else None, g.name, g.error)
        card.mig_mode = g.mig_mode
        card.mig_devices = [
            MigDevice(m.uuid, m.gpu_instance_id, m.compute_instance_id, m.name, index=m.index or 0)
            for m in g.mig_devices
        ]
        out.append(card)
    return out


def resolve(ask: QueueRequest, view: Listing) -> list[Target]:
    """The named cards, resolved against the view (a GpuSpecError, exit 64, when a spec names none)."""
    return resolve_all(ask.gpus, cards_of(view))


def _keys(t: Target) -> set[str]:
    """What waiting for a target means: the card or MIG device itself, its parent, or any of its MIG devices."""
    if t.mig is not None:
        return {t.uuid, *([t.card.uuid] if t.card.uuid else [])}
    return {t.uuid, *(m.uuid for m in t.card.mig_devices)}


def _usable(entry: CardShown | MigShown, ask: QueueRequest) -> bool:
    """Whether `run` would take this card now (gpupin.hostagent.ledger.holders.blocking): free; or, for --share,
    held only by containers that share, and used by any processes (it shares with them on purpose)."""
    state = entry.use.state
    holding = [h for h in entry.holders if h.holds] if isinstance(entry, CardShown) else []
    if state == "free" or (ask.share and state in ("shared", "busy") and all(h.shared for h in holding)):
        return True
    if ask.count is None or (ask.max_load is None and ask.max_memory is None):
        return False
    # With limits, a card only processes use is judged by its load (as `run` judges it).
    return state == "busy" and not holding and isinstance(entry, CardShown) and _within(entry, ask)


def _within(g: CardShown, ask: QueueRequest) -> bool:
    if ask.max_load is not None and (g.utilization_gpu is None or g.utilization_gpu > ask.max_load):
        return False
    if ask.max_memory is not None:
        used, total = g.memory_used_mib, g.memory_total_mib
        return used is not None and total is not None and total > 0 and used * 100 <= ask.max_memory * total
    return True


def _whole(g: CardShown) -> set[str]:
    return {*([g.uuid] if g.uuid else []), *(m.uuid for m in g.mig_devices)}


def _named(ask: QueueRequest, view: Listing, reserved: set[str]) -> tuple[list[str] | None, set[str]]:
    """(the cards to offer, or None), and the keys this waiter waits for."""
    try:
        targets = resolve(ask, view)
    except Exception:  # the view changed under a request that resolved when it joined: it waits for nothing
        return None, set()
    entries = {g.uuid: g for g in view.gpus} | {m.uuid: m for g in view.gpus for m in g.mig_devices}
    keys = set().union(*(_keys(t) for t in targets))
    ready = not (keys & reserved) and all(t.uuid in entries and _usable(entries[t.uuid], ask) for t in targets)
    return ([t.uuid for t in targets] if ready else None), keys


def _could(view: Listing) -> list[CardShown]:
    """The cards a --count could ever take: the healthy whole cards."""
    return [
        g
        for g in view.gpus
        if g.uuid and g.error is None and not g.mig_mode and g.health is not None and g.health.healthy is True
    ]


def healthy(view: Listing) -> int:
    """How many cards a --count could take at most."""
    return len(_could(view))


def still_usable(ask: QueueRequest, cards: Sequence[str], view: Listing) -> bool:
    """Whether every card of a turn is still usable for its request: a turn answered `again` (or let run out) on
    such cards was not used (an attempt on them would not have been refused)."""
    entries = {g.uuid: g for g in view.gpus} | {m.uuid: m for g in view.gpus for m in g.mig_devices}
    return bool(cards) and all(c in entries and _usable(entries[c], ask) for c in cards)


def _counted(ask: QueueRequest, view: Listing, reserved: set[str]) -> tuple[list[str] | None, set[str]]:
    assert ask.count is not None
    could = _could(view)
    if ask.count > len(could):  # more than the host has healthy: it waits for nothing, and holds back no one
        return None, set()
    usable = [g for g in could if _usable(g, ask) and not (_whole(g) & reserved)]
    # Best first, as `run --count` chooses (gpupin.hostagent.gpus.free_cards): the most free memory, the least load.
    usable.sort(key=lambda g: (-(g.memory_free_mib or 0), g.utilization_gpu or 0, g.index))
    if len(usable) >= ask.count:
        return [g.uuid or "" for g in usable[: ask.count]], set().union(*(_whole(g) for g in usable[: ask.count]))
    return None, set().union(*(_whole(g) for g in could)) if could else set()


def could_take(ask: QueueRequest, view: Listing) -> set[str]:
    """Every card (and MIG device) this request could ever take: its named cards, or for a count every healthy
    whole card."""
    if ask.count is not None:
        return set().union(*(_whole(g) for g in _could(view)))
    return _named(ask, view, set())[1]


def clear(waiters: Sequence[Waiting], n: int, view: Listing) -> bool:
    """Whether no earlier waiter than the n-th could take any card it could take: then its ledger read, at any moment,
    overtakes no one (a newcomer that is not clear waits for its turn instead)."""
    mine = could_take(waiters[n].ask, view)
    return not any(mine & could_take(w.ask, view) for w in waiters[:n] if not w.lapsed)


def grantable(waiters: Sequence[Waiting], view: Listing, taken: Iterable[str] = ()) -> dict[int, list[str]]:
    """Which waiters (by position in `waiters`, which is arrival order) may take a turn now, and the cards each is
    offered. A waiter whose turn is out is not offered another; `taken`: cards a turn has just booked, which the
    view may not show held yet."""
    reserved: set[str] = set(taken)
    out: dict[int, list[str]] = {}
    for n, w in enumerate(waiters):
        if w.lapsed:
            continue
        if w.offered is not None:
            offered = {g.uuid: g for g in view.gpus if g.uuid in w.offered}
            reserved |= set(w.offered).union(*(_whole(g) for g in offered.values()))
            continue
        if w.ask.count is not None:
            offer, keys = _counted(w.ask, view, reserved)
        else:
            offer, keys = _named(w.ask, view, reserved)
        if offer is not None and not w.cooling:
            out[n] = offer
        reserved |= keys
    return out
