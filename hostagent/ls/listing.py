"""`hostagent ls`: every physical card, what NVML says of it, and who holds it (the ledger).

The cards come from NVML; the holders from Docker, through the ledger (what the engine gives each container;
a ledger label that disagrees is shown as a MISMATCH under both cards); the users and containers of the cards'
processes from /proc (gpupin.hostagent.ls.procs). When Docker cannot be reached the cards are still listed, the JSON
says so and stderr says so (stdout is the listing only); a card NVML cannot read is shown as such, and a reading a
card does not give (temperature, power, ...) is null in the JSON and N/A in the table.

Each card's health (gpupin.core.health) is `"health": {"healthy": ..., "reasons": [...], "since": ...}`, with
`healthy` null where NVML cannot say (never shown as healthy). `gather()` is the data (`--json` prints it as is);
the table (gpupin.hostagent.ls.view) and `--format` lines (gpupin.hostagent.ls.template) are read from it alone.
"""

from __future__ import annotations

import os
import sys

from gpupin.core import nvml, readings
from gpupin.core.errors import GpupinError, UsageError
from gpupin.hostagent import engine, say
from gpupin.hostagent.ledger import read as ledger_read
from gpupin.hostagent.ledger.holders import Holder
from gpupin.hostagent.ls import procs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core.nvml import Card, MigDevice, Process

MIB = 1024 * 1024


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def gather(warn: bool = True) -> dict[str, Any]:
    """The listing as data (what --json prints). `warn`: say on stderr when Docker cannot be reached."""
    cards = nvml.list_cards(detail=True, tolerate_lost=True)
    readings.assess(cards)
    docker: dict[str, Any] = {"host": None, "available": True, "error": None}
    holders: list[Holder] = []
    try:
        docker["host"] = engine.docker_host()
        holders = ledger_read.read_holders(engine.reader(timeout=10), cards)
    except GpupinError as err:
        docker.update(available=False, error=err.message)
    except Exception as err:
        if not engine.is_daemon_failure(err):
            raise
        docker.update(available=False, error=engine.failure(err, "reading the ledger").message)
    if not docker["available"]:
        docker["host"] = docker["host"] or os.environ.get("DOCKER_HOST") or engine.DEFAULT_HOST
        if warn:
            say(f"WARNING: Docker unavailable at {docker['host']} ({docker['error']}): who holds which card is unknown")
    names = {h.id: h.name for h in holders}
    users: dict[int, str] = {}
    return {"hostname": os.uname().nodename, "driver_version": nvml.driver_version(),
            "cuda_driver_version": nvml.cuda_driver_version(), "docker": docker,
            "gpus": [_card(c, holders, names, users) for c in cards]}


def _card(c: Card, holders: Sequence[Holder], names: dict[str, str], users: dict[int, str]) -> dict[str, Any]:
    keys = {c.uuid, *(m.uuid for m in c.mig_devices)}
    mine = [h for h in holders if keys & set(h.uuids)]
    # Containers labelled for this card that the engine gives other cards: shown here too, never counted.
    labelled = [h for h in holders if h.mismatch and keys & set(h.label or ()) and h not in mine]
    holding = [h for h in mine if h.holds]
    return {
        "index": c.index, "uuid": c.uuid, "bus_id": str(c.bus_id) if c.bus_id else None, "name": c.name,
        "memory_total_mib": _mib(c.memory_total), "memory_used_mib": _mib(c.memory_used),
        "memory_free_mib": _mib(c.memory_free), "utilization_gpu": c.utilization_gpu, "mig_mode": c.mig_mode,
        "mig_devices": [_mig(m, holding) for m in c.mig_devices],
        "compute_processes": c.processes, "compute_capability": c.compute_capability, "error": c.error,
        "health": c.health.to_dict() if c.health is not None else None,
        "held": bool(holding),
        # Held, but only by containers that let --share requests in (every holder started with --share).
        "shared": bool(holding) and all(h.shared for h in holding),
        "holders": [h.to_dict() for h in mine],
        "mislabelled": [h.to_dict() for h in labelled],
        "temperature_c": c.temperature, "power_draw_w": _watts(c.power_draw),
        "power_limit_w": _watts(c.power_limit),
        "processes": [_process(p, c.mig_devices, names, users) for p in c.process_list],
    }


def _mig(m: MigDevice, holding: Sequence[Holder]) -> dict[str, Any]:
    return {"uuid": m.uuid, "index": m.index, "gpu_instance_id": m.gpu_instance_id,
            "compute_instance_id": m.compute_instance_id, "name": m.name,
            "memory_total_mib": _mib(m.memory_total), "memory_used_mib": _mib(m.memory_used),
            "held": any(m.uuid in h.uuids for h in holding)}


def _process(p: Process, migs: Sequence[MigDevice], names: dict[str, str], users: dict[int, str]) -> dict[str, Any]:
    host = procs.describe(p.pid, users)
    # On a card in MIG mode NVML names the process's GPU and compute instance: that is its MIG device.
    mig = next((m.uuid for m in migs if p.gpu_instance_id is not None and m.gpu_instance_id == p.gpu_instance_id
                and p.compute_instance_id in (None, m.compute_instance_id)), None)
    return {"pid": p.pid, "used_memory_mib": _mib(p.used_memory), "user": host.user, "command": host.command,
            "container_id": host.container_id, "container": names.get(host.container_id or ""),
            "mig_uuid": mig}


def command(as_json: bool = False, template: str | None = None, color: str = "auto",
            watch: float | None = None) -> int:
    """`hostagent ls` with its output options: the table (coloured per `color`), JSON, or one templated line per
    card; `watch`: redraw the table every so many seconds until Ctrl-C."""
    try:
        return _command(as_json, template, color, watch)
    except KeyboardInterrupt:  # Ctrl-C while NVML or the daemon is slow to answer: no traceback
        return 130
    except BrokenPipeError:
        # The reader left (`hostagent ls | head -3`): end as a C tool ends on SIGPIPE (141), and keep Python from
        # complaining at exit when it flushes what is left.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def _command(as_json: bool, template: str | None, color: str, watch: float | None) -> int:
    if as_json and template is not None:
        raise UsageError("--json and --format are two outputs for scripts; pick one",
                         "--json for everything, --format TEMPLATE for one line per card")
    if watch is not None and (as_json or template is not None):
        raise UsageError(f"--watch redraws the table on a terminal; it does not go with "
                         f"{'--json' if as_json else '--format'}",
                         "scripts poll `hostagent ls --json` (or --format) at their own pace")
    if template is not None:
        from gpupin.hostagent.ls import template as lsformat

        compiled = lsformat.Template(template)  # refused before anything is read
        sys.stdout.write(compiled.render(gather()))
        sys.stdout.flush()
        return 0
    if as_json:
        import json

        # Compact JSON: with indent, json falls back to its pure-Python encoder (~20 ms for 500 holders).
        sys.stdout.write(json.dumps(gather()) + "\n")
        sys.stdout.flush()
        return 0
    from gpupin.hostagent.ls import view as lsview

    paint = lsview.use_color(color, sys.stdout)
    if watch is not None:
        # Docker's absence is on the header line; a warning on stderr would land inside the redrawn screen.
        return lsview.watch(watch, paint, lambda: gather(warn=False))
    sys.stdout.write(lsview.render(gather(), paint))
    sys.stdout.flush()
    return 0
