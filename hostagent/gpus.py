"""Which physical cards a request names: `--uuid`/`--gpu SPEC` resolution and `--count N` placement.

Pure over the cards NVML reported (gpupin.entrypoint.nvml.Card) and the set of cards the ledger says are held, so that
every rule is tested without hardware. A request that names no card, or more than one, is a GpuSpecError (64).
"""

from __future__ import annotations

from gpupin.entrypoint.errors import GpuSpecError, GpuUnavailableError
from gpupin.entrypoint.identity import BusId, is_mig, is_uuid_like, looks_like_bus_id, match_uuid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpupin.entrypoint.nvml import Card, MigDevice

_SPEC_HINT = "name a card by UUID (or a unique prefix: GPU-1c5e), NVML index (0) or bus id (3b:00.0); `hostagent ls`"


class Pick:
    """One card (or MIG device) a container will get."""

    __slots__ = ("card", "mig")

    def __init__(self, card: Card, mig: MigDevice | None = None) -> None:
        self.card = card
        self.mig = mig

    @property
    def uuid(self) -> str:
        if self.mig is not None:
            return self.mig.uuid
        assert self.card.uuid is not None
        return self.card.uuid

    @property
    def bus_id(self) -> BusId:
        assert self.card.bus_id is not None
        return self.card.bus_id

    @property
    def name(self) -> str:
        return (self.mig.name if self.mig is not None and self.mig.name else self.card.name) or "?"

    def expect_entry(self) -> str:
        """This card's GPUPIN_EXPECT entry: UUID@BUSID."""
        return f"{self.uuid}@{self.bus_id}"

    def __repr__(self) -> str:
        return f"Pick({self.uuid}@{self.bus_id})"


def _usable(card: Card, spec: str) -> Card:
    if card.error is not None:
        raise GpuUnavailableError(f"{spec!r} names the card at index {card.index}, which NVML cannot read: "
                                  f"{card.error}", "see `hostagent ls`; a lost card needs a reset or a reboot")
    return card


def resolve_spec(spec: str, cards: Sequence[Card]) -> Pick:
    """Resolve one `--gpu` SPEC: a UUID or unique prefix (GPU or MIG), an NVML index, or a bus id in any form."""
    text = spec.strip()
    if not text:
        raise GpuSpecError("an empty GPU spec", _SPEC_HINT)
    if text.isdigit():
        index = int(text)
        for card in cards:
            if card.index == index:
                return Pick(_usable(card, spec))
        last = f"0-{len(cards) - 1}" if cards else "none"
        raise GpuSpecError(f"GPU index {index} is out of range: this host has {len(cards)} card(s) ({last})",
                           _SPEC_HINT)
    if is_uuid_like(text):
        if is_mig(text):
            migs = {m.uuid: (c, m) for c in cards for m in c.mig_devices}
            full = match_uuid(text, list(migs))
            card, mig = migs[full]
            return Pick(_usable(card, spec), mig)
        full = match_uuid(text, [c.uuid for c in cards if c.uuid])
        return Pick(_usable(next(c for c in cards if c.uuid == full), spec))
    if looks_like_bus_id(text):
        bus = BusId.parse(text)
        for card in cards:
            if card.bus_id == bus:
                return Pick(_usable(card, spec))
        raise GpuSpecError(f"no card at bus id {bus} (cards at: "
                           f"{', '.join(str(c.bus_id) for c in cards if c.bus_id) or 'none'})", _SPEC_HINT)
    raise GpuSpecError(f"{spec!r} is not a GPU UUID, index or bus id", _SPEC_HINT)


def resolve_specs(specs: Iterable[str], cards: Sequence[Card]) -> list[Pick]:
    """Resolve every spec, in the order asked (that order is the local-rank order); a card twice is an error."""
    picks: list[Pick] = []
    for spec in specs:
        pick = resolve_spec(spec, cards)
        if any(p.uuid == pick.uuid for p in picks):
            raise GpuSpecError(f"{spec!r} names {pick.uuid}, which this request already asked for",
                               "ask for each card once")
        if pick.mig is None and pick.card.mig_mode:
            raise GpuSpecError(f"{pick.uuid} is in MIG mode: ask for one of its MIG devices "
                               f"({', '.join(m.uuid for m in pick.card.mig_devices) or 'none configured'})",
                               _SPEC_HINT)
        picks.append(pick)
    return picks


def free_cards(cards: Sequence[Card], held: Iterable[str]) -> list[Card]:
    """Cards no one holds, best first: the most free memory, then the least utilization, then NVML order."""
    busy = set(held)
    free = [c for c in cards if c.error is None and c.uuid not in busy and not c.mig_mode
            and not any(m.uuid in busy for m in c.mig_devices)]
    return sorted(free, key=lambda c: (-(c.memory_free or 0), c.utilization_gpu or 0, c.index))


def choose_free(count: int, cards: Sequence[Card], held: Iterable[str]) -> list[Pick] | None:
    """`--count N`: the N best free cards, or None when fewer than N are free."""
    if count < 1:
        raise GpuSpecError(f"--count {count}: ask for at least one card")
    usable = [c for c in cards if c.error is None and not c.mig_mode]
    if count > len(usable):
        raise GpuSpecError(f"--count {count}: this host has only {len(usable)} whole card(s)", _SPEC_HINT)
    free = free_cards(cards, held)
    if len(free) < count:
        return None
    return [Pick(c) for c in free[:count]]
