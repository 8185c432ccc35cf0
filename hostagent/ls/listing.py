"""`hostagent ls`: every physical card, what NVML says of it, and who holds it (the ledger, and the processes NVML
lists). Each card's state: free, held, shared, busy or unknown, and unknown is never free. `gather()` is the data,
typed (gpupin.hostagent.ls.model); `--json` prints its `to_json()`, and the table and `--format` are read from
that alone, as they read another host's (docs/ls.md).
"""

from __future__ import annotations

import os
import sys
import time

from gpupin.core import nvml, readings
from gpupin.core.errors import GpupinError, UsageError
from gpupin.hostagent import agentdir, engine, say
from gpupin.hostagent.ledger import booking, owners
from gpupin.hostagent.ledger import processes as ledger_processes
from gpupin.hostagent.ledger import read as ledger_read
from gpupin.hostagent.ledger.holders import Holder
from gpupin.hostagent.ls.model import (
    BookingShown,
    CardShown,
    DockerState,
    Grant,
    Health,
    HolderShown,
    Listing,
    MigShown,
    Occupancy,
    OwnerShown,
    ProcessShown,
    RootlessOwner,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gpupin.core.nvml import Card, MigDevice
    from gpupin.hostagent.ledger.booking import Booking
    from gpupin.hostagent.ledger.processes import GpuProcess

MIB = 1024 * 1024


def _mib(value: int | None) -> int | None:
    return None if value is None else value // MIB


def _watts(milliwatts: int | None) -> float | None:
    return None if milliwatts is None else milliwatts / 1000


def gather(warn: bool = True) -> Listing:
    """The listing (what --json prints). `warn`: say on stderr when Docker cannot be reached."""
    cards = read_cards()
    docker, reading = read_ledger(cards, warn)
    out = assemble(cards, docker, reading)
    folder = agentdir.state_folder()
    warned = {c: line for c, (line, _) in owners.read_warned(folder).items()}
    own(out, owners.uids(owners.read(folder)), warned=warned)  # who the agent created each container for
    judge(out, booking.read_judged(folder))  # the ends it gave the bookings it did not make
    extend(out, booking.read_extensions(folder))  # `hostagent extend`'s, kept by the agent
    return out


def judge(listing: Listing, judged: Mapping[str, int | None]) -> None:
    """The end the agent gave each booking it did not make (`judged`: container id -> until), in place of its
    label's: a claim's or a compose service's own, cut to the policy's maximum (gpupin.hostagent.serve.bookings)."""
    for card in listing.gpus:
        for h in card.holders:
            b = h.booking
            if b is not None and h.id in judged and not (h.owner is not None and h.owner.verified):
                b.until = judged[h.id]


def own(
    listing: Listing,
    proven: Mapping[str, int],
    names: dict[int, str] | None = None,
    warned: Mapping[str, str] | None = None,
) -> None:
    """Each holder's owner: the uid the agent created it for or admitted by a grant (`proven`: container id ->
    uid), else unverified, with the uid its booking label claims; and the line of enforce mode on's refusal where
    mode warn let it in (`warned`). `names`: the user names looked up already (kept by the agent)."""
    names = {} if names is None else names
    for card in listing.gpus:
        for h in (*card.holders, *card.mislabelled):
            h.warned = warned.get(h.id) if warned else None
            uid = proven.get(h.id)
            if uid is not None:
                h.owner = OwnerShown(uid, user_name(uid, names), True, None)
            else:
                h.owner = OwnerShown(None, None, False, h.booking.uid if h.booking is not None else None)


def user_name(uid: int, names: dict[int, str]) -> str:
    """The user's name (its uid, as text, where the host has none); `names` keeps those looked up."""
    if uid not in names:
        import pwd

        try:
            names[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:
            names[uid] = str(uid)
    return names[uid]


def extend(listing: Listing, ends: Mapping[str, int], now: float | None = None) -> None:
    """Each booked holder's end as extended (`ends`: container id -> until), and its seconds left from `now`
    (gpupin.hostagent.ledger.booking's rules)."""
    now = time.time() if now is None else now
    for card in listing.gpus:
        for h in card.holders:
            b = h.booking
            if b is not None:
                b.until = booking.ends(h.id, b.until, ends)
                b.left_s = booking.left_s(b.until, now)


def read_cards(xids: readings.XidLog | None = None) -> list[Card]:
    """Every card NVML sees, in detail, with its health (gpupin.core.health); `xids`: a long-lived reader's log of
    the XIDs it has received (the resident agent's), else those that arrive while the cards are read."""
    cards = nvml.list_cards(detail=True, tolerate_lost=True)
    readings.assess(cards, xids)
    return cards


def read_ledger(cards: Sequence[Card], warn: bool = True) -> tuple[DockerState, ledger_read.LedgerReading | None]:
    """Where Docker is and whether it answered (the listing's `docker`), and its reading (None: it did not
    answer). The resident agent (gpupin.hostagent.serve) calls this only when the daemon reports a change."""
    docker = DockerState()
    reading: ledger_read.LedgerReading | None = None
    try:
        docker.host = engine.docker_host()
        reading = ledger_read.read_ledger(engine.reader(timeout=10), cards)
        if reading.places.containers:
            reading.places.driver()  # asked now, on this thread (the agent shows the view from another)
    except GpupinError as err:
        docker.available, docker.error = False, err.message
    except Exception as err:
        if not engine.is_daemon_failure(err):
            raise
        docker.available, docker.error = False, engine.failure(err, "reading the ledger").message
    if not docker.available:
        docker.host = docker.host or os.environ.get("DOCKER_HOST") or engine.DEFAULT_HOST
        if warn:
            say(f"WARNING: Docker unavailable at {docker.host} ({docker.error}): who holds which card is unknown")
    return docker, reading


def assemble(cards: Sequence[Card], docker: DockerState, reading: ledger_read.LedgerReading | None) -> Listing:
    """The listing from NVML's cards and the ledger's reading (None: Docker was not read), each card's processes
    attributed to their containers or the host (gpupin.hostagent.ledger.processes)."""
    holders = reading.holders if reading is not None else []
    used = (
        ledger_processes.attribute(cards, reading.holders, reading.names, reading.places)
        if reading is not None
        else ledger_processes.attribute(cards, None, None)
    )
    unread = None if reading is not None else f"Docker unavailable: {docker.error}"
    now = time.time()
    return Listing(
        os.uname().nodename,
        nvml.driver_version(),
        nvml.cuda_driver_version(),
        # A copy: the agent keeps its reading's for the views to come.
        DockerState(docker.host, docker.available, docker.error),
        [_card(c, holders, used, unread, now) for c in cards],
    )


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
    holding: Sequence[Holder], mine: Sequence[GpuProcess], unknown: str | None, unseen: str | None = None
) -> Occupancy:
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
    return Occupancy(held, busy, _state(held, busy, holding), unknown, unseen)


def _card(c: Card, holders: Sequence[Holder], used: Sequence[GpuProcess], unread: str | None, now: float) -> CardShown:
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
    use = _occupancy(holding, procs, unknown, ledger_processes.unseen_use(c))
    h = c.health
    return CardShown(
        c.index,
        c.uuid,
        str(c.bus_id) if c.bus_id else None,
        c.name,
        _mib(c.memory_total),
        _mib(c.memory_used),
        _mib(c.memory_free),
        c.utilization_gpu,
        c.mig_mode,
        [_mig(m, holding, procs, unknown) for m in c.mig_devices],
        c.processes,
        c.compute_capability,
        c.error,
        Health(h.healthy, list(h.reasons), h.since) if h is not None else None,
        use,
        None if use.held is None else use.state == "shared",
        [holder_shown(x, now) for x in mine],
        [holder_shown(x, now) for x in labelled],
        c.temperature,
        _watts(c.power_draw),
        _watts(c.power_limit),
        [_process(u, c) for u in procs],
    )


def _mig(m: MigDevice, holding: Sequence[Holder], procs: Sequence[GpuProcess], unknown: str | None) -> MigShown:
    return MigShown(
        m.uuid,
        m.index,
        m.gpu_instance_id,
        m.compute_instance_id,
        m.name,
        _mib(m.memory_total),
        _mib(m.memory_used),
        _occupancy([h for h in holding if m.uuid in h.uuids], [u for u in procs if u.uuids[0] == m.uuid], unknown),
    )


def booking_shown(b: Booking, now: float, until: float | None = None) -> BookingShown:
    """A booking as listed: `until` (an extension's, when given) and the whole seconds left (0 once past)."""
    end = until if until is not None else b.until
    return BookingShown(b.uid, b.since, end, booking.left_s(end, now))


def holder_shown(h: Holder, now: float) -> HolderShown:
    return HolderShown(
        h.id,
        h.name,
        h.state,
        h.pinned,
        h.how,
        h.via,
        h.shared,
        h.holds,
        h.why,
        list(h.uuids),
        list(h.label) if h.label is not None else None,
        h.mismatch,
        [Grant(g.form, g.how, list(g.uuids), list(g.unknown)) for g in h.grants],
        h.describe(),
        h.image,
        h.verified,
        h.started,
        booking_shown(h.booking, now) if h.booking is not None else None,
    )


def _process(u: GpuProcess, c: Card) -> ProcessShown:
    describe = u.describe()  # reads its user and command from /proc, when first asked
    rootless = u.rootless()
    return ProcessShown(
        u.pid,
        u.kind,
        u.owner,
        u.user,
        u.command,
        u.container_id,
        u.container,
        u.foreign,
        u.escape,
        RootlessOwner(**rootless) if rootless is not None else None,
        describe,
        _mib(u.used_memory),
        u.uuids[0] if u.uuids[0] != c.uuid else None,
    )


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
        sys.stdout.write(compiled.render(gather().to_json()))
        sys.stdout.flush()
        return 0
    if as_json:
        import json

        # Compact JSON: with indent, json falls back to its pure-Python encoder (~20 ms for 500 holders).
        sys.stdout.write(json.dumps(gather().to_json()) + "\n")
        sys.stdout.flush()
        return 0
    from gpupin.hostagent.ls import view as lsview

    paint = lsview.use_color(color, sys.stdout)
    if watch is not None:
        # Docker's absence is on the header line; a warning on stderr would land inside the redrawn screen.
        return lsview.watch(watch, paint, lambda: gather(warn=False).to_json())
    sys.stdout.write(lsview.render(gather().to_json(), paint))
    sys.stdout.flush()
    return 0
