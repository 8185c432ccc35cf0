"""GET /metrics: the agent's view as Prometheus text, through prometheus-client's custom collector.

`collect()` reads the agent's current snapshot at scrape time and yields metric families built from it, so a card
or container that has gone leaves no stale series. Every card series carries dcgm-exporter's label names (`gpu`,
`UUID`, `pci_bus_id`, `modelName`, `Hostname`), so that a dashboard can join gpupin's series with DCGM's. The
names and their meaning are in docs/serve.md, "Metrics". The record's series per user are this scrape's caller's
to see (`RecordCollector`: every user's, the caller's own, or none on HTTP unless --http-per-user).
"""

from __future__ import annotations

import time

from gpupin.core import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from gpupin.hostagent.ls.model import CardShown
    from gpupin.hostagent.record import Scope
    from gpupin.hostagent.serve.agent import Agent

MIB = 1024 * 1024
CARD_LABELS = ["gpu", "UUID", "pci_bus_id", "modelName", "Hostname"]
STATES = ("free", "held", "shared", "busy", "unhealthy", "unknown")
HEALTH = ("healthy", "unhealthy", "unknown")
HOLDER_LABELS = ["container", "container_id", "image", "user", "pinned", "verified", "UUID", "gpu", "Hostname"]


def healthy(card: CardShown) -> bool | None:
    """The card's health: the listing's `health.healthy` where the listing carries health readings
    (gpupin.core.health; None: unknown); without them, a card NVML cannot read is unhealthy and one it reads healthy,
    as `hostagent ls` shows them."""
    if card.health is not None:
        return card.health.healthy
    return not card.error


def state(card: CardShown) -> str:
    """One word for the card: unhealthy first, then the listing's own (gpupin.hostagent.ls.listing): held or shared
    (a container holds it), busy (processes run on it that no holder explains: the host's, or a container's that
    was not given it), free, or unknown (who holds it cannot be read: Docker or the card's processes unread)."""
    if healthy(card) is False:
        return "unhealthy"
    return card.use.state or "unknown"


def _bool(value: bool | None) -> str:
    return "unknown" if value is None else "true" if value else "false"


class ViewCollector:
    """prometheus-client's collector protocol over the agent's snapshot."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def describe(self) -> list[Metric]:
        return []  # families depend on the view: collect() alone says what there is (no read at registration)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        snap = self.agent.snapshot()
        view = snap.listing
        info = InfoMetricFamily("gpupin_agent", "The resident agent: its version and idle threshold.")
        info.add_metric([], {"version": __version__, "idle_after_seconds": f"{self.agent.idle.idle_after:g}"})
        yield info
        yield GaugeMetricFamily(
            "gpupin_agent_nvml_up", "1 when the agent's last NVML read succeeded, else 0.", value=int(view is not None)
        )
        docker_ok = bool(view and view.docker.available)
        yield GaugeMetricFamily(
            "gpupin_agent_docker_up",
            "1 when the agent's last ledger read reached the Docker daemon, else 0 (holders unknown).",
            value=int(docker_ok),
        )
        yield GaugeMetricFamily(
            "gpupin_agent_last_refresh_timestamp_seconds",
            "When the view was last read (seconds since the epoch).",
            value=snap.read_at,
        )
        waiting = self.agent.queue.waiters()
        yield GaugeMetricFamily(
            "gpupin_queue_waiters", "Requests waiting in the agent's queue (run --wait).", value=len(waiting)
        )
        yield GaugeMetricFamily(
            "gpupin_queue_oldest_wait_seconds",
            "How long the first in the agent's queue has waited, seconds (0 when no one waits).",
            value=time.time() - waiting[0].since if waiting else 0.0,
        )
        if view is None:
            return
        host = view.hostname or ""
        gauges = {
            "utilization": (
                "gpupin_gpu_utilization_percent",
                "GPU utilization over NVML's last sample period, percent.",
            ),
            "mem_used": ("gpupin_gpu_memory_used_bytes", "Memory in use on the card, bytes."),
            "mem_total": ("gpupin_gpu_memory_total_bytes", "Memory on the card, bytes."),
            "power": ("gpupin_gpu_power_watts", "Power draw, watts."),
            "power_limit": ("gpupin_gpu_power_limit_watts", "Enforced power limit, watts."),
            "temperature": ("gpupin_gpu_temperature_celsius", "GPU core temperature, degrees Celsius."),
            "holders": ("gpupin_gpu_holders", "Containers that hold the card now."),
            "processes": ("gpupin_gpu_processes", "Compute processes NVML reports on the card."),
            "idle": (
                "gpupin_gpu_idle",
                "1 when the held card has shown 0% utilization and no compute process "
                "for the idle time (--idle-after, or the policy's), else 0; absent when not known.",
            ),
            "idle_seconds": (
                "gpupin_gpu_idle_seconds",
                "How long the held card has shown 0% utilization and no compute process, "
                "by the agent's samples; absent when not held or not known.",
            ),
        }
        fam = {k: GaugeMetricFamily(name, doc, labels=CARD_LABELS) for k, (name, doc) in gauges.items()}
        states = GaugeMetricFamily(
            "gpupin_gpu_state",
            "1 for the card's state (free, held, shared, busy, unhealthy, unknown), 0 for the others.",
            labels=[*CARD_LABELS, "state"],
        )
        health = GaugeMetricFamily(
            "gpupin_gpu_health",
            "1 for the card's health (healthy, unhealthy, unknown), 0 for the others.",
            labels=[*CARD_LABELS, "health"],
        )
        holder = GaugeMetricFamily(
            "gpupin_holder_info",
            "1 per container and card it holds: its name, id, image, "
            "the host user of its processes on the card, whether gpupin pinned it, and whether "
            "gpupin-entrypoint verified it (unknown: the container does not say).",
            labels=HOLDER_LABELS,
        )
        for card in view.gpus:
            labels = [
                str(card.index),
                card.uuid or "",
                card.bus_id or "",
                card.name or "",
                host,
            ]
            for key, value in self._readings(card, docker_ok).items():
                if value is not None:
                    fam[key].add_metric(labels, float(value))
            now = state(card)
            for s in STATES:
                states.add_metric([*labels, s], float(s == now))
            h = _bool(healthy(card)).replace("true", "healthy").replace("false", "unhealthy")
            for s in HEALTH:
                health.add_metric([*labels, s], float(s == h))
            users = {p.container_id: p.user for p in card.processes if p.container_id}
            for hd in card.holders:
                if hd.holds:
                    holder.add_metric(
                        [
                            hd.name,
                            hd.id,
                            hd.image or "",
                            users.get(hd.id) or "",
                            _bool(hd.pinned),
                            _bool(hd.verified),
                            labels[1],
                            labels[0],
                            host,
                        ],
                        1.0,
                    )
        yield from fam.values()
        yield states
        yield health
        yield holder

    @staticmethod
    def _readings(card: CardShown, docker_ok: bool) -> dict[str, float | int | None]:
        def mib(v: int | None) -> int | None:
            return None if v is None else v * MIB

        idle = card.idle
        # Who holds a card is the daemon's to say: while it is unread, the count is unknown (absent), not 0.
        held = docker_ok and not card.error
        return {
            "utilization": card.utilization_gpu,
            "mem_used": mib(card.memory_used_mib),
            "mem_total": mib(card.memory_total_mib),
            "power": card.power_draw_w,
            "power_limit": card.power_limit_w,
            "temperature": card.temperature_c,
            "holders": sum(1 for h in card.holders if h.holds) if held else None,
            "processes": card.compute_processes,
            "idle": None if idle is None else int(idle),
            "idle_seconds": card.idle_seconds,
        }


class RecordCollector:
    """Per user, from the record (gpupin.hostagent.record), the users `scope` lets this scrape see: everyone, the
    caller alone (a user of the socket), or no one (HTTP unless --http-per-user: the families are absent). Absent
    too when the agent keeps no record."""

    def __init__(self, agent: Agent, scope: Scope) -> None:
        self.agent = agent
        self.scope = scope

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        record = self.agent.record
        if record is None or not self.scope.per_user:
            return
        try:
            rows = record.store.usage(None, "user", time.time(), self.scope.uid)
        except Exception:  # a record that cannot be read is said in /api/ls; a scrape still answers
            return
        if not rows:  # nothing recorded yet: no family (a card series' absence says NVML is unread)
            return
        seconds = CounterMetricFamily(
            "gpupin_gpu_seconds",
            "GPU-seconds held per user, from the record (an open interval counts up to now).",
            labels=["user"],
        )
        joules = CounterMetricFamily(
            "gpupin_energy_joules",
            "Energy the cards drew for each user's intervals, joules (NVML's counter, shared among a card's holders).",
            labels=["user"],
        )
        for r in rows:
            seconds.add_metric([str(r.key)], r.gpu_seconds)
            if r.energy_j is not None:
                joules.add_metric([str(r.key)], r.energy_j)
        yield seconds
        yield joules


class Exposition:
    """The text to serve at each scrape: the view's families and the agent's own process (its memory, CPU)."""

    def __init__(self, agent: Agent) -> None:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector

        self.agent = agent
        self.content_type = CONTENT_TYPE_LATEST
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ViewCollector(agent))
        ProcessCollector(registry=self.registry)

    def text(self, scope: Scope) -> bytes:
        """This scrape's text: the view's families, then the record's per user that `scope` lets the caller see
        (a registry of this scrape's own: one text format, the families one after the other)."""
        from prometheus_client import CollectorRegistry, generate_latest

        per_user = CollectorRegistry(auto_describe=False)
        per_user.register(RecordCollector(self.agent, scope))
        return generate_latest(self.registry) + generate_latest(per_user)
