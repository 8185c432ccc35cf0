"""`hostagent ls`: every physical card, what NVML says of it, and who holds it (the ledger).

The cards come from NVML; the holders from Docker, through the ledger (what the engine gives each container;
a ledger label that disagrees is shown as a MISMATCH under both cards); the cards' processes from NVML, each
attributed to its container or the host (gpupin.hostagent.ledger.processes): one that no grant explains makes the card
busy, and one of a container that was not given the card is an ESCAPE. Each card's `state`: free, held, shared,
busy or unknown. Unknown is not free: when Docker cannot be reached, or NVML will not list a card's processes,
`held` is null (unless a process shows it in use) and `unknown` says why; the cards are still listed, and stderr
says so (stdout is the listing only). A card NVML cannot read is shown as such, and a reading a card does not give
(temperature, power, ...) is null in the JSON and N/A in the table.

Each card's health (gpupin.core.health) is `"health": {"healthy": ..., "reasons": [...], "since": ...}`, with
`healthy` null where NVML cannot say (never shown as healthy). `gather()` is the data (`--json` prints it as is);
the table (gpupin.hostagent.ls.view) and `--format` lines (gpupin.hostagent.ls.template) are read from it alone.
"""

from __future__ import annotations

import os
import sys

from gpupin.core import nvml, readings
from gpupin.core.errors import GpupinError, UsageError
from gpupin.hostagent import agentdir, engine, say
from gpupin.hostagent.ledger import processes as ledger_processes
from gpupin.hostagent.ledger import read as ledger_read
from gpupin.hostagent.ledger.holders import Holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core.nvml import Card, MigDevice
    from gpupin.hostagent.ledger.processes import Use

MIB = 1024 * 1024


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def gather(warn: bool = True) -> dict[str, Any]:
    """The listing as data (what --json prints). `warn`: say on stderr when Docker cannot be reached."""
    from gpupin.hostagent.ledger import booking

    cards = read_cards()
    docker, reading = read_ledger(cards, warn)
    out = assemble(cards, docker, reading)
    booking.extend(out, booking.read_extensions(agentdir.state_folder()))  # `hostagent extend`'s, kept by the agent
    return out


def read_cards(xids: readings.XidLog | None = None) -> list[Card]:
    """Every card NVML sees, in detail, with its health (gpupin.core.health); `xids`: a long-lived reader's log of
    the XIDs it has received (the resident agent's), else those that arrive while the cards are read."""
    cards = nvml.list_cards(detail=True, tolerate_lost=True)
    readings.assess(cards, xids)
    return cards


def read_ledger(cards: Sequence[Card], warn: bool = True) -> tuple[dict[str, Any], ledger_read.LedgerReading | None]:
    """Where Docker is and whether it answered (the listing's `docker` object), and its reading (None: it did not
    answer). The resident agent (gpupin.hostagent.serve) calls this only when the daemon reports a change."""
    docker: dict[str, Any] = {"host": None, "available": True, "error": None}
    reading: ledger_read.LedgerReading | None = None
    try:
        docker["host"] = engine.docker_host()
        reading = ledger_read.read_ledger(engine.reader(timeout=10), cards)
        if reading.places.containers:
            reading.places.driver()  # asked now, on this thread (the agent shows the view from another)
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
    return docker, reading


def assemble(
    cards: Sequence[Card], docker: dict[str, Any], reading: ledger_read.LedgerReading | None
) -> dict[str, Any]:
    """The listing from NVML's cards and the ledger's reading (None: Docker was not read), each card's processes
    attributed to their containers or the host (gpupin.hostagent.ledger.processes)."""
    holders = reading.holders if reading is not None else []
    used = (
        ledger_processes.attribute(cards, reading.holders, reading.names, reading.places)
        if reading is not None
        else ledger_processes.attribute(cards, None, None)
    )
    unread = None if reading is not None else f"Docker unavailable: {docker['error']}"
    return {
        "hostname": os.uname().nodename,
        "driver_version": nvml.driver_version(),
        "cuda_driver_version": nvml.cuda_driver_version(),
        "docker": docker,
        "gpus": [_card(c, holders, used, unread) for c in cards],
        # The resident agent's record ({path, degraded}: gpupin.hostagent.record); a one-shot `ls` keeps none.
        "record": None,
    }


def _state(held: bool | None, busy: bool | None, holding: Sequence[Holder]) -> str:
    """free, held (by containers), shared (only by containers started with --share), busy (a process no grant
    explains uses it) or unknown (who uses it cannot be told: never free)."""
    if busy or (held and not holding):
        return "busy"
    if held is None:
        return "unknown"
    if not held:
        return "free"
    return "shared" if all(h.shared for h in holding) else "held"


def _occupancy(
    holding: Sequence[Holder], mine: Sequence[Use], unknown: str | None, unseen: str | None = None
) -> dict[str, Any]:
    """held, busy, state and why they are unknown, of a card or a MIG device. `unseen`: its memory or load says it
    is in use though NVML names no process (busy, unless a container given it explains it)."""
    unseen = None if holding else unseen
    held = True if holding or mine or unseen else None if unknown else False
    busy = (
        True
        if unseen or any(u.foreign for u in mine)
        else None
        if unknown or any(u.foreign is None for u in mine)
        else False
    )
    return {"held": held, "busy": busy, "state": _state(held, busy, holding), "unknown": unknown, "unseen": unseen}


def _card(c: Card, holders: Sequence[Holder], used: Sequence[Use], unread: str | None) -> dict[str, Any]:
    keys = {c.uuid, *(m.uuid for m in c.mig_devices)}
    mine = [h for h in holders if keys & set(h.uuids)]
    # Containers labelled for this card that the engine gives other cards: shown here too, never counted.
    labelled = [h for h in holders if h.mismatch and keys & set(h.label or ()) and h not in mine]
    holding = [h for h in mine if h.holds]
    procs = [u for u in used if u.uuids[0] in keys]
    listed = (
        f"NVML cannot read the card: {c.error}"
        if c.error is not None
        else None
        if c.processes_error is None
        else f"NVML would not list its processes: {c.processes_error}"
    )
    unknown = "; ".join(r for r in (unread, listed) if r) or None
    occupancy = _occupancy(holding, procs, unknown, ledger_processes.unseen_use(c))
    return {
        "index": c.index,
        "uuid": c.uuid,
        "bus_id": str(c.bus_id) if c.bus_id else None,
        "name": c.name,
        "memory_total_mib": _mib(c.memory_total),
        "memory_used_mib": _mib(c.memory_used),
        "memory_free_mib": _mib(c.memory_free),
        "utilization_gpu": c.utilization_gpu,
        "mig_mode": c.mig_mode,
        "mig_devices": [_mig(m, holding, procs, unknown) for m in c.mig_devices],
        "compute_processes": c.processes,
        "compute_capability": c.compute_capability,
        "error": c.error,
        "health": c.health.to_dict() if c.health is not None else None,
        **occupancy,
        # Held, but only by containers that let --share requests in (every holder started with --share).
        "shared": None if occupancy["held"] is None else occupancy["state"] == "shared",
        "holders": [h.to_dict() for h in mine],
        "mislabelled": [h.to_dict() for h in labelled],
        "temperature_c": c.temperature,
        "power_draw_w": _watts(c.power_draw),
        "power_limit_w": _watts(c.power_limit),
        "processes": [_process(u, c) for u in procs],
        # How long the held card has shown 0% utilization, and whether that passed the agent's --idle-after: one
        # reading cannot tell, so only the resident agent (gpupin.hostagent.serve.idle) fills them in, with the
        # warning its policy's idle rule gave the holders ({container, since, stop_at}).
        "idle_seconds": None,
        "idle": None,
        "idle_warning": None,
    }


def _mig(m: MigDevice, holding: Sequence[Holder], procs: Sequence[Use], unknown: str | None) -> dict[str, Any]:
    return {
        "uuid": m.uuid,
        "index": m.index,
        "gpu_instance_id": m.gpu_instance_id,
        "compute_instance_id": m.compute_instance_id,
        "name": m.name,
        "memory_total_mib": _mib(m.memory_total),
        "memory_used_mib": _mib(m.memory_used),
        **_occupancy([h for h in holding if m.uuid in h.uuids], [u for u in procs if u.uuids[0] == m.uuid], unknown),
    }


def _process(u: Use, c: Card) -> dict[str, Any]:
    return {
        **u.to_dict(),
        "used_memory_mib": _mib(u.used_memory),
        "mig_uuid": u.uuids[0] if u.uuids[0] != c.uuid else None,
    }


def command(as_json: bool = False, template: str | None = None, color: str = "auto", watch: float | None = None) -> int:
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
        raise UsageError(
            "--json and --format are two outputs for scripts; pick one",
            "--json for everything, --format TEMPLATE for one line per card",
        )
    if watch is not None and (as_json or template is not None):
        raise UsageError(
            f"--watch redraws the table on a terminal; it does not go with {'--json' if as_json else '--format'}",
            "scripts poll `hostagent ls --json` (or --format) at their own pace",
        )
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
