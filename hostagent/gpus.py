"""Which physical cards a request gets: the cards `--uuid`/`--gpu SPEC` name (resolved by gpupin.core.resolve)
when they can be handed out, and `--count N` placement.

Pure over the cards NVML reported (gpupin.core.nvml.Card, with the health gpupin.core.readings.assess read into
them) and the set of cards the ledger says are held, so that every rule is tested without hardware. A request that
names no card, or more than one, is a GpuSpecError (64); one that names an unhealthy card a CardUnhealthyError (69).
`--count` takes only cards known to be healthy: an unhealthy card, or one whose health NVML cannot tell, is never
chosen.
"""

from __future__ import annotations

from gpupin.core import health
from gpupin.core.errors import CardUnhealthyError, GpupinError, GpuSpecError, GpuUnavailableError
from gpupin.core.identity import is_full_uuid
from gpupin.core.resolve import SPEC_HINT, Target, resolve, resolve_all

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpupin.core.nvml import Card


def fit(card: Card) -> bool:
    """Whether `--count` may take the card: read by NVML, not in MIG mode, and (where its health was read)
    known to be healthy."""
    return card.error is None and not card.mig_mode and (card.health is None or card.health.healthy is True)


def unhealthy(cards: Sequence[Card]) -> list[Card]:
    """The cards whose health was read as bad or unknown."""
    return [c for c in cards if c.health is not None and c.health.healthy is not True]


def _usable(target: Target, spec: str) -> Target:
    card = target.card
    if card.health is not None and card.health.healthy is False:
        named = f"{card.uuid} (index {card.index})" if card.uuid else f"the card at index {card.index}"
        raise CardUnhealthyError(
            f"{spec!r} names {named}, which is unhealthy: {card.health.why}", health.hint(card.index)
        )
    if card.error is not None:
        raise GpuUnavailableError(
            f"{spec!r} names the card at index {card.index}, which NVML cannot read: {card.error}",
            "see `hostagent ls`; a lost card needs a reset or a reboot",
        )
    if target.mig is None and card.mig_mode:
        raise GpuSpecError(
            f"{card.uuid} ({spec!r}) is in MIG mode: ask for one of its MIG devices "
            f"({', '.join(m.uuid for m in card.mig_devices) or 'none configured'})",
            SPEC_HINT,
        )
    return target


def _lost_maybe(err: GpuSpecError, specs: Sequence[str], cards: Sequence[Card]) -> GpupinError:
    """A full UUID that names no card while a card is lost (NVML no longer gives its UUID): most likely that one,
    so say so (69) rather than "no such card" (64)."""
    lost = [c for c in cards if c.lost]
    known = {u.lower() for c in cards for u in (c.uuid, *(m.uuid for m in c.mig_devices)) if u}
    missing = [s for s in specs if is_full_uuid(s) and s.strip().lower() not in known]
    if not lost or not missing:
        return err
    where = ", ".join(str(c.index) for c in lost)
    return CardUnhealthyError(
        f"{missing[0]!r} names no card NVML can read, and the card at index {where} is "
        f"{health.LOST}: most likely that one",
        health.hint(lost[0].index),
    )


def resolve_spec(spec: str, cards: Sequence[Card]) -> Target:
    """One `--gpu` SPEC (any form gpupin.core.resolve reads), on a card that can be handed out."""
    try:
        target = resolve(spec, cards)
    except GpuSpecError as err:
        raise _lost_maybe(err, [spec], cards) from None
    return _usable(target, spec)


def resolve_specs(specs: Sequence[str], cards: Sequence[Card]) -> list[Target]:
    """Every spec, in the order asked (that order is the local-rank order); a card twice is an error."""
    try:
        targets = resolve_all(specs, cards)
    except GpuSpecError as err:
        raise _lost_maybe(err, specs, cards) from None
    return [_usable(t, s) for s, t in zip(specs, targets)]


def free_cards(cards: Sequence[Card], held: Iterable[str]) -> list[Card]:
    """Cards no one holds, best first: the most free memory, then the least utilization, then NVML order."""
    busy = set(held)
    free = [c for c in cards if fit(c) and c.uuid not in busy and not any(m.uuid in busy for m in c.mig_devices)]
    return sorted(free, key=lambda c: (-(c.memory_free or 0), c.utilization_gpu or 0, c.index))


def choose_free(count: int, cards: Sequence[Card], held: Iterable[str]) -> list[Target] | None:
    """`--count N`: the N best free cards, or None when fewer than N are free."""
    if count < 1:
        raise GpuSpecError(f"--count {count}: ask for at least one card")
    whole = [c for c in cards if c.error is None and not c.mig_mode]
    if count > len(whole):
        raise GpuSpecError(
            f"--count {count}: this host has only {len(whole)} whole card(s)",
            f"ask for at most {len(whole)} (`hostagent ls` lists them)",
        )
    usable = [c for c in whole if fit(c)]
    if count > len(usable):
        bad = ", ".join(f"{c.index}: {c.health.why}" for c in unhealthy(whole) if c.health is not None)
        raise CardUnhealthyError(
            f"--count {count}: only {len(usable)} of the {len(whole)} whole card(s) are fit "
            f"for use (unhealthy or of unknown health: {bad})",
            f"ask for at most {len(usable)} (`hostagent ls` says why the others are not fit)",
        )
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
