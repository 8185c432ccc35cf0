"""GPU spec resolution: the one place that turns what a person, a runtime or a scheduler wrote into a card.

`hostagent run --gpu`, the ledger, compose and the entrypoint all read specs through it; the forms are in
docs/design.md, "GPU identity". Pure over the cards NVML reported (`gpupin.core.nvml.Card`); a spec that names
no card, or more than one, is a GpuSpecError (64) that says what there is.
"""

from __future__ import annotations

from gpupin.core.errors import GpuSpecError, UsageError, shorten
from gpupin.core.identity import (
    WHOLE,
    BusId,
    index_key,
    is_full_uuid,
    is_mig,
    is_uuid_like,
    match_uuid,
    mig_legacy_parts,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from gpupin.core.nvml import Card, MigDevice

SPEC_HINT = (
    "name a card by UUID (or a unique prefix: GPU-1c5e), NVML index (0), bus id (3b:00.0) or MIG device "
    "(MIG-..., or card:device like 0:1); `hostagent ls` lists them"
)

UUID = "uuid"
MIG_LEGACY = "mig-legacy"
MIG_PAIR = "mig-pair"
BUS_ID = "bus-id"
INDEX = "index"


class Target:
    """What a spec names: a whole card, or one MIG device of it."""

    __slots__ = ("card", "mig")

    def __init__(self, card: Card, mig: MigDevice | None = None) -> None:
        self.card = card
        self.mig = mig

    @property
    def uuid(self) -> str:
        """The UUID that names it to CUDA and the runtime: the MIG device's own for a MIG device."""
        if self.mig is not None:
            return self.mig.uuid
        assert self.card.uuid is not None, "a card NVML could not read has no UUID to name it by"
        return self.card.uuid

    @property
    def bus_id(self) -> BusId:
        assert self.card.bus_id is not None
        return self.card.bus_id

    @property
    def name(self) -> str:
        return (self.mig.name if self.mig is not None and self.mig.name else self.card.name) or "?"

    def describe(self) -> str:
        """How a message names it: UUID (index, bus id, name)."""
        return f"{self.uuid} (index {self.card.index}, {self.card.bus_id}, {self.name})"

    def expect_entry(self) -> str:
        """Its GPUPIN_EXPECT entry: UUID@BUSID."""
        return f"{self.uuid}@{self.bus_id}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Target) and (self.card.index, self.mig and self.mig.uuid) == (
            other.card.index,
            other.mig and other.mig.uuid,
        )

    def __hash__(self) -> int:
        return hash((self.card.index, self.mig and self.mig.uuid))

    def __repr__(self) -> str:
        return f"Target({self.uuid}@{self.card.bus_id})"


def form(spec: str) -> str | None:
    """Which form a spec is written in (UUID, MIG_LEGACY, MIG_PAIR, BUS_ID, INDEX), or None for none of them.

    Order matters: `0:1` is a MIG index pair (decimal, no function), `3b:00.0` a bus id, `12` an index.
    """
    t = spec.strip()
    if mig_legacy_parts(t) is not None:
        return MIG_LEGACY
    if is_uuid_like(t):
        return UUID
    key = index_key(t)
    if key is not None:
        return INDEX if key[1] == WHOLE else MIG_PAIR
    if ":" in t and t.isascii():
        return BUS_ID
    return None


def _listing(cards: Sequence[Card]) -> str:
    return ", ".join(f"{c.index} = {c.uuid or '?'} at {c.bus_id or '?'}" for c in cards) or "none"


def _by_index(index: int, cards: Sequence[Card], spec: str) -> Card:
    for card in cards:
        if card.index == index:
            return card
    within = "" if spec.strip() == str(index) else f" (in {shorten(spec)})"
    raise GpuSpecError(
        f"GPU index {index}{within} is out of range: this host has {len(cards)} card(s) ({_listing(cards)})", SPEC_HINT
    )


def _mig_by_uuid(spec: str, cards: Sequence[Card]) -> Target:
    migs = {m.uuid: (c, m) for c in cards for m in c.mig_devices}
    if not migs:
        raise GpuSpecError(
            f"{shorten(spec)} names a MIG device, but no card here has MIG devices (cards: {_listing(cards)})",
            SPEC_HINT,
        )
    card, mig = migs[match_uuid(spec, list(migs))]
    return Target(card, mig)


def _mig_legacy(spec: str, cards: Sequence[Card]) -> Target:
    parts = mig_legacy_parts(spec)
    assert parts is not None
    parent, gi, ci = parts
    for card in cards:
        if card.uuid is not None and card.uuid.lower() == parent.lower():
            for mig in card.mig_devices:
                if (mig.gpu_instance_id, mig.compute_instance_id) == (gi, ci):
                    return Target(card, mig)
            have = ", ".join(f"{m.gpu_instance_id}/{m.compute_instance_id}" for m in card.mig_devices) or "none"
            raise GpuSpecError(
                f"{card.uuid} has no MIG device with GPU instance {gi} and compute instance {ci} (it has: {have})",
                SPEC_HINT,
            )
    raise GpuSpecError(
        f"no card with UUID {parent} (in {shorten(spec)}) on this host (cards: {_listing(cards)})", SPEC_HINT
    )


def _mig_pair(spec: str, cards: Sequence[Card]) -> Target:
    key = index_key(spec.strip())
    assert key is not None
    card = _by_index(key[0], cards, spec)
    j = key[1]
    for mig in card.mig_devices:
        if mig.index == j:
            return Target(card, mig)
    what = "is not in MIG mode" if not card.mig_mode else f"has {len(card.mig_devices)} MIG device(s)"
    raise GpuSpecError(
        f"{shorten(spec)} asks for MIG device {j} of card {card.index} ({card.uuid}), which {what}", SPEC_HINT
    )


def _by_bus(spec: str, cards: Sequence[Card]) -> Target:
    try:
        bus = BusId.parse(spec)
    except UsageError as err:
        raise GpuSpecError(err.message, err.hint) from None
    for card in cards:
        if card.bus_id == bus:
            return Target(card)
    raise GpuSpecError(f"no card at bus id {bus} (cards: {_listing(cards)})", SPEC_HINT)


def resolve(spec: str, cards: Sequence[Card]) -> Target:
    """The card (or MIG device) one spec names, in any form but a minor number; GpuSpecError otherwise."""
    kind = form(spec)
    text = spec.strip()
    if kind == UUID:
        if is_mig(text):
            return _mig_by_uuid(text, cards)
        full = match_uuid(text, [c.uuid for c in cards if c.uuid])
        return Target(next(c for c in cards if c.uuid == full))
    if kind == MIG_LEGACY:
        return _mig_legacy(text, cards)
    if kind == INDEX:
        return Target(_by_index(int(text), cards, spec))
    if kind == MIG_PAIR:
        return _mig_pair(text, cards)
    if kind == BUS_ID:
        return _by_bus(text, cards)
    if not text:
        raise GpuSpecError("an empty GPU spec", SPEC_HINT)
    if text[:4].upper() in ("GPU-", "MIG-") and not is_full_uuid(text):
        raise GpuSpecError(
            f"{shorten(spec)} is not a GPU UUID or a prefix of one (hex digits after the tag)", SPEC_HINT
        )
    raise GpuSpecError(f"{shorten(spec)} is not a GPU UUID, index, bus id or MIG device", SPEC_HINT)


def resolve_all(specs: Iterable[str], cards: Sequence[Card]) -> list[Target]:
    """Every spec, in the order given (the local-rank order); a card or MIG device named twice is an error."""
    targets: list[Target] = []
    for spec in specs:
        target = resolve(spec, cards)
        if target in targets:
            raise GpuSpecError(
                f"{shorten(spec)} names {target.uuid}, which is already asked for", "ask for each card once"
            )
        targets.append(target)
    return targets


def by_minor(minor: int, cards: Sequence[Card]) -> Target:
    """The card whose device file is /dev/nvidia<minor> (device files, Slurm's SLURM_STEP_GPUS)."""
    for card in cards:
        if card.minor_number == minor:
            return Target(card)
    have = ", ".join(f"{c.index} = /dev/nvidia{c.minor_number}" for c in cards if c.minor_number is not None)
    raise GpuSpecError(
        f"no card has the minor number {minor} (/dev/nvidia{minor}; cards: {have or 'none known'})",
        "check the device files with `ls -l /dev/nvidia[0-9]*` and `nvidia-smi -q | grep Minor`",
    )
