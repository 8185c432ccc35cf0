"""The shipped boxes (tests/fakegpu/scenarios/*.json), read as the fake NVML serves them: the one description of each
box that the pure tests, the simulated host and the sandbox all use. Tests take UUIDs, bus ids and names from here,
never from a copy.

NVML's order (by bus id) and NVML's defaults (the minor number is the card's position in the file) are applied here
as the fake applies them (tests/fakegpu/topology.c).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpupin.core.identity import BusId
from gpupin.core.nvml import Card, MigDevice, Process

SCENARIOS = Path(__file__).resolve().parent.parent / "fakegpu" / "scenarios"
SHIPPED = sorted(p.stem for p in SCENARIOS.glob("*.json"))
MIB = 1024 * 1024


def scenario(name: str) -> Path:
    """The scenario's file (what FAKEGPU_TOPOLOGY names)."""
    return SCENARIOS / f"{name}.json"


def topology(name: str) -> dict[str, Any]:
    """The scenario's file as written (a fresh copy: callers may change it)."""
    data: dict[str, Any] = json.loads(scenario(name).read_text())
    return data


def gpus(name: str) -> list[dict[str, Any]]:
    """The scenario's cards as written, in NVML order (by bus id), each with its minor number."""
    raw = topology(name)["gpus"]
    for position, g in enumerate(raw):
        g.setdefault("minor_number", position)
    return sorted(raw, key=lambda g: BusId.parse(g["bus_id"]).key())


def uuids(name: str = "mixed-4") -> list[str]:
    """The cards' UUIDs in NVML order: nvidia-smi's index 0, 1, ..."""
    return [g["uuid"] for g in gpus(name)]


def bus_ids(name: str = "mixed-4") -> list[str]:
    """The cards' PCI bus ids in NVML order, as NVML spells them (00000000:1B:00.0)."""
    return [str(BusId.parse(g["bus_id"])) for g in gpus(name)]


def names(name: str = "mixed-4") -> list[str]:
    """The cards' product names in NVML order."""
    return [g.get("name", "NVIDIA Graphics Device") for g in gpus(name)]


def mig_devices(name: str) -> list[str]:
    """The UUIDs of the MIG devices of the scenario's cards in MIG mode, card by card in NVML order."""
    return [d["uuid"] for g in gpus(name) if (g.get("mig") or {}).get("mode") == 1 for d in g["mig"]["devices"]]


def swarm_resources(name: str) -> list[str]:
    """What a Swarm node with this box advertises (`hostagent swarm node-config`): in NVML order, each whole card,
    or the MIG devices of a card in MIG mode."""
    out: list[str] = []
    for g in gpus(name):
        mig = g.get("mig") or {}
        out += [d["uuid"] for d in mig.get("devices", [])] if mig.get("mode") == 1 else [g["uuid"]]
    return out


def fault_file(tmp_path: Path, cards: dict[str, Any]) -> Path:
    """The fake NVML's fault file (FAKEGPU_FAULTS) with those faults per card UUID."""
    path = tmp_path / "faults.json"
    path.write_text(json.dumps({"cards": cards}))
    return path


def cards(name: str = "mixed-4") -> list[Card]:
    """The scenario's cards as gpupin.core.nvml.list_cards(detail=True, mig=True) reports them."""
    out: list[Card] = []
    for index, g in enumerate(gpus(name)):
        c = Card(index, g["uuid"], BusId.parse(g["bus_id"]), g.get("name", "NVIDIA Graphics Device"))
        c.memory_total = g.get("memory_total_mib", 81920) * MIB
        c.memory_used = g.get("memory_used_mib", 0) * MIB
        c.utilization_gpu = g.get("utilization_gpu", 0)
        c.minor_number = g["minor_number"]
        c.compute_capability = g.get("compute_capability", "8.0")
        c.processes = len(g.get("processes", []))
        c.process_list = [
            Process(
                p["pid"],
                None if p.get("used_memory_mib", 0) is None else p.get("used_memory_mib", 0) * MIB,
                p.get("gpu_instance_id"),
                p.get("compute_instance_id"),
            )
            for p in g.get("processes", [])
        ]
        c.temperature = g.get("temperature_gpu")
        c.power_draw, c.power_limit = g.get("power_draw_mw"), g.get("power_limit_mw")
        mig = g.get("mig") or {}
        c.mig_mode = bool(mig.get("mode", 0))
        if c.mig_mode:  # NVML has no utilization for a card in MIG mode
            c.utilization_gpu = None
            c.mig_devices = [
                MigDevice(
                    m["uuid"],
                    m["gpu_instance_id"],
                    m["compute_instance_id"],
                    m.get("name"),
                    m.get("memory_total_mib", 0) * MIB,
                    j,
                    m.get("memory_used_mib", 0) * MIB,
                )
                for j, m in enumerate(mig.get("devices", []))
            ]
        out.append(c)
    return out
