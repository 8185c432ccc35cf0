"""Alignment: which card each `cuda:k` must be, the CUDA_VISIBLE_DEVICES that makes it so, and the proof.

Pure logic over what NVML and the CUDA driver reported; no driver calls here, so the tests pin every refusal
without hardware. `plan()` maps the expectation onto the cards NVML sees and derives CUDA_VISIBLE_DEVICES under
CUDA_DEVICE_ORDER=PCI_BUS_ID; `check_devices()` compares what the driver (or torch) says `cuda:k` is with
expectation k, by UUID and by PCI bus id parsed to integers.
"""

from __future__ import annotations

from gpupin.core.errors import CardUnhealthyError, ExpectationError, GpuSpecError, MisalignedError
from gpupin.core.identity import BusId
from gpupin.core.resolve import resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core.expectation import Expectation, ExpectedCard
    from gpupin.core.nvml import Card


def uuid_hex(uuid: str) -> str | None:
    """The hex digits of a UUID (32, or fewer for a prefix) whatever its tag: what CUDA and torch report.

    None for the old MIG form `MIG-GPU-<uuid>/<gi>/<ci>`, whose digits are its parent card's and so name no MIG
    device (gpupin.core.resolve turns it into the device's own UUID through NVML), and for a tag without
    digits. Never "": the empty string is a prefix of every UUID, and would match any card.
    """
    t = uuid.strip()
    if t[:8].upper() == "MIG-GPU-":
        return None
    return t.split("-", 1)[-1].replace("-", "").lower() or None


class Binding:
    """cuda:k (local rank k) and the physical card it must be."""

    __slots__ = ("bus_id", "card", "expected", "local_rank", "name", "uuid")

    def __init__(
        self,
        local_rank: int,
        uuid: str,
        bus_id: BusId | None,
        name: str | None,
        expected: ExpectedCard | None = None,
        card: Card | None = None,
    ) -> None:
        self.local_rank = local_rank
        self.uuid = uuid  # the full UUID CUDA should report (a MIG device's own for MIG)
        self.bus_id = bus_id
        self.name = name
        self.expected = expected
        self.card = card

    def __repr__(self) -> str:
        return f"Binding(cuda:{self.local_rank}={self.uuid}@{self.bus_id})"


class Plan:
    """The bindings in local-rank order and the CUDA_VISIBLE_DEVICES value that realises them.

    `cuda_visible_devices` None means: no expectation, leave the variable as inherited.
    """

    __slots__ = ("bindings", "cuda_visible_devices", "expectation", "extra_cards")

    def __init__(
        self,
        bindings: list[Binding],
        cuda_visible_devices: str | None,
        expectation: Expectation | None,
        extra_cards: int = 0,
    ) -> None:
        self.bindings = bindings
        self.cuda_visible_devices = cuda_visible_devices
        self.expectation = expectation
        self.extra_cards = extra_cards  # cards NVML sees beyond the expected ones (bare metal, --gpus all)


def _describe(cards: Sequence[Card]) -> str:
    return ", ".join(f"{c.uuid}@{c.bus_id}" for c in cards) or "no card"


def _unreadable(cards: Sequence[Card]) -> str:
    return ", ".join(f"the card at index {c.index} ({c.error or 'unreadable'})" for c in cards)


def plan(expectation: Expectation | None, cards: Sequence[Card]) -> Plan:
    """Map the expectation onto the cards NVML sees; raise MisalignedError when an expected card is absent, sits
    at another bus id than expected, or is in MIG mode (CUDA cannot give the whole card).

    Entries of CUDA_VISIBLE_DEVICES are nvidia-smi's indices, or UUIDs as soon as a card is in MIG mode or
    unreadable: CUDA's numbering then differs from NVML's (docs/environment.md, CUDA_VISIBLE_DEVICES).
    """
    unreadable = [c for c in cards if c.uuid is None]
    in_pci_order = sorted(
        (c for c in cards if c.uuid is not None), key=lambda c: c.bus_id.key() if c.bus_id else (1 << 40,)
    )
    if expectation is None:
        bindings = [Binding(k, c.uuid or "?", c.bus_id, c.name, None, c) for k, c in enumerate(in_pci_order)]
        return Plan(bindings, None, None)

    bindings = []
    positions: list[int] = []
    by_uuid = bool(unreadable) or any(c.mig_mode for c in in_pci_order)
    for k, exp in enumerate(expectation.cards):
        try:
            target = resolve(exp.uuid, in_pci_order)
        except GpuSpecError as err:
            if len(err.matches) > 1:
                raise ExpectationError(f"{expectation.source}: {err.message}", err.hint) from None
            if unreadable:  # the card asked for may be the one NVML cannot read: unavailable, not misaligned
                raise CardUnhealthyError(
                    f"{expectation.source} asks for {exp} at cuda:{k}, which is not among the cards NVML can read "
                    f"({_describe(in_pci_order)}); NVML cannot read {_unreadable(unreadable)}",
                    "that may be the card asked for: see `nvidia-smi` and the kernel log (Xid 79: fallen off the "
                    "bus); a lost card needs a reset (`nvidia-smi -r`) or a reboot",
                ) from None
            raise MisalignedError(
                f"{expectation.source} asks for {exp} at cuda:{k}, but the cards this process can see are "
                f"{_describe(in_pci_order)}",
                f"in a container, the runtime exposed other cards than asked: start it with --gpus "
                f"device={exp.uuid} (or `hostagent run --uuid {exp.uuid}`); on a host, `nvidia-smi -L` lists the "
                "cards there are",
            ) from None
        card, full = target.card, target.uuid
        by_uuid = by_uuid or target.mig is not None
        if target.mig is None and card.mig_mode:
            migs = ", ".join(m.uuid for m in card.mig_devices) or "none created yet"
            raise MisalignedError(
                f"{expectation.source} asks for {exp} at cuda:{k}, but {full} at {card.bus_id} is in MIG mode: "
                f"the CUDA driver shows its MIG devices ({migs}), never the whole card",
                "name one of its MIG devices (MIG-..., `nvidia-smi -L` lists them), or turn MIG mode off on that "
                "card (`nvidia-smi -i <index> -mig 0`)",
            )
        if exp.bus_id is not None and card.bus_id != exp.bus_id:
            raise MisalignedError(
                f"{expectation.source} asks for {exp.uuid} at {exp.bus_id} (cuda:{k}), but {full} is at {card.bus_id}",
                "the expectation pairs this UUID with another card's bus id: let `hostagent run` write "
                "GPUPIN_EXPECT, or copy both from `nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv`",
            )
        pos = in_pci_order.index(card)
        if any(b.uuid == full for b in bindings):
            raise ExpectationError(
                f"{expectation.source}: {exp.uuid} and another entry name the same card {full}", "list each card once"
            )
        positions.append(pos)
        bindings.append(Binding(k, full, card.bus_id, card.name, exp, card))
    # Indices under PCI_BUS_ID order are what users read in nvidia-smi; MIG devices can only be named by UUID, an
    # index after a UUID ends CUDA's list, and a card in MIG mode shifts CUDA's indices: then every entry is a UUID.
    cvd = ",".join(b.uuid for b in bindings) if by_uuid else ",".join(str(p) for p in positions)
    return Plan(bindings, cvd, expectation, len(in_pci_order) - len(expectation.cards))


def visible_units(cards: Sequence[Card]) -> list[str]:
    """What a process can be given, by UUID: each whole card, or the MIG devices of a card in MIG mode (the card
    itself is no CUDA device then); a card NVML cannot read is named by its index."""
    out: list[str] = []
    for c in cards:
        if c.uuid is None:
            out.append(f"index {c.index} ({c.error or 'unreadable'})")
        elif c.mig_mode:
            out.extend(m.uuid for m in c.mig_devices)
        else:
            out.append(c.uuid)
    return out


def check_sole(plan: Plan, cards: Sequence[Card]) -> None:
    """Raise MisalignedError when the expectation's source says its cards are all the runtime exposed (`sole`,
    Swarm's reservation) but NVML sees more: those are other tasks' cards, and the runtime is misconfigured."""
    exp = plan.expectation
    if exp is None or exp.sole is None:
        return
    expected = {b.uuid for b in plan.bindings}
    extra = [u for u in visible_units(cards) if u not in expected]
    if extra:
        raise MisalignedError(
            f"{exp.source} reserves {', '.join(b.uuid for b in plan.bindings)} for this task, but it also sees "
            f"{len(extra)} device(s) it did not reserve ({', '.join(extra)}), which the scheduler gives to other "
            "tasks",
            exp.sole,
        )


class CudaDevice:
    """What the CUDA driver (or torch) says cuda:k is."""

    __slots__ = ("bus_id", "k", "name", "uuid_hex")

    def __init__(self, k: int, uuid_hex: str, bus_id: BusId | None, name: str | None) -> None:
        self.k = k
        self.uuid_hex = uuid_hex.lower().replace("-", "")
        self.bus_id = bus_id
        self.name = name

    @classmethod
    def from_probe(cls, d: dict[str, Any]) -> CudaDevice:
        """One device as gpupin.entrypoint.cudaprobe reports it."""
        return cls(d["k"], d["uuid_hex"], parse_cuda_bus(d["bus_id"]), d["name"])

    def describe(self, cards: Sequence[Card] = ()) -> str:
        uuid = next((c.uuid for c in cards if c.uuid and uuid_hex(c.uuid) == self.uuid_hex), None)
        return f"{uuid or 'UUID ' + self.uuid_hex} at {self.bus_id}"


def check_devices(plan: Plan, devices: Sequence[CudaDevice], cards: Sequence[Card], via: str, cvd: str | None) -> None:
    """Raise MisalignedError unless devices[k] is binding k for every k, by UUID and by bus id."""
    if plan.expectation is None:
        return
    want = plan.bindings
    shown = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
    for b, dev in zip(want, devices):
        want_hex = uuid_hex(b.uuid)
        if want_hex is None:
            raise MisalignedError(
                f"cannot tell whether cuda:{b.local_rank} is {b.uuid}: NVML names it in the old MIG form, whose "
                f"digits are its parent card's, and {via} reports another UUID for every MIG device",
                "drivers before R470 write this form: upgrade the driver, or use --verify nvml",
            )
        # An old torch may lack uuid or the PCI fields: what is missing is not compared (and is reported).
        if (dev.uuid_hex and dev.uuid_hex != want_hex) or (dev.bus_id is not None and dev.bus_id != b.bus_id):
            raise MisalignedError(
                f"{via} says cuda:{b.local_rank} is {dev.describe(cards)}, but {plan.expectation.source} asks "
                f"for {b.uuid} at {b.bus_id} there (under CUDA_DEVICE_ORDER=PCI_BUS_ID {shown})",
                "the CUDA driver and NVML disagree about which card is which: do not start work here; report it "
                "with `nvidia-smi -L` (in a container, `nvidia-container-cli list` shows what the runtime mounted)",
            )
    if len(devices) != len(want):
        raise MisalignedError(
            f"{via} sees {len(devices)} device(s) under {shown}, but {plan.expectation.source} asks for "
            f"{len(want)}: {', '.join(b.uuid for b in want)}",
            "the CUDA driver enumerates other devices than NVML lists (a card in MIG mode, a lost card): do not "
            "start work here; compare with `nvidia-smi -L` and report it",
        )


def parse_cuda_bus(text: str) -> BusId | None:
    try:
        return BusId.parse(text)
    except Exception:
        return None
