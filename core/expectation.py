"""The expectation: which physical cards, in local-rank order, a container was meant to get.

Its written form is GPUPIN_EXPECT's: `UUID[@BUSID]` entries, comma-separated, in local-rank order. Where it comes
from when GPUPIN_EXPECT is unset (NVIDIA_VISIBLE_DEVICES, Swarm, ...) is gpupin.entrypoint.sources.
"""

from __future__ import annotations

from gpupin.core.contract import EXPECT_VAR
from gpupin.core.errors import ExpectationError, UsageError, shorten
from gpupin.core.identity import BusId, is_full_uuid, is_uuid_like, normalize_uuid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

_EXPECT_HINT = (
    "GPUPIN_EXPECT is a comma-separated list, in local-rank order, of UUID[@BUSID], e.g. "
    "GPU-1c5e8f3a-4b2d-4f0e-9a7c-2d3e4f5a6b7c@00000000:3B:00.0"
)


class ExpectedCard:
    """One expected card: a UUID (full, or a unique prefix when written by hand) and maybe its bus id.

    `note` says, for the report, how the source named it (Slurm: the local rank and the device file); it is not
    part of the card's identity.
    """

    __slots__ = ("bus_id", "note", "uuid")

    def __init__(self, uuid: str, bus_id: BusId | None = None, note: str | None = None) -> None:
        self.uuid = uuid
        self.bus_id = bus_id
        self.note = note

    def __str__(self) -> str:
        return f"{self.uuid}@{self.bus_id}" if self.bus_id is not None else self.uuid

    def __repr__(self) -> str:
        return f"ExpectedCard({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExpectedCard) and (self.uuid, self.bus_id) == (other.uuid, other.bus_id)

    def __hash__(self) -> int:
        return hash((self.uuid, self.bus_id))


class Expectation:
    """The expected cards in local-rank order, the variable they came from (for messages) and, where the source
    needs more words than its name (Slurm: the values read, the task), `detail`, which the report shows instead.

    `sole` is set by a source whose cards are all the runtime was meant to expose (Swarm: the cards the task
    reserved): a card visible beyond them is then a refusal, not a card that CUDA_VISIBLE_DEVICES leaves out, and
    `sole` is the hint that says why it happened and what to do. None (GPUPIN_EXPECT, bare metal, `--gpus all`):
    other visible cards are fine."""

    __slots__ = ("cards", "detail", "sole", "source")

    def __init__(
        self, cards: Sequence[ExpectedCard], source: str, detail: str | None = None, sole: str | None = None
    ) -> None:
        self.cards = tuple(cards)
        self.source = source
        self.detail = detail
        self.sole = sole

    def __str__(self) -> str:
        return format_expect(self.cards)

    def __repr__(self) -> str:
        return f"Expectation({self}, source={self.source})"


def format_expect(cards: Iterable[ExpectedCard]) -> str:
    """The GPUPIN_EXPECT value for these cards (what hostagent and compose rendering write)."""
    return ",".join(str(c) for c in cards)


def _hint(source: str) -> str:
    # Only GPUPIN_EXPECT is written by gpupin's own tools; another variable (NVIDIA_VISIBLE_DEVICES, a Swarm
    # resource) is the runtime's or the scheduler's, and the fix is made there.
    if source == EXPECT_VAR:
        return _EXPECT_HINT
    return f"{source} should list GPU UUIDs, each card once, comma-separated; or set GPUPIN_EXPECT, which wins"


def _parse_uuid_entry(text: str, source: str, whole: str) -> str:
    t = text.strip()
    if is_full_uuid(t):
        return normalize_uuid(t)
    if is_uuid_like(t):
        # A hand-written prefix (CUDA accepts them); it is resolved against the cards NVML sees.
        tag, _, rest = t.partition("-")
        return tag.upper() + "-" + rest.lower()
    raise ExpectationError(f"{source}={shorten(whole)}: {shorten(t)} is not a GPU UUID", _hint(source))


def parse_expect(value: str, source: str = EXPECT_VAR) -> Expectation:
    """Parse a GPUPIN_EXPECT value; raise ExpectationError (exit 64) on anything malformed."""
    if not value.strip():
        raise ExpectationError(f"{source} is set but empty", _hint(source) + "; or unset it")
    cards: list[ExpectedCard] = []
    seen: set[str] = set()
    for k, raw in enumerate(value.split(",")):
        entry = raw.strip()
        if not entry:
            raise ExpectationError(f"{source}={shorten(value)}: entry {k} is empty", _hint(source))
        uuid_part, at, bus_part = entry.partition("@")
        uuid = _parse_uuid_entry(uuid_part, source, value)
        bus: BusId | None = None
        if at:
            try:
                bus = BusId.parse(bus_part)
            except UsageError:
                raise ExpectationError(
                    f"{source}={shorten(value)}: {shorten(bus_part)} (after {shorten(uuid_part.strip())}@) is not "
                    "a PCI bus id",
                    _hint(source),
                ) from None
        if uuid.lower() in seen:
            raise ExpectationError(f"{source}={shorten(value)}: {uuid} is listed twice", _hint(source))
        seen.add(uuid.lower())
        cards.append(ExpectedCard(uuid, bus))
    return Expectation(cards, source)
