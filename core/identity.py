"""What names a physical GPU: UUIDs (GPU and MIG), unique prefixes of them, PCI bus ids, and NVML indices (a card's
`2`, a MIG device's `0:1`).

Pure functions, no driver: both sides use them, and the tests pin them without hardware.

Sources spell the same card differently (docs/cuda-visible-devices.md): NVML's `busId` has an 8-digit domain
(`00000000:3B:00.0`), CUDA's `cuDeviceGetPCIBusId` a 4-digit one (`0000:3B:00.0`), torch gives integers and a
UUID without `GPU-`. So bus ids are parsed to integers and compared as such, and UUIDs are normalised to NVML's
spelling (`GPU-` + lower-case hex) before any comparison.
"""

from __future__ import annotations

import re

from gpupin.core.errors import GpuSpecError, UsageError, shorten

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

# The patterns are compiled on first use (re caches them), not at import: a run through the agent uses none.
_HEX = "[0-9a-fA-F]"
_UUID_BODY = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
_GPU_UUID = f"(?i:GPU)-({_UUID_BODY})"
_MIG_UUID = f"(?i:MIG)-({_UUID_BODY})"
# Drivers before R470 named MIG devices by parent UUID, GPU instance and compute instance.
_MIG_LEGACY = f"(?i:MIG)-(?i:GPU)-({_UUID_BODY})/([0-9]+)/([0-9]+)"
# Anything that can only be meant as a (possibly partial) UUID: a tag, then hex digits and dashes, no longer than
# the 36 characters of a whole UUID (a longer "prefix" is a prefix of nothing).
_UUID_PREFIX = r"(?i:(GPU|MIG(?:-GPU)?))-([0-9a-fA-F-]{0,36})"
# An NVML index, or a MIG device by index pair: ASCII digits, as the NVIDIA runtime and nvidia-smi write them.
_INDEX_KEY = r"([0-9]+)(?::([0-9]+))?"
WHOLE = -1  # index_key's MIG device of a whole card


class BusId:
    """A PCI address parsed to integers: (domain, bus, device, function)."""

    __slots__ = ("bus", "device", "domain", "function")

    def __init__(self, domain: int, bus: int, device: int, function: int = 0) -> None:
        if not (0 <= domain <= 0xFFFFFFFF and 0 <= bus <= 0xFF and 0 <= device <= 0x1F and 0 <= function <= 7):
            raise ValueError(f"PCI address out of range: {domain:x}:{bus:x}:{device:x}.{function:x}")
        self.domain = domain
        self.bus = bus
        self.device = device
        self.function = function

    @classmethod
    def parse(cls, text: str) -> BusId:
        """Parse `3b:00.0`, `0000:3B:00.0`, `00000000:3b:00.0` (the function may be left out: `.0`)."""
        t = text.strip()
        parts = t.split(":")
        try:
            if len(parts) == 2:
                domain, bus, rest = "0", parts[0], parts[1]
            elif len(parts) == 3:
                domain, bus, rest = parts
            else:
                raise ValueError
            dev, _, fn = rest.partition(".")
            if not domain or len(domain) > 8 or not bus or len(bus) > 2 or not dev or len(dev) > 2:
                raise ValueError
            if len(fn) > 1:
                raise ValueError
            for piece in (domain, bus, dev, fn):
                if piece.startswith(("+", "-")) or " " in piece:
                    raise ValueError
            return cls(int(domain, 16), int(bus, 16), int(dev, 16), int(fn or "0", 16))
        except ValueError:
            raise UsageError(
                f"malformed PCI bus id {shorten(text)}",
                "write it as NVML does (00000000:3B:00.0) or short (3b:00.0); `nvidia-smi --query-gpu="
                "index,uuid,pci.bus_id --format=csv` lists them",
            ) from None

    def key(self) -> tuple[int, int, int, int]:
        return (self.domain, self.bus, self.device, self.function)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BusId) and self.key() == other.key()

    def __lt__(self, other: BusId) -> bool:
        return self.key() < other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __str__(self) -> str:
        """NVML's form, the one nvidia-smi prints: `00000000:3B:00.0`."""
        return f"{self.domain:08X}:{self.bus:02X}:{self.device:02X}.{self.function:X}"

    def __repr__(self) -> str:
        return f"BusId({self})"


def looks_like_bus_id(text: str) -> bool:
    """True for text shaped like a PCI address (`3b:00.0`, `0000:3B:00.0`), whether or not it is valid."""
    return ":" in text and not text.upper().startswith(("GPU-", "MIG-"))


def normalize_uuid(text: str) -> str:
    """Return NVML's spelling of a full GPU or MIG UUID, or raise UsageError.

    `GPU-` + lower-case hex; MIG UUIDs in either style (`MIG-<uuid>`, `MIG-GPU-<uuid>/<gi>/<ci>`).
    """
    t = text.strip()
    m = re.fullmatch(_GPU_UUID, t)
    if m:
        return "GPU-" + m.group(1).lower()
    m = re.fullmatch(_MIG_UUID, t)
    if m:
        return "MIG-" + m.group(1).lower()
    m = re.fullmatch(_MIG_LEGACY, t)
    if m:
        return f"MIG-GPU-{m.group(1).lower()}/{int(m.group(2))}/{int(m.group(3))}"
    raise UsageError(
        f"malformed GPU UUID {shorten(text)}",
        "a GPU UUID looks like GPU-1c5e8f3a-4b2d-4f0e-9a7c-2d3e4f5a6b7c (see `nvidia-smi -L`)",
    )


def index_key(text: str) -> tuple[int, int] | None:
    """(card, MIG device) of an NVML index (`2` -> (2, WHOLE)) or a MIG device by index pair (`0:1` -> (0, 1)), in
    ASCII digits as the NVIDIA runtime and nvidia-smi write them; None for any other text. The keys sort as NVML
    lists the devices: a card, then its MIG devices."""
    m = re.fullmatch(_INDEX_KEY, text)
    if m is None:
        return None
    return int(m.group(1)), WHOLE if m.group(2) is None else int(m.group(2))


def is_full_uuid(text: str) -> bool:
    t = text.strip()
    return bool(re.fullmatch(_GPU_UUID, t) or re.fullmatch(_MIG_UUID, t) or re.fullmatch(_MIG_LEGACY, t))


def is_uuid_like(text: str) -> bool:
    """True for a full UUID or a prefix of one with at least one hex digit (`GPU-1c5e`, `MIG-GPU-3f`), at most as
    long as a whole UUID."""
    m = re.fullmatch(_UUID_PREFIX, text.strip())
    return bool(m and m.group(2).strip("-"))


def is_mig(uuid: str) -> bool:
    return uuid[:4].upper() == "MIG-"


def mig_legacy_parts(uuid: str) -> tuple[str, int, int] | None:
    """(parent GPU UUID, GPU instance id, compute instance id) of an old-style MIG UUID, else None."""
    m = re.fullmatch(_MIG_LEGACY, uuid.strip())
    if not m:
        return None
    return "GPU-" + m.group(1).lower(), int(m.group(2)), int(m.group(3))


def uuid_from_bytes(raw: bytes, tag: str = "GPU") -> str:
    """Spell CUDA's 16 UUID bytes (`cuDeviceGetUuid`) as NVML does."""
    h = raw.hex()
    return f"{tag}-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def uuid_from_torch(text: str) -> str:
    """torch's `uuid` property lacks the `GPU-` tag; give it back."""
    t = str(text).strip()
    return normalize_uuid(t if t[:4].upper() in ("GPU-", "MIG-") else "GPU-" + t)


def match_uuid(spec: str, candidates: Iterable[str]) -> str:
    """Resolve a full UUID or a unique prefix of one against the UUIDs of the cards that exist.

    As CUDA allows, a prefix names the one card whose UUID starts with it (hex compared case-insensitively).
    Raises GpuSpecError when nothing matches or when the prefix is ambiguous; the error lists the matches.
    """
    cands = list(candidates)
    t = spec.strip()
    if is_full_uuid(t):
        want = normalize_uuid(t)
        for c in cands:
            if c.lower() == want.lower():
                return c
        raise GpuSpecError(
            f"no card with UUID {want} on this host (cards: {', '.join(cands) or 'none'})",
            "list the cards with `nvidia-smi -L` or `hostagent ls`",
        )
    if not is_uuid_like(t):
        raise GpuSpecError(
            f"{shorten(spec)} is neither a GPU UUID nor a prefix of one",
            "give a full UUID (GPU-1c5e8f3a-...) or a unique prefix with at least one hex digit (GPU-1c5e)",
        )
    low = t.lower()
    matches = tuple(c for c in cands if c.lower().startswith(low))
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise GpuSpecError(
            f"no card's UUID starts with {shorten(t)} (cards: {', '.join(cands) or 'none'})",
            "list the cards with `nvidia-smi -L` or `hostagent ls`",
        )
    raise GpuSpecError(
        f"the UUID prefix {shorten(t)} is ambiguous: it matches {', '.join(matches)}",
        "give more hex digits, or the full UUID",
        matches,
    )
