"""Which physical cards a request gets: the cards `--uuid`/`--gpu SPEC` name (resolved by gpupin.core.resolve)
when they can be handed out, and `--count N` placement.

Pure over the cards NVML reported (gpupin.core.nvml.Card) and the set of cards the ledger says are held, so
that every rule is tested without hardware. A request that names no card, or more than one, is a GpuSpecError (64).
"""

from __future__ import annotations

from gpupin.core.errors import GpuSpecError, GpuUnavailableError
from gpupin.core.resolve import SPEC_HINT, Target, resolve, resolve_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpupin.core.nvml import Card


def _usable(target: Target, spec: str) -> Target:
    card = target.card
    if card.error is not None:
        raise GpuUnavailableError(f"{spec!r} names the card at index {card.index}, which NVML cannot read: "
                                  f"{card.error}", "see `hostagent ls`; a lost card needs a reset or a reboot")
    if target.mig is None and card.mig_mode:
        raise GpuSpecError(f"{card.uuid} ({spec!r}) is in MIG mode: ask for one of its MIG devices "
                           f"({', '.join(m.uuid for m in card.mig_devices) or 'none configured'})", SPEC_HINT)
    return target


def resolve_spec(spec: str, cards: Sequence[Card]) -> Target:
    """One `--gpu` SPEC (any form gpupin.core.resolve reads), on a card that can be handed out."""
    return _usable(resolve(spec, cards), spec)


def resolve_specs(specs: Sequence[str], cards: Sequence[Card]) -> list[Target]:
    """Every spec, in the order asked (that order is the local-rank order); a card twice is an error."""
    return [_usable(t, s) for s, t in zip(specs, resolve_all(specs, cards))]


def free_cards(cards: Sequence[Card], held: Iterable[str]) -> list[Card]:
    """Cards no one holds, best first: the most free memory, then the least utilization, then NVML order."""
    busy = set(held)
    free = [c for c in cards if c.error is None and c.uuid not in busy and not c.mig_mode
            and not any(m.uuid in busy for m in c.mig_devices)]
    return sorted(free, key=lambda c: (-(c.memory_free or 0), c.utilization_gpu or 0, c.index))


def choose_free(count: int, cards: Sequence[Card], held: Iterable[str]) -> list[Target] | None:
    """`--count N`: the N best free cards, or None when fewer than N are free."""
    if count < 1:
        raise GpuSpecError(f"--count {count}: ask for at least one card")
    usable = [c for c in cards if c.error is None and not c.mig_mode]
    if count > len(usable):
        raise GpuSpecError(f"--count {count}: this host has only {len(usable)} whole card(s)",
                           f"ask for at most {len(usable)} (`hostagent ls` lists them)")
    free = free_cards(cards, held)
    if len(free) < count:
        return None
    return [Target(c) for c in free[:count]]


def within(card: Card, max_load: float | None, max_memory: float | None) -> bool:
    """Whether a card is loaded no more than --count's limits (percent; None: no limit): its GPU utilization at
    most `max_load`, its memory used at most `max_memory` of its total. A reading NVML does not give fails a limit
    (unknown is not idle)."""
    if max_load is not None and (card.utilization_gpu is None or card.utilization_gpu > max_load):
        return False
    if max_memory is not None:
        if card.memory_used is None or not card.memory_total:
            return False
        return card.memory_used * 100 <= max_memory * card.memory_total
    return True
