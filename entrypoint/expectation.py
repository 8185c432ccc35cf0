"""The expectation: which physical cards, in local-rank order, a container was meant to get.

Sources, in DESIGN.md's order:
1. `GPUPIN_EXPECT`: `UUID[@BUSID]` entries, comma-separated, in local-rank order (hostagent, compose rendering,
   or by hand). Set but malformed is an error, never a silent fallback.
2. `NVIDIA_VISIBLE_DEVICES` when it lists UUIDs (docker `--gpus device=UUID`, the Kubernetes device plugin).
   Indices, `all`, `none` and `void` (CDI hosts) name no physical card, so they give no expectation.
3. Swarm's generic resources, `DOCKER_RESOURCE_<KIND>` (e.g. `DOCKER_RESOURCE_GPU=GPU-45cbf7b,...`).
"""

from __future__ import annotations

from gpupin.entrypoint.errors import ExpectationError, UsageError
from gpupin.entrypoint.identity import BusId, is_full_uuid, is_uuid_like, normalize_uuid

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

EXPECT_VAR = "GPUPIN_EXPECT"
_EXPECT_HINT = (
    "GPUPIN_EXPECT is a comma-separated list, in local-rank order, of UUID[@BUSID], e.g. "
    "GPU-1c5e8f3a-4b2d-4f0e-9a7c-2d3e4f5a6b7c@00000000:3B:00.0"
)


class ExpectedCard:
    """One expected card: a UUID (full, or a unique prefix when written by hand) and maybe its bus id."""

    __slots__ = ("bus_id", "uuid")

    def __init__(self, uuid: str, bus_id: BusId | None = None) -> None:
        self.uuid = uuid
        self.bus_id = bus_id

    def __str__(self) -> str:
        return f"{self.uuid}@{self.bus_id}" if self.bus_id is not None else self.uuid

    def __repr__(self) -> str:
        return f"ExpectedCard({self})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExpectedCard) and (self.uuid, self.bus_id) == (other.uuid, other.bus_id)

    def __hash__(self) -> int:
        return hash((self.uuid, self.bus_id))


class Expectation:
    """The expected cards in local-rank order, and the variable they came from (for messages)."""

    __slots__ = ("cards", "source")

    def __init__(self, cards: Sequence[ExpectedCard], source: str) -> None:
        self.cards = tuple(cards)
        self.source = source

    def __str__(self) -> str:
        return format_expect(self.cards)

    def __repr__(self) -> str:
        return f"Expectation({self}, source={self.source})"


def format_expect(cards: Iterable[ExpectedCard]) -> str:
    """The GPUPIN_EXPECT value for these cards (what hostagent and compose rendering write)."""
    return ",".join(str(c) for c in cards)


def _parse_uuid_entry(text: str, source: str, whole: str) -> str:
    t = text.strip()
    if is_full_uuid(t):
        return normalize_uuid(t)
    if is_uuid_like(t):
        # A hand-written prefix (CUDA accepts them); it is resolved against the cards NVML sees.
        tag, _, rest = t.partition("-")
        return tag.upper() + "-" + rest.lower()
    raise ExpectationError(f"{source}={whole!r}: {t!r} is not a GPU UUID", _EXPECT_HINT)


def parse_expect(value: str, source: str = EXPECT_VAR) -> Expectation:
    """Parse a GPUPIN_EXPECT value; raise ExpectationError (exit 64) on anything malformed."""
    if not value.strip():
        raise ExpectationError(f"{source} is set but empty", _EXPECT_HINT + "; or unset it")
    cards: list[ExpectedCard] = []
    seen: set[str] = set()
    for k, raw in enumerate(value.split(",")):
        entry = raw.strip()
        if not entry:
            raise ExpectationError(f"{source}={value!r}: entry {k} is empty", _EXPECT_HINT)
        uuid_part, at, bus_part = entry.partition("@")
        uuid = _parse_uuid_entry(uuid_part, source, value)
        bus: BusId | None = None
        if at:
            try:
                bus = BusId.parse(bus_part)
            except UsageError:
                raise ExpectationError(
                    f"{source}={value!r}: {bus_part!r} (after {uuid_part.strip()}@) is not a PCI bus id",
                    _EXPECT_HINT,
                ) from None
        if uuid.lower() in seen:
            raise ExpectationError(f"{source}={value!r}: {uuid} is listed twice", _EXPECT_HINT)
        seen.add(uuid.lower())
        cards.append(ExpectedCard(uuid, bus))
    return Expectation(cards, source)


def _uuid_list(value: str) -> list[str] | None:
    """The entries of a comma list when every one is UUID-like, else None."""
    entries = [e.strip() for e in value.split(",")]
    if not entries or not all(entries) or not all(is_uuid_like(e) for e in entries):
        return None
    return entries


def from_environ(env: Mapping[str, str]) -> Expectation | None:
    """The expectation from the first source that names physical cards, or None."""
    if EXPECT_VAR in env:
        return parse_expect(env[EXPECT_VAR])
    nvd = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvd is not None:
        entries = _uuid_list(nvd)
        if entries is not None and all(is_full_uuid(e) for e in entries):
            return parse_expect(nvd, "NVIDIA_VISIBLE_DEVICES")
    # Swarm names the variable after the resource kind; the toolkit's default is DOCKER_RESOURCE_GPU.
    swarm = sorted(k for k in env if k.startswith("DOCKER_RESOURCE_"))
    swarm.sort(key=lambda k: (k != "DOCKER_RESOURCE_GPU", "GPU" not in k.upper(), k))
    for key in swarm:
        if _uuid_list(env[key]) is not None:
            return parse_expect(env[key], key)
    return None
