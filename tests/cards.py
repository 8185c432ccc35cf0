"""`Card` objects for the pure tests, read from the same scenario files the fake NVML serves (tests/fakegpu).

So the pure core and the simulated host are tested against one description of each box; NVML's order (by bus id)
and NVML's defaults (the minor number is the card's position in the file) are applied here as the fake applies them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpupin.core.identity import BusId
from gpupin.core.nvml import Card, MigDevice, Process

SCENARIOS = Path(__file__).resolve().parent / "fakegpu" / "scenarios"
MIB = 1024 * 1024


def topology(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((SCENARIOS / f"{name}.json").read_text())
    return data


def cards(name: str = "mixed-4") -> list[Card]:
    """The scenario's cards as gpupin.core.nvml.list_cards(detail=True, mig=True) reports them."""
    raw = topology(name)["gpus"]
    for position, g in enumerate(raw):
        g.setdefault("minor_number", position)
    out: list[Card] = []
    for index, g in enumerate(sorted(raw, key=lambda g: BusId.parse(g["bus_id"]).key())):
        c = Card(index, g["uuid"], BusId.parse(g["bus_id"]), g.get("name", "NVIDIA Graphics Device"))
        c.memory_total = g.get("memory_total_mib", 81920) * MIB
        c.memory_used = g.get("memory_used_mib", 0) * MIB
        c.utilization_gpu = g.get("utilization_gpu", 0)
        c.minor_number = g["minor_number"]
        c.compute_capability = g.get("compute_capability", "8.0")
        c.processes = len(g.get("processes", []))
        c.process_list = [Process(p["pid"], None if p.get("used_memory_mib", 0) is None
                                  else p.get("used_memory_mib", 0) * MIB, p.get("gpu_instance_id"),
                                  p.get("compute_instance_id")) for p in g.get("processes", [])]
        c.temperature = g.get("temperature_gpu")
        c.power_draw, c.power_limit = g.get("power_draw_mw"), g.get("power_limit_mw")
        mig = g.get("mig") or {}
        c.mig_mode = bool(mig.get("mode", 0))
        if c.mig_mode:  # NVML has no utilization for a card in MIG mode
            c.utilization_gpu = None
        if c.mig_mode:
            c.mig_devices = [MigDevice(m["uuid"], m["gpu_instance_id"], m["compute_instance_id"], m.get("name"),
                                       m.get("memory_total_mib", 0) * MIB, j, m.get("memory_used_mib", 0) * MIB)
                             for j, m in enumerate(mig.get("devices", []))]
        out.append(c)
    return out


def uuids(name: str = "mixed-4") -> list[str]:
    """The scenario's card UUIDs in NVML order."""
    return [c.uuid for c in cards(name) if c.uuid]
