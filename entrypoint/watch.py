"""`gpupin-entrypoint --watch SECONDS`: keep proving the pin while the workload runs.

Every SECONDS it runs `Checks` under the supervising parent (gpupin.entrypoint.supervise); on a loss it stops
the workload and exits EX_CARD_LOST (79), so that a restart policy starts it again on a card that works
(docs/entrypoint.md, "Watching the cards"). No `from __future__ import annotations` (docs/design.md, Import
rules).
"""

import os
import sys

from gpupin.core import health, nvml, readings
from gpupin.core.contract import WATCH_GRACE_VAR, WATCH_VAR, seconds
from gpupin.core.errors import CardLostError, GpupinError, GpuUnavailableError, shorten

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from gpupin.core.nvml import Card
    from gpupin.entrypoint.verify import Verification

INTERVAL_MAX = 86400.0  # a day: a longer interval watches nothing a user would wait for
INTERVAL_MIN = 0.05  # seconds: at most 20 checks a second
GRACE_DEFAULT = 10.0  # as `docker stop`
GRACE_MAX = 3600.0


def interval(value: str, given: str) -> float:
    """The seconds between checks: a number in (0, a day]; 0, a negative number, nan, inf or text is refused."""
    unset = f", or unset {WATCH_VAR} to run without watching" if given == WATCH_VAR else ""
    named = f"{given}={shorten(value)}" if unset else f"{given} {shorten(value)}"
    hint = f"give the seconds between checks of the pinned cards, like --watch 5{unset}"
    checked = seconds(value, named, INTERVAL_MAX, hint)
    if checked < INTERVAL_MIN:  # 1e-300 would check without pause: a core spent on NVML, no faster a stop
        from gpupin.core.errors import UsageError

        raise UsageError(f"{named} is below the shortest interval, {INTERVAL_MIN:g} seconds", hint)
    return checked


def grace(environ: "Mapping[str, str]") -> float:
    """GPUPIN_WATCH_GRACE: how long a workload stopped for a lost card has between SIGTERM and SIGKILL."""
    raw = environ.get(WATCH_GRACE_VAR, "")
    if not raw.strip():
        return GRACE_DEFAULT
    return seconds(
        raw,
        f"{WATCH_GRACE_VAR}={shorten(raw)}",
        GRACE_MAX,
        f"unset it for {GRACE_DEFAULT:.0f} s, or give one like {WATCH_GRACE_VAR}=30",
        zero=True,
    )


def watched(ver: "Verification") -> "list[Card]":
    """The physical cards the workload was given (a MIG device's parent card), once each, in local-rank order."""
    cards: list[Card] = []
    for b in ver.plan.bindings:
        if b.card is not None and all(c.index != b.card.index for c in cards):
            cards.append(b.card)
    return cards


# The control node every NVML session opens first. A `systemctl daemon-reload` on a host whose Docker uses the
# systemd cgroup driver takes the container's NVIDIA devices out of its device cgroup: the open files (the
# workload's, this NVML session's) keep working, but no new one opens, so every new NVML session fails with
# "Unknown Error" (NVIDIA/nvidia-container-toolkit#48). Opening it is the cheapest sign of that (2 us on an H200,
# against 5 ms of CPU for a new NVML session: bench/records/watch-costs-H200-2026-12-01.jsonl).
CONTROL_NODE = "/dev/nvidiactl"


def _cannot_open(path: str) -> "str | None":
    """Why `path` does not open for reading and writing, or None when it does."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CLOEXEC))
    except OSError as err:
        return err.strerror or str(err)
    return None


class Checks:
    """One check of the pinned cards, set up before the workload starts: None while all is well, else what was
    lost, in words. In the order a cause comes before its effects: the device node opens, NVML finds each card
    where it was, and no card has a new reason to be unhealthy (gpupin.core.health). Each is a few NVML calls of
    the open session: microseconds.
    """

    __slots__ = ("baseline", "cards", "events", "nodes")

    def __init__(self, cards: "Sequence[Card]", nodes: "Sequence[str]" = (CONTROL_NODE,)) -> None:
        self.cards = list(cards)
        self.nodes = [n for n in nodes if _cannot_open(n) is None]
        self.events = readings.XidEvents(c.index for c in self.cards)
        # What a card already had before the workload started: the workload was started on it all the same.
        self.baseline = {c.index: set(health.judge(readings.memory_health(c.index)).reasons) for c in self.cards}

    def __call__(self) -> "str | None":
        for node in self.nodes:
            why = _cannot_open(node)
            if why is not None:
                return (
                    f'{node} no longer opens here ({why}), so every new NVML session fails with "Unknown '
                    'Error": the container lost its GPU devices (a `systemctl daemon-reload` on the host does '
                    "this)"
                )
        try:
            now = {c.index: c for c in nvml.list_cards(tolerate_lost=True)}
        except GpupinError as err:
            return f"NVML no longer answers ({err.message})"
        xids = self.events.drain()
        for card in self.cards:
            seen = now.get(card.index)
            where = f"{card.uuid} at {card.bus_id}"
            if seen is not None and seen.lost:
                return f"{where} is {health.LOST} ({seen.error}: fallen off the bus)"
            if seen is None or seen.uuid != card.uuid:
                why = f" ({seen.error})" if seen is not None and seen.error else ""
                return f"{where} is no longer among the cards NVML sees{why}"
            if seen.bus_id != card.bus_id:
                return f"{card.uuid} is now at {seen.bus_id}, not at {card.bus_id}"
            state = health.judge(readings.memory_health(card.index), [x for i, x in xids if i == card.index])
            new = [r for r in state.reasons if r not in self.baseline[card.index]]
            if state.healthy is False and new:
                return f"{where} is unhealthy: {'; '.join(new)}"
        return None


def lost(what: str, how: str) -> CardLostError:
    """The loss line: what was lost, and `how` the workload was stopped (gpupin.entrypoint.supervise)."""
    return CardLostError(
        f"a pinned card was lost while the workload ran: {what}; the workload was {how}",
        "start the container again, on a card that works: a restart policy does it (`docker run --restart "
        "on-failure`, `hostagent run --restart on-failure`); run `hostagent doctor` on the host to find the cause "
        "(a daemon-reload without /dev/char links, an Xid in `dmesg`)",
    )


def starting(ver: "Verification", every: float) -> str:
    """The line said when watching starts: which cards (as the workload sees them), and how often."""
    cards = [f"{b.uuid} (cuda:{b.local_rank})" for b in ver.plan.bindings if b.card is not None]
    if not cards:
        return f"watching every {every:g} s that NVML answers (no card is pinned)"
    which = "it is" if len(cards) == 1 else "one is"
    return f"watching {', '.join(cards)} every {every:g} s; if {which} lost, the workload is stopped (exit 79)"


def run_watched(
    cmd: "Sequence[str]",
    env: "dict[str, str]",
    ver: "Verification",
    every: float,
    grace_s: float,
    run: "Callable[[Sequence[str], dict[str, str]], int]",
    prog: str,
    quiet: bool = False,
) -> int:
    """Run CMD under the supervising parent, checking the verified cards every `every` seconds (said in one line
    on stderr when it starts, unless `quiet`)."""
    from gpupin.entrypoint.supervise import Watch, supervise

    check = Checks(watched(ver))
    gone = check()  # the first check, and every import one needs, before the workload starts
    if gone is not None:
        raise GpuUnavailableError(
            f"a card verified a moment ago is already gone: {gone}",
            "check `nvidia-smi` and the host's `dmesg`; run `hostagent doctor` on the host",
        )

    if not quiet:
        sys.stderr.write(f"{prog}: {starting(ver, every)}\n")

    def on_loss(what: str, how: str) -> int:
        err = lost(what, how)
        try:
            sys.stderr.write(err.line(prog))
            sys.stderr.flush()
        except (OSError, ValueError):  # stderr gone (a reader that left): the workload is stopped all the same
            pass
        return err.exit_code

    return supervise(cmd, env, Watch(every, check, on_loss, grace_s), run, prog)
