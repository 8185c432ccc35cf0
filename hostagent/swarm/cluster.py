"""The swarm as a manager describes it, read through the Engine API: nodes and the generic resources each
advertises, tasks and what each holds or reserves, services' names, and placement constraints. `hostagent ls
--swarm` lists it; `hostagent compose render --swarm` checks that Swarm can place what a stack reserves. When a
task holds, and how constraints match, follow swarmkit (docs/swarm.md).
"""

from __future__ import annotations

import re

from gpupin.core.errors import UsageError
from gpupin.hostagent.swarm.resources import GenericResource, from_engine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

TASK_STATES = (
    "new",
    "allocated",
    "pending",
    "assigned",
    "accepted",
    "preparing",
    "ready",
    "starting",
    "running",
    "complete",
    "shutdown",
    "failed",
    "rejected",
    "remove",
    "orphaned",
)
WAITING = frozenset(TASK_STATES[:3])  # not placed yet: new, allocated, pending
HOLDING = frozenset(TASK_STATES[2:9])  # pending (a node given) to running: the scheduler counts its resources


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class Node:
    """One node of the swarm: who it is, whether Swarm may place tasks on it, and what it advertises."""

    __slots__ = (
        "addr",
        "arch",
        "availability",
        "engine_labels",
        "hostname",
        "id",
        "labels",
        "leader",
        "os",
        "resources",
        "role",
        "state",
    )

    def __init__(
        self,
        id: str,
        hostname: str,
        resources: Sequence[GenericResource] = (),
        role: str = "worker",
        availability: str = "active",
        state: str = "ready",
        addr: str = "",
        leader: bool = False,
        labels: Mapping[str, str] | None = None,
        engine_labels: Mapping[str, str] | None = None,
        os: str = "linux",
        arch: str = "x86_64",
    ) -> None:
        self.id = id
        self.hostname = hostname
        self.resources = list(resources)
        self.role = role
        self.availability = availability
        self.state = state
        self.addr = addr
        self.leader = leader
        self.labels = dict(labels or {})
        self.engine_labels = dict(engine_labels or {})
        self.os = os
        self.arch = arch

    @classmethod
    def from_engine(cls, n: Mapping[str, Any]) -> Node:
        """A node as `GET /nodes` describes it."""
        spec, desc, status = n.get("Spec") or {}, n.get("Description") or {}, n.get("Status") or {}
        platform, engine = desc.get("Platform") or {}, desc.get("Engine") or {}
        return cls(
            _text(n.get("ID")),
            _text(desc.get("Hostname")),
            from_engine((desc.get("Resources") or {}).get("GenericResources")),
            _text(spec.get("Role")) or "worker",
            _text(spec.get("Availability")) or "active",
            _text(status.get("State")) or "unknown",
            _text(status.get("Addr")),
            bool((n.get("ManagerStatus") or {}).get("Leader")),
            spec.get("Labels") or {},
            engine.get("Labels") or {},
            _text(platform.get("OS")),
            _text(platform.get("Architecture")),
        )

    @property
    def schedulable(self) -> bool:
        """Whether Swarm places new tasks here now (a drained, paused or down node takes none)."""
        return self.availability == "active" and self.state == "ready"

    def advertised(self, kind: str) -> list[GenericResource]:
        """The named resources of `kind` (what a discrete reservation of that kind draws from), and a discrete
        count of it as one entry."""
        return [r for r in self.resources if r.kind == kind]

    def count(self, kind: str) -> int:
        """How many of `kind` the node has in all (a discrete count, or the number of named ones)."""
        mine = self.advertised(kind)
        if len(mine) == 1 and mine[0].discrete:
            return int(mine[0].value)
        return sum(1 for r in mine if not r.discrete)

    def __repr__(self) -> str:
        return f"Node({self.hostname}, {self.role}, {self.availability}/{self.state}, {self.resources})"


class Task:
    """One task as `GET /tasks` describes it: its service, slot, node, state, and the resources it was given."""

    __slots__ = (
        "assigned",
        "container_id",
        "desired",
        "err",
        "id",
        "message",
        "node_id",
        "reserves",
        "service_id",
        "slot",
        "state",
    )

    def __init__(
        self,
        id: str,
        service_id: str,
        slot: int = 0,
        node_id: str = "",
        state: str = "new",
        desired: str = "running",
        assigned: Sequence[GenericResource] = (),
        reserves: Sequence[GenericResource] = (),
        err: str = "",
        message: str = "",
        container_id: str = "",
    ) -> None:
        self.id = id
        self.service_id = service_id
        self.slot = slot
        self.node_id = node_id
        self.state = state
        self.desired = desired
        self.assigned = list(assigned)
        self.reserves = list(reserves)
        self.err = err
        self.message = message
        self.container_id = container_id

    @classmethod
    def from_engine(cls, t: Mapping[str, Any]) -> Task:
        status = t.get("Status") or {}
        spec = t.get("Spec") or {}
        reservations = (spec.get("Resources") or {}).get("Reservations") or {}
        return cls(
            _text(t.get("ID")),
            _text(t.get("ServiceID")),
            int(t.get("Slot") or 0),
            _text(t.get("NodeID")),
            _text(status.get("State")) or "new",
            _text(t.get("DesiredState")) or "running",
            # What Swarm gave the task: `GenericResources` as the daemon sends it (moby's types/swarm Task;
            # measured on Engine 20.10), `AssignedGenericResources` as the API's swagger documents it.
            from_engine(t.get("GenericResources") or t.get("AssignedGenericResources")),
            from_engine(reservations.get("GenericResources")),
            _text(status.get("Err")),
            _text(status.get("Message")),
            _text((status.get("ContainerStatus") or {}).get("ContainerID")),
        )

    @property
    def holds(self) -> bool:
        """Whether the task's resources count as taken (Swarm gives them to no other task meanwhile)."""
        return bool(self.node_id) and self.state in HOLDING

    @property
    def waiting(self) -> bool:
        """A task Swarm means to run but has not placed: it waits for a node with the resources it reserves."""
        return self.state in WAITING and self.desired in ("running", "ready") and not self.node_id

    def name(self, service: str) -> str:
        """`docker service ps`'s name for it: SERVICE.SLOT (replicated), SERVICE.NODE_ID (global)."""
        return f"{service}.{self.slot if self.slot else self.node_id}"


# --- placement constraints -----------------------------------------------------------------------------------

_CONSTRAINT_KEY = re.compile(r"(?i)[a-z_][a-z0-9\-_.]+")


class Constraint:
    """One `deploy.placement.constraints` entry, `KEY == VALUE` or `KEY != VALUE`, as swarmkit reads it."""

    __slots__ = ("equal", "key", "value")

    def __init__(self, key: str, equal: bool, value: str) -> None:
        self.key = key
        self.equal = equal
        self.value = value

    @classmethod
    def parse(cls, text: str) -> Constraint:
        for op in ("==", "!="):
            if op in text:
                key, value = (part.strip() for part in text.split(op, 1))
                if not _CONSTRAINT_KEY.fullmatch(key) or not value:
                    break
                return cls(key, op == "==", value)
        raise UsageError(
            f"the placement constraint {text!r} is not KEY==VALUE or KEY!=VALUE",
            "write it as Swarm takes it, e.g. node.hostname==gpu-node-1 or node.labels.gpu!=none",
        )

    def _node_value(self, node: Node) -> str | None:
        key = self.key.lower()
        fixed = {
            "node.id": node.id,
            "node.hostname": node.hostname,
            "node.role": node.role,
            "node.platform.os": node.os,
            "node.platform.arch": node.arch,
        }
        if key in fixed:
            return fixed[key]
        for prefix, labels in (("node.labels.", node.labels), ("engine.labels.", node.engine_labels)):
            if key.startswith(prefix) and len(key) > len(prefix):
                return labels.get(self.key[len(prefix) :], "")  # the label's own name is case-sensitive
        return None

    def matches(self, node: Node) -> bool:
        if self.key.lower() == "node.ip":
            import ipaddress

            try:
                inside = ipaddress.ip_address(node.addr) in ipaddress.ip_network(self.value, strict=False)
            except ValueError:
                return False  # swarmkit rejects a malformed address or network
            return inside == self.equal
        value = self._node_value(node)
        if value is None:
            return False  # an unknown key matches no node
        return (value.lower() == self.value.lower()) == self.equal

    def __str__(self) -> str:
        return f"{self.key}{'==' if self.equal else '!='}{self.value}"


# --- reading it from a manager --------------------------------------------------------------------------------

NOT_A_MANAGER_HINT = "point DOCKER_HOST at a manager of the swarm (`docker node ls` works there)"


class Cluster:
    """What a manager knows of the swarm: the nodes, the tasks (every state, history included), and the services'
    names by ID."""

    __slots__ = ("nodes", "services", "tasks")

    def __init__(
        self, nodes: Sequence[Node], tasks: Sequence[Task] = (), services: Mapping[str, str] | None = None
    ) -> None:
        self.nodes = list(nodes)
        self.tasks = list(tasks)
        self.services = dict(services or {})


def _not_a_manager(api: Any) -> None:
    """Raise the one line that says what the daemon is, when it is no manager (its /info: ~40 ms, so asked only
    after a list was refused; `docker node ls` asks it every time)."""
    from gpupin.core.errors import DockerUnavailableError
    from gpupin.hostagent import engine

    swarm = engine.fetch(api, "/info")[0].get("Swarm") or {}
    state = swarm.get("LocalNodeState") or "inactive"
    if state == "active" and swarm.get("ControlAvailable"):
        return
    what = (
        f"a worker of a swarm (node {swarm.get('NodeID')})"
        if state == "active"
        else f"in no swarm (its swarm state is {state})"
    )
    raise DockerUnavailableError(
        f"the Docker daemon at {engine.docker_host()} is not a swarm manager: it is {what}", NOT_A_MANAGER_HINT
    )


def read(api: Any, tasks: bool = True) -> Cluster:
    """The swarm as the manager behind `api` (hostagent.engine.reads) describes it; DockerUnavailableError (69)
    when that daemon is no manager, in one line that says what it is."""
    from gpupin.core.errors import DockerUnavailableError
    from gpupin.hostagent import engine

    try:
        raw = engine.fetch(api, "/nodes")[0]
    except DockerUnavailableError:  # a worker, or a daemon in no swarm, answers 503
        _not_a_manager(api)
        raise
    nodes = [Node.from_engine(n) for n in raw]
    if not tasks:
        return Cluster(nodes)
    found = [Task.from_engine(t) for t in engine.fetch(api, "/tasks")[0]]
    services = {_text(s.get("ID")): _text((s.get("Spec") or {}).get("Name")) for s in engine.fetch(api, "/services")[0]}
    return Cluster(nodes, found, services)
