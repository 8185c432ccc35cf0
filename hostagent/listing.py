"""`hostagent ls`: every physical card, what NVML says of it, and who holds it (the ledger).

The cards come from NVML; the holders from Docker, through the ledger (what the engine gives each container;
a ledger label that disagrees is shown as a MISMATCH under both cards). When Docker cannot be reached the cards are
still listed, the JSON says so and stderr says so (stdout is the listing only); a card NVML cannot read is shown
as such.
"""

from __future__ import annotations

import os
import sys

from gpupin.entrypoint import nvml
from gpupin.entrypoint.errors import GpupinError
from gpupin.hostagent import engine
from gpupin.hostagent.ledger import Holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card

MIB = 1024 * 1024


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def gather() -> dict[str, Any]:
    """The listing as data (what --json prints)."""
    cards = nvml.list_cards(detail=True, tolerate_lost=True)
    docker: dict[str, Any] = {"host": None, "available": True, "error": None}
    holders: list[Holder] = []
    try:
        docker["host"] = engine.docker_host()
        holders = engine.read_holders(engine.reader(timeout=10), cards)
    except GpupinError as err:
        docker.update(available=False, error=err.message)
    except Exception as err:
        if not engine.is_daemon_failure(err):
            raise
        docker.update(available=False, error=engine.failure(err, "reading the ledger").message)
    if not docker["available"]:
        docker["host"] = docker["host"] or os.environ.get("DOCKER_HOST") or engine.DEFAULT_HOST
        sys.stderr.write(f"hostagent: WARNING: Docker unavailable at {docker['host']} ({docker['error']}): who "
                         "holds which card is unknown\n")
    return {"driver_version": nvml.driver_version(), "docker": docker,
            "gpus": [_card(c, holders) for c in cards]}


def _card(c: Card, holders: Sequence[Holder]) -> dict[str, Any]:
    keys = {c.uuid, *(m.uuid for m in c.mig_devices)}
    mine = [h for h in holders if keys & set(h.uuids)]
    # Containers labelled for this card that the engine gives other cards: shown here too, never counted.
    labelled = [h for h in holders if h.mismatch and keys & set(h.label or ()) and h not in mine]
    return {
        "index": c.index, "uuid": c.uuid, "bus_id": str(c.bus_id) if c.bus_id else None, "name": c.name,
        "memory_total_mib": _mib(c.memory_total), "memory_used_mib": _mib(c.memory_used),
        "memory_free_mib": _mib(c.memory_free), "utilization_gpu": c.utilization_gpu, "mig_mode": c.mig_mode,
        "mig_devices": [{"uuid": m.uuid, "gpu_instance_id": m.gpu_instance_id,
                         "compute_instance_id": m.compute_instance_id, "name": m.name,
                         "memory_total_mib": _mib(m.memory_total)} for m in c.mig_devices],
        "compute_processes": c.processes, "compute_capability": c.compute_capability, "error": c.error,
        "held": any(h.holds for h in mine),
        "holders": [h.to_dict() for h in mine],
        "mislabelled": [h.to_dict() for h in labelled],
    }


def _na(value: object, suffix: str = "") -> str:
    return "N/A" if value is None else f"{value}{suffix}"


def render(listing: dict[str, Any]) -> str:
    rows = [("IDX", "UUID", "BUS ID", "NAME", "MEMORY USED/TOTAL", "UTIL", "MIG", "PROCS", "HELD BY")]
    for g in listing["gpus"]:
        if g["error"]:
            rows.append((str(g["index"]), g["uuid"] or "?", g["bus_id"] or "?", f"ERROR: {g['error']}",
                         "", "", "", "", ""))
            continue
        who = ", ".join(h["describe"] for h in g["holders"] if h["holds"]) or "-"
        idle = [h for h in g["holders"] if not h["holds"]]
        if idle:
            who += f" [+{len(idle)} stopped]"
        for h in g["mislabelled"]:
            who += (f" [MISMATCH: {h['name']} ({h['id'][:12]}) is labelled for this card, holds "
                    f"{','.join(h['uuids']) or 'none'}]")
        mig = {None: "N/A", True: "on", False: "off"}[g["mig_mode"]]
        rows.append((str(g["index"]), g["uuid"], g["bus_id"], g["name"],
                     f"{_na(g['memory_used_mib'])} / {_na(g['memory_total_mib'], ' MiB')}",
                     _na(g["utilization_gpu"], "%"), mig, _na(g["compute_processes"]), who))
        for m in g["mig_devices"]:
            rows.append(("", f"  {m['uuid']}", "", f"  {m['name'] or 'MIG device'}", "", "", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines) + "\n"
