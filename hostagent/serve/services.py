"""Swarm services' bookings, kept by the agent whose daemon is a swarm manager: the booking is the service's, from
its creation, so a task started again keeps its service's end. At the end the service is stopped where Swarm keeps
it (a replicated one scaled to 0, a global one or a job removed): stopping a task's container would only make
Swarm start another (docs/policy.md, "Compose and Swarm").
"""

from __future__ import annotations

import threading
import time

from gpupin.core.errors import shown
from gpupin.hostagent.ledger.booking import FOR_LABEL, label_length, parse_duration
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.serve.interfaces import Agent

TICK_S = 1.0
MANAGER_S = 30.0


def end_of(service: DaemonAnswer, policy: Any) -> float | None:
    """When a service's own booking ends (seconds since the epoch), None when it has none or no end."""
    spec = service.get("Spec") or {}
    labels = ((spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}).get("Labels") or {}
    if FOR_LABEL not in labels:
        return None
    try:
        asked: float | None = parse_duration(labels[FOR_LABEL])
    except ValueError:
        asked = None
    length = label_length(policy, asked)
    if length is None:
        return None
    return created(service) + length


def stop(api: Any, service: DaemonAnswer) -> str:
    """Stop a service's tasks for good: replicated, scaled to 0; otherwise removed. What was done."""
    sid, spec = service["ID"], dict(service["Spec"])
    mode = spec.get("Mode") or {}
    if "Replicated" in mode:
        # The spec as read, at its version (docker-py's update_service rebuilds a spec from its arguments): a
        # change made meanwhile is a conflict, not overwritten.
        spec["Mode"] = {"Replicated": {**mode["Replicated"], "Replicas": 0}}
        params = {"version": service["Version"]["Index"]}
        from gpupin.hostagent.engine.unix import UnixClient

        if isinstance(api, UnixClient):
            api.call("POST", f"/services/{sid}/update", params, spec)
        else:
            res = api._post_json(api._url("/services/{0}/update", sid), data=spec, params=params)
            api._raise_for_status(res)
        return "scaled to 0"
    api.remove_service(sid)
    return "removed"


class Services:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._said = ""  # the last trouble said (said again only when it changes)

    def start(self) -> None:
        threading.Thread(target=self._watch, name="swarm-bookings", daemon=True).start()

    def _watch(self) -> None:
        from gpupin.hostagent import engine

        api: Any = None
        manager, asked_at = False, float("-inf")
        while not self.agent.stopping.wait(TICK_S):
            try:
                if api is None:
                    api = engine.connect(timeout=30)
                if time.monotonic() - asked_at > MANAGER_S:
                    asked_at = time.monotonic()
                    manager = bool((engine.info(api).get("Swarm") or {}).get("ControlAvailable"))
                if manager:
                    self.step(api, time.time())
            except Exception as err:  # a daemon away, a bug: said once, tried again at the next tick
                what = f"{type(err).__name__}: {getattr(err, 'message', err)}"
                if what != self._said:
                    self._said = what
                    say(f"swarm bookings: {what}")
                api = None

    def step(self, api: Any, now: float) -> None:
        """End the services whose booking has ended, once each (a service scaled up again is scaled down again)."""
        for service in api.services():
            end = end_of(service, self.agent.in_force.policy)
            mode = (service.get("Spec") or {}).get("Mode") or {}
            if end is None or end > now or (mode.get("Replicated") or {}).get("Replicas") == 0:
                continue
            name = shown(str((service.get("Spec") or {}).get("Name")))
            late = now - end
            done = stop(api, service)
            say(f"booking ended: swarm service {name} ({service['ID'][:12]}) {done}, {late:.2f}s after its end")
            _emit(self.agent, service, end, late, done)


def created(service: DaemonAnswer) -> float:
    """The service's CreatedAt: its booking's start."""
    from gpupin.hostagent import engine

    return engine.created_time(str(service.get("CreatedAt")))


def _emit(agent: Agent, service: DaemonAnswer, end: float, late: float, done: str) -> None:
    """booking.ended for a swarm service (docs/serve.md, "Notifications"): the service, not a container."""
    spec = service.get("Spec") or {}
    agent.hooks.emit(
        "booking.ended",
        {
            "service": {"id": service["ID"], "name": spec.get("Name"), "action": done},
            "booking": {"since": created(service), "until": end, "left_s": 0},
            "late_s": round(late, 3),
        },
    )
