"""Docker Swarm's generic resources, as a GPU node advertises them, matched to the cards NVML sees.

A node advertises each card as a named generic resource (`node-generic-resources` in daemon.json, one
`KIND=UUID` per card); Swarm's accounting hands each one to one task at a time and gives the task
`DOCKER_RESOURCE_<KIND>=<UUID>[,...]`, which the NVIDIA runtime reads only when its `swarm-resource`
setting names that variable. This module is the pure core of that contract: parsing the two spellings of a
node's resources (daemon.json's strings and the engine's node description), the variable a kind becomes, what
a host should advertise (cards, or their MIG devices where MIG is on), and which card each advertised value
is. `hostagent swarm node-config` builds on it. The swarm as a manager describes it (nodes, tasks, placement
constraints, read through the Engine API) is here too: `hostagent ls --swarm` lists it, and
`hostagent compose render --swarm` checks that Swarm can place what a stack reserves.

Checked against the sources: swarmkit's `api/genericresource` (Parse: `KIND=VALUE` terms, trimmed, grouped
by kind; a kind with one integer value is a discrete count, a kind whose values are all non-integers is a set
of named resources, anything else is refused; EnvFormat: `strings.ToUpper("DOCKER_RESOURCE_" + kind)`, the
values joined by commas).
"""

from __future__ import annotations

import re

from gpupin.core.errors import GpuSpecError, UsageError
from gpupin.core.identity import is_full_uuid, is_uuid_like
from gpupin.core.resolve import Target, resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card

DEFAULT_KIND = "GPU"
DAEMON_JSON = "/etc/docker/daemon.json"
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
RUNTIME_PATH = "nvidia-container-runtime"  # what `nvidia-ctk runtime configure --runtime=docker` writes
ENV_PREFIX = "DOCKER_RESOURCE_"
# What `docker service create --generic-resource` and daemon.json accept as a kind without surprises: no `=`
# or `,` (the separators), no blanks (trimmed away), nothing a shell or an env file would mangle.
_KIND = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_KIND_HINT = "a kind is letters, digits, '_', '.' and '-' (GPU is what the NVIDIA toolkit's default reads)"


class GenericResourceError(UsageError):
    """Generic resources that Docker itself would refuse to parse (exit 64)."""


def check_kind(kind: str) -> str:
    if not _KIND.fullmatch(kind):
        raise UsageError(f"{kind!r} is not a usable generic resource kind", _KIND_HINT)
    return kind


def env_var(kind: str) -> str:
    """The variable Swarm gives a task for the resources of `kind` (swarmkit's EnvFormat)."""
    return (ENV_PREFIX + kind).upper()


class GenericResource:
    """One generic resource of a node: a named one (`GPU=GPU-1c5e...`) or a discrete count (`GPU=4`)."""

    __slots__ = ("discrete", "kind", "value")

    def __init__(self, kind: str, value: str, discrete: bool = False) -> None:
        self.kind = kind
        self.value = value
        self.discrete = discrete

    @property
    def term(self) -> str:
        """The daemon.json spelling."""
        return f"{self.kind}={self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GenericResource) and (self.kind, self.value, self.discrete) == (
            other.kind, other.value, other.discrete)

    def __hash__(self) -> int:
        return hash((self.kind, self.value, self.discrete))

    def __repr__(self) -> str:
        return f"GenericResource({self.term}{', discrete' if self.discrete else ''})"


def _is_int(text: str) -> bool:
    try:
        int(text, 10)
    except ValueError:
        return False
    return True


def parse_terms(terms: Iterable[str], source: str = "node-generic-resources") -> list[GenericResource]:
    """Parse daemon.json's `node-generic-resources` (or dockerd's `--node-generic-resource` values) as swarmkit
    does; raise GenericResourceError where dockerd would refuse to start. The order of the terms is kept."""
    by_kind: dict[str, list[str]] = {}
    for term in terms:
        if not isinstance(term, str):
            raise GenericResourceError(f"{source}: {term!r} is not a string", 'write each as "KIND=VALUE"')
        parts = term.split("=")
        if len(parts) != 2:
            raise GenericResourceError(f"{source}: {term!r} is not KIND=VALUE",
                                       'write each resource as "GPU=GPU-<uuid>", one per card')
        by_kind.setdefault(parts[0].strip(), []).append(parts[1].strip())
    out: list[GenericResource] = []
    for kind, values in by_kind.items():
        if len(values) == 1 and _is_int(values[0]):
            if int(values[0]) < 0:
                raise GenericResourceError(f"{source}: {kind}={values[0]} is a negative count",
                                           f"advertise one {kind}=<UUID> per card")
            out.append(GenericResource(kind, values[0], discrete=True))
        elif not any(_is_int(v) for v in values):
            out.extend(GenericResource(kind, v) for v in values)
        else:
            raise GenericResourceError(
                f"{source}: {kind} mixes counts and names ({', '.join(values)})",
                f"name each card by UUID: {kind}=GPU-<uuid>")
    return out


def from_engine(resources: Iterable[Mapping[str, Any]] | None) -> list[GenericResource]:
    """A node's resources as the engine describes them (`docker node inspect`:
    .Description.Resources.GenericResources, or what Swarm gave a task)."""
    out: list[GenericResource] = []
    for r in resources or ():
        named, discrete = r.get("NamedResourceSpec"), r.get("DiscreteResourceSpec")
        if isinstance(named, dict):
            out.append(GenericResource(str(named.get("Kind", "")), str(named.get("Value", ""))))
        elif isinstance(discrete, dict):
            out.append(GenericResource(str(discrete.get("Kind", "")), str(discrete.get("Value", 0)), True))
    return out


def describe(target: Target) -> dict[str, Any]:
    """A card or MIG device as the JSON outputs show it."""
    return {"uuid": target.uuid, "index": target.card.index, "bus_id": str(target.card.bus_id),
            "name": target.name, "parent": target.card.uuid if target.mig is not None else None}


def advertisable(cards: Sequence[Card]) -> tuple[list[Target], list[tuple[Card, str]]]:
    """What a node should advertise, in NVML order: each whole card, or, for a card in MIG mode, each of its MIG
    devices (the whole card is no CUDA device then). Also the cards left out, each with why."""
    adverts: list[Target] = []
    skipped: list[tuple[Card, str]] = []
    for card in cards:
        if card.error is not None or card.uuid is None:
            skipped.append((card, f"NVML cannot read it: {card.error}"))
        elif card.mig_mode:
            if not card.mig_devices:
                skipped.append((card, "MIG mode is on but no MIG device is configured"))
            adverts.extend(Target(card, m) for m in card.mig_devices)
        else:
            adverts.append(Target(card))
    return adverts, skipped


def names_a_gpu(value: str) -> bool:
    """Whether a resource value is meant as a GPU or MIG UUID (full, or a prefix of one)."""
    return is_uuid_like(value)


def lookup(value: str, cards: Sequence[Card]) -> Target | None:
    """The card or MIG device a full UUID names on this host (the shared resolver's rules), or None. A prefix names
    nothing here: the runtime takes only full UUIDs."""
    if not is_full_uuid(value):
        return None
    try:
        return resolve(value, cards)
    except GpuSpecError:
        return None


def gpu_kinds(resources: Iterable[GenericResource]) -> list[str]:
    """The kinds (in order of appearance) under which a node advertises GPU or MIG UUIDs."""
    kinds: list[str] = []
    for r in resources:
        if not r.discrete and names_a_gpu(r.value) and r.kind not in kinds:
            kinds.append(r.kind)
    return kinds


# --- the swarm as a manager describes it: nodes, tasks, services ----------------------------------------------
# Checked against moby's api/types/swarm (Node, Task, Service) and swarmkit: the scheduler counts a task's
# resources as taken from the moment it is assigned a node until it is past running (manager/scheduler
# setupTasksList: "Ignore all tasks that have not reached PENDING state and tasks that no longer consume
# resources"); placement constraints are swarmkit's manager/constraint (== and !=, case-insensitive values,
# node.labels/engine.labels with the label name as written, an unknown key matches no node).

TASK_STATES = ("new", "allocated", "pending", "assigned", "accepted", "preparing", "ready", "starting", "running",
               "complete", "shutdown", "failed", "rejected", "remove", "orphaned")
WAITING = frozenset(TASK_STATES[:3])  # not placed yet: new, allocated, pending
HOLDING = frozenset(TASK_STATES[2:9])  # pending (a node given) to running: the scheduler counts its resources


def _text(value: Any) -> str:
    return "" if value is None else str(value)


class Node:
    """One node of the swarm: who it is, whether Swarm may place tasks on it, and what it advertises."""

    __slots__ = ("addr", "arch", "availability", "engine_labels", "hostname", "id", "labels", "leader", "os",
                 "resources", "role", "state")

    def __init__(self, id: str, hostname: str, resources: Sequence[GenericResource] = (), role: str = "worker",
                 availability: str = "active", state: str = "ready", addr: str = "", leader: bool = False,
                 labels: Mapping[str, str] | None = None, engine_labels: Mapping[str, str] | None = None,
                 os: str = "linux", arch: str = "x86_64") -> None:
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
        return cls(_text(n.get("ID")), _text(desc.get("Hostname")),
                   from_engine((desc.get("Resources") or {}).get("GenericResources")),
                   _text(spec.get("Role")) or "worker", _text(spec.get("Availability")) or "active",
                   _text(status.get("State")) or "unknown", _text(status.get("Addr")),
                   bool((n.get("ManagerStatus") or {}).get("Leader")), spec.get("Labels") or {},
                   engine.get("Labels") or {}, _text(platform.get("OS")), _text(platform.get("Architecture")))

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

    __slots__ = ("assigned", "container_id", "desired", "err", "id", "message", "node_id", "reserves", "service_id",
                 "slot", "state")

    def __init__(self, id: str, service_id: str, slot: int = 0, node_id: str = "", state: str = "new",
                 desired: str = "running", assigned: Sequence[GenericResource] = (),
                 reserves: Sequence[GenericResource] = (), err: str = "", message: str = "",
                 container_id: str = "") -> None:
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
        return cls(_text(t.get("ID")), _text(t.get("ServiceID")), int(t.get("Slot") or 0), _text(t.get("NodeID")),
                   _text(status.get("State")) or "new", _text(t.get("DesiredState")) or "running",
                   # What Swarm gave the task: `GenericResources` as the daemon sends it (moby's types/swarm Task;
                   # measured on Engine 20.10), `AssignedGenericResources` as the API's swagger documents it.
                   from_engine(t.get("GenericResources") or t.get("AssignedGenericResources")),
                   from_engine(reservations.get("GenericResources")),
                   _text(status.get("Err")), _text(status.get("Message")),
                   _text((status.get("ContainerStatus") or {}).get("ContainerID")))

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
        raise UsageError(f"the placement constraint {text!r} is not KEY==VALUE or KEY!=VALUE",
                         "write it as Swarm takes it, e.g. node.hostname==gpu-node-1 or node.labels.gpu!=none")

    def _node_value(self, node: Node) -> str | None:
        key = self.key.lower()
        fixed = {"node.id": node.id, "node.hostname": node.hostname, "node.role": node.role,
                 "node.platform.os": node.os, "node.platform.arch": node.arch}
        if key in fixed:
            return fixed[key]
        for prefix, labels in (("node.labels.", node.labels), ("engine.labels.", node.engine_labels)):
            if key.startswith(prefix) and len(key) > len(prefix):
                return labels.get(self.key[len(prefix):], "")  # the label's own name is case-sensitive
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

    def __init__(self, nodes: Sequence[Node], tasks: Sequence[Task] = (), services: Mapping[str, str] | None = None
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
    what = (f"a worker of a swarm (node {swarm.get('NodeID')})" if state == "active" else
            f"in no swarm (its swarm state is {state})")
    raise DockerUnavailableError(f"the Docker daemon at {engine.docker_host()} is not a swarm manager: it is {what}",
                                 NOT_A_MANAGER_HINT)


def read(api: Any, tasks: bool = True) -> Cluster:
    """The swarm as the manager behind `api` (hostagent.engine.reader) describes it; DockerUnavailableError (69)
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
