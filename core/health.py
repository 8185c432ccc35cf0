"""A card's health: whether it may be handed out and, when not, why, in a short phrase a user reads.

Judged from NVML's readings (gpupin.core.readings): critical XIDs (`CRITICAL_XIDS`), uncorrectable ECC errors,
memory repair pending or failed, a lost card. Unknown (`healthy` None) is never shown as healthy. The rules,
and why an XID is seen only as it happens: docs/design.md, "Health".
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

# The critical XIDs and what each means. Source: NVIDIA's Xid catalog for Ampere and later
# (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), column "Resolution Bucket (Immediate Action)":
# the XIDs whose action is on the card or the node (RESET_GPU, RESTART_BM, the ECC and NVLink WORKFLOW_*s), and 79.
# Not here: the XIDs it files under RESTART_APP or IGNORE, application errors that leave the card healthy, such as
# the k8s-device-plugin's `applicationErrorXids` (internal/rm/health.go: 13 graphics engine exception, 31 memory
# page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 video processor exception) and 109 (context
# switch timeout). An XID not listed does not make a card unhealthy: a false alarm would stop a healthy workload.
CRITICAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halted",
    63: "memory repair pending until a reset",
    64: "memory repair failed",
    74: "NVLink error",
    79: "fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
    143: "GPU initialization failed",
    144: "NVLink error",
    145: "NVLink error",
    146: "NVLink error",
    147: "NVLink error",
    148: "NVLink error",
    149: "NVLink error",
    150: "NVLink error",
    154: "GPU recovery action required",
}

LOST = "lost to NVML"


def hint(index: int | None = None) -> str:
    """What to do about an unhealthy card (at NVML index `index`, where one is meant)."""
    i = "<index>" if index is None else str(index)
    return (
        f"see `nvidia-smi -q -d ECC,ROW_REMAPPER -i {i}` and the host's `dmesg`; reset the card (`nvidia-smi -r "
        f"-i {i}`, with nothing running on it) or drain the host and reboot it"
    )


def xid_reason(xid: int) -> str | None:
    """The phrase for a critical XID ("XID 79 (fallen off the bus)"), None for an XID that is not critical."""
    what = CRITICAL_XIDS.get(xid)
    return None if what is None else f"XID {xid} ({what})"


class Health:
    """`healthy`: True, False, or None (unknown); `reasons`: why it is unhealthy (or unknown); `since`: when the
    first reason was seen (ISO 8601 UTC), where that can be known (an XID), else None."""

    __slots__ = ("healthy", "reasons", "since")

    def __init__(self, healthy: bool | None, reasons: Sequence[str] = (), since: str | None = None) -> None:
        self.healthy = healthy
        self.reasons = list(reasons)
        self.since = since

    @property
    def why(self) -> str:
        """The reasons in one line."""
        return "; ".join(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "reasons": list(self.reasons), "since": self.since}

    def __repr__(self) -> str:
        return f"Health({self.healthy}, {self.reasons!r}, since={self.since!r})"


class MemoryHealth:
    """A card's memory-error readings (`nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER`). None: the card does
    not report it (no ECC, ECC off, page retirement on a card that remaps rows and the reverse). `error`: why NVML
    could not read one (the others are then unknown too); `lost`: NVML answered GPU_IS_LOST."""

    __slots__ = ("ecc_uncorrected", "error", "lost", "remap_failure", "remap_pending", "retired_pending")

    def __init__(self) -> None:
        self.ecc_uncorrected: int | None = None  # volatile uncorrectable ECC errors
        self.retired_pending: bool | None = None
        self.remap_pending: bool | None = None
        self.remap_failure: bool | None = None
        self.error: str | None = None
        self.lost = False


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _memory_reasons(m: MemoryHealth) -> list[str]:
    reasons = []
    if m.ecc_uncorrected:
        reasons.append(f"{m.ecc_uncorrected} volatile uncorrectable ECC error{'s' if m.ecc_uncorrected > 1 else ''}")
    if m.retired_pending:
        reasons.append("page retirement pending until a reset")
    if m.remap_failure:
        reasons.append("row remapping failed")
    elif m.remap_pending:
        reasons.append("row remapping pending until a reset")
    return reasons


def judge(memory: MemoryHealth | None, xids: Iterable[int] = (), seen: str | None = None, lost: bool = False) -> Health:
    """The health that these readings make: `memory` (None: not read), the XIDs received (at `seen`), `lost`."""
    if lost or (memory is not None and memory.lost):
        return Health(False, [LOST])
    reasons = list(dict.fromkeys(r for r in map(xid_reason, xids) if r is not None))
    since = seen if reasons else None
    if memory is not None and memory.error is None:
        reasons += _memory_reasons(memory)
    if reasons:
        return Health(False, reasons, since)
    if memory is None or memory.error is not None:
        why = memory.error if memory is not None else "not read"
        return Health(None, [f"NVML could not read its memory errors: {why}"])
    return Health(True)
