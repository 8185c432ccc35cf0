"""Alignment: which card each `cuda:k` must be, the CUDA_VISIBLE_DEVICES that makes it so, and the proof.

Pure logic over what NVML and the CUDA driver reported; no driver calls here, so the tests pin every refusal
without hardware. `plan()` maps the expectation onto the cards NVML sees and derives CUDA_VISIBLE_DEVICES under
CUDA_DEVICE_ORDER=PCI_BUS_ID; `check_devices()` compares what the driver (or torch) says `cuda:k` is with
expectation k, by UUID and by PCI bus id parsed to integers.
"""

from __future__ import annotations

from gpupin.entrypoint.errors import ExpectationError, GpuSpecError, MisalignedError
from gpupin.entrypoint.identity import BusId
from gpupin.entrypoint.resolve import resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.entrypoint.expectation import Expectation, ExpectedCard
    from gpupin.entrypoint.nvml import Card


def uuid_hex(uuid: str) -> str:
    """The 32 hex digits of a UUID, whatever its tag: what CUDA and torch report, and what identifies a card."""
    return uuid.split("-", 1)[-1].replace("-", "").lower() if not uuid.startswith("MIG-GPU-") else ""


class Binding:
    """cuda:k (local rank k) and the physical card it must be."""

    __slots__ = ("bus_id", "card", "expected", "local_rank", "name", "uuid")

    def __init__(self, local_rank: int, uuid: str, bus_id: BusId | None, name: str | None,
                 expected: ExpectedCard | None = None, card: Card | None = None) -> None:
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

    def __init__(self, bindings: list[Binding], cuda_visible_devices: str | None,
                 expectation: Expectation | None, extra_cards: int = 0) -> None:
        self.bindings = bindings
        self.cuda_visible_devices = cuda_visible_devices
        self.expectation = expectation
        self.extra_cards = extra_cards  # cards NVML sees beyond the expected ones (bare metal, --gpus all)


def _describe(cards: Sequence[Card]) -> str:
    return ", ".join(f"{c.uuid}@{c.bus_id}" for c in cards) or "no card"


def plan(expectation: Expectation | None, cards: Sequence[Card]) -> Plan:
    """Map the expectation onto the cards NVML sees; raise MisalignedError when an expected card is absent or
    sits at another bus id than expected."""
    in_pci_order = sorted(cards, key=lambda c: c.bus_id.key() if c.bus_id else (1 << 40,))
    if expectation is None:
        bindings = [Binding(k, c.uuid or "?", c.bus_id, c.name, None, c) for k, c in enumerate(in_pci_order)]
        return Plan(bindings, None, None)

    bindings = []
    positions: list[int] = []
    uses_mig = False
    for k, exp in enumerate(expectation.cards):
        try:
            target = resolve(exp.uuid, in_pci_order)
        except GpuSpecError as err:
            if len(err.matches) > 1:
                raise ExpectationError(f"{expectation.source}: {err.message}", err.hint) from None
            raise MisalignedError(
                f"{expectation.source} asks for {exp} at cuda:{k}, but the cards this process can see are "
                f"{_describe(in_pci_order)}",
                f"the runtime exposed other cards than asked: start the container with --gpus "
                f"device={exp.uuid} (or `hostagent run --uuid {exp.uuid}`)",
            ) from None
        card, full = target.card, target.uuid
        uses_mig = uses_mig or target.mig is not None
        if exp.bus_id is not None and card.bus_id != exp.bus_id:
            raise MisalignedError(
                f"{expectation.source} asks for {exp.uuid} at {exp.bus_id} (cuda:{k}), but {full} is at "
                f"{card.bus_id}",
                "the expectation pairs this UUID with another card's bus id: let `hostagent run` write "
                "GPUPIN_EXPECT, or copy both from `nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv`",
            )
        pos = in_pci_order.index(card)
        if any(b.uuid == full for b in bindings):
            raise ExpectationError(f"{expectation.source}: {exp.uuid} and another entry name the same card "
                                   f"{full}", "list each card once")
        positions.append(pos)
        bindings.append(Binding(k, full, card.bus_id, card.name, exp, card))
    # Indices under PCI_BUS_ID order are what users read in nvidia-smi; MIG devices can only be named by UUID,
    # and an index after a UUID ends CUDA's list, so with any MIG device every entry is a UUID.
    cvd = ",".join(b.uuid for b in bindings) if uses_mig else ",".join(str(p) for p in positions)
    return Plan(bindings, cvd, expectation, len(in_pci_order) - len(expectation.cards))


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


def check_devices(plan: Plan, devices: Sequence[CudaDevice], cards: Sequence[Card], via: str,
                  cvd: str | None) -> None:
    """Raise MisalignedError unless devices[k] is binding k for every k, by UUID and by bus id."""
    if plan.expectation is None:
        return
    want = plan.bindings
    shown = f"CUDA_VISIBLE_DEVICES={cvd}" if cvd is not None else "CUDA_VISIBLE_DEVICES unset"
    for b, dev in zip(want, devices):
        # An old torch may lack uuid or the PCI fields: what is missing is not compared (and is reported).
        if (dev.uuid_hex and dev.uuid_hex != uuid_hex(b.uuid)) or (dev.bus_id is not None
                                                                    and dev.bus_id != b.bus_id):
            raise MisalignedError(
                f"{via} says cuda:{b.local_rank} is {dev.describe(cards)}, but {plan.expectation.source} asks "
                f"for {b.uuid} at {b.bus_id} there (under CUDA_DEVICE_ORDER=PCI_BUS_ID {shown})",
                "the CUDA driver and NVML disagree about which card is which: do not start work here; check "
                "the container runtime (`nvidia-container-cli list`) and report it",
            )
    if len(devices) != len(want):
        raise MisalignedError(
            f"{via} sees {len(devices)} device(s) under {shown}, but {plan.expectation.source} asks for "
            f"{len(want)}: {', '.join(b.uuid for b in want)}",
            "something else in this process's environment changes what CUDA enumerates (CUDA_VISIBLE_DEVICES "
            "rewritten, a MIG device, a lost card): run `gpupin-entrypoint --verify cuda` to see the mapping",
        )


def parse_cuda_bus(text: str) -> BusId | None:
    try:
        return BusId.parse(text)
    except Exception:
        return None
