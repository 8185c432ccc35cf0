"""`hostagent compose render --swarm`: a compose file as a Docker Swarm stack whose GPU services reserve cards.

Swarm, not render, places the tasks, and a task can reserve only a number of generic resources, never named
cards: each count becomes `generic_resources` per task, and gpupin-entrypoint proves the cards Swarm sets in
DOCKER_RESOURCE_<KIND>. Named cards, `all` and sharing are refused; so is what no node could place, when the
swarm can be read (docs/compose.md, "Docker Swarm"; docs/swarm.md).
"""

from __future__ import annotations

import copy
import os
import re

from gpupin.core.errors import GpupinError
from gpupin.hostagent.compose import booking
from gpupin.hostagent.compose.gpurequest import ALL, KEY, GpuRequest
from gpupin.hostagent.compose.problems import WARNING, Problem, RenderRefused, ServiceError, printable, quoted
from gpupin.hostagent.compose.render import set_entries
from gpupin.hostagent.compose.request_forms import DeployDevices, XGpupin, gpu_request
from gpupin.hostagent.compose.rules import checked_services, device_var_rules, owned_rules, top_level_lookalikes
from gpupin.hostagent.compose.service import (
    device_list,
    env_entries,
    label_entries,
    mapping,
    replicas,
    reservations,
    reserved_list,
    with_file_env,
)
from gpupin.hostagent.ledger.booking import FOR_LABEL
from gpupin.hostagent.pin import Reservation
from gpupin.hostagent.swarm.cluster import Constraint
from gpupin.hostagent.swarm.resources import gpu_kinds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.hostagent.swarm.cluster import Node
    from gpupin.hostagent.yamlfile import YAMLMapping

DEFAULT_VERSION = "3.8"  # the newest format Docker 19.03's CLI takes; Debian 12's 20.10 takes it too
MIN_VERSION = (3, 5)  # deploy.resources.reservations.generic_resources arrived in format 3.5
_GENERIC = "deploy.resources.reservations.generic_resources"
_SWARM_NAMES = "remove it: Swarm names each task's cards (DOCKER_RESOURCE_<KIND>), and gpupin-entrypoint proves them"
_COUNT_HINT = f"ask for a number of cards per task: `{KEY}: {{count: N}}` (and `deploy.replicas` for more tasks)"


class StackService:
    """One service that reserves cards: how many per task, of which kind, how many tasks, where it may run, and
    where the request was written."""

    __slots__ = ("constraints", "global_mode", "replicas", "req", "reservation", "service", "written")

    def __init__(
        self,
        service: str,
        reservation: Reservation,
        replicas: int,
        global_mode: bool,
        constraints: Sequence[Constraint],
        req: GpuRequest | None,
        written: bool,
    ) -> None:
        self.service = service
        self.reservation = reservation
        self.replicas = replicas
        self.global_mode = global_mode
        self.constraints = list(constraints)
        self.req = req  # the compose request it came from; None: a generic_resources reservation already there
        self.written = written  # the reservation is already in the file

    def describe(self) -> str:
        tasks = "one task per node" if self.global_mode else f"{self.replicas} replica(s)"
        return f"{tasks} x {self.reservation.count} {self.reservation.kind}"


class StackExamination:
    """What `examine` found: problems (refusals and warnings), the services that reserve cards, the file's notes."""

    def __init__(
        self,
        problems: Sequence[Problem],
        reserving: Sequence[StackService] = (),
        notes: Sequence[str] = (),
        version: str | None = None,
    ) -> None:
        self.problems = list(problems)
        self.reserving = list(reserving)
        self.notes = list(notes)
        self.version = version  # the version the rendered file gets (None: keep it)

    @property
    def refusals(self) -> list[Problem]:
        return [p for p in self.problems if p.refuses_render]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]


# --- the file ----------------------------------------------------------------------------------------------------


def version_rule(doc: YAMLMapping) -> tuple[str | None, list[str], list[Problem]]:
    """(the version to write, notes, problems): stack deploy takes format 3; generic_resources need 3.5."""
    raw = doc.get("version")
    if raw is None:
        return (
            DEFAULT_VERSION,
            [
                f"the file has no `version`; it gets {DEFAULT_VERSION}, which `docker stack "
                "deploy` needs (Docker 20.10's CLI reads a file without one as format 1)"
            ],
            [],
        )
    m = re.fullmatch(r"\s*([0-9]+)(?:\.([0-9]+))?\s*", str(raw))
    if m is None:
        return (
            None,
            [],
            [
                Problem(
                    None, f"`version: {quoted(raw)}` is no compose file format", f"write version: '{DEFAULT_VERSION}'"
                )
            ],
        )
    found = (int(m.group(1)), int(m.group(2) or 0))
    if found[0] < 3:
        return (
            None,
            [],
            [
                Problem(
                    None,
                    f"`version: {quoted(raw)}` is a format {found[0]} file, which `docker stack deploy` does not take",
                    f"make it version: '{DEFAULT_VERSION}' (format 3 moves "
                    "limits and reservations under deploy.resources)",
                )
            ],
        )
    if found < MIN_VERSION:
        want = "{}.{}".format(*MIN_VERSION)
        return want, [f"`version: {printable(str(raw))}` becomes {want}, the first format with {_GENERIC}"], []
    return None, [], []


# --- one service -------------------------------------------------------------------------------------------------


def _generic(svc: Any, service: str) -> list[Any]:
    """deploy.resources.reservations.generic_resources as written (a list, or ServiceError)."""
    found = reservations(svc, service).get("generic_resources")
    if found is None:
        return []
    if not isinstance(found, list):
        raise ServiceError(
            service,
            f"`{_GENERIC}` is not a list",
            "write it as a list of {discrete_resource_spec: {kind: KIND, value: N}}",
        )
    return found


def _written_counts(svc: Any, service: str, kind: str) -> list[int]:
    """The counts of `kind` the service already reserves (discrete_resource_spec entries of that kind)."""
    counts = []
    for entry in _generic(svc, service):
        spec = entry.get("discrete_resource_spec") if isinstance(entry, dict) else None
        if not isinstance(spec, dict) or str(spec.get("kind")) != kind:
            continue
        value = spec.get("value")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ServiceError(
                service,
                f"{_GENERIC} reserves {kind} {quoted(value)}, which is not a number of cards >= 1",
                "give a whole number",
            )
        counts.append(value)
    return counts


def _constraints(svc: Any, service: str) -> list[Constraint]:
    deploy = mapping(svc.get("deploy"), service, "deploy")
    placement = mapping(deploy.get("placement"), service, "deploy.placement")
    raw = placement.get("constraints") or []
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise ServiceError(
            service,
            "`deploy.placement.constraints` is not a list of text",
            "write each as KEY==VALUE or KEY!=VALUE, e.g. node.hostname==gpu-node-1",
        )
    try:
        return [Constraint.parse(c) for c in raw]
    except GpupinError as err:
        raise ServiceError.wrap(service, err) from None


def _global(svc: Any, service: str) -> bool:
    mode = mapping(svc.get("deploy"), service, "deploy").get("mode", "replicated")
    if mode not in ("replicated", "global"):
        raise ServiceError(
            service,
            f"`deploy.mode: {quoted(mode)}` is neither replicated nor global",
            "Swarm places replicated services (deploy.replicas) or one task per node (global)",
        )
    return bool(mode == "global")


def _request_rules(req: GpuRequest) -> list[Problem]:
    """What a compose request asks that Swarm cannot give."""
    out = []
    if req.count is None:
        out.append(
            Problem(
                req.service,
                f"{req.form.name} names cards ({', '.join(req.specs)}), but a Swarm task "
                "reserves a number of cards, never named ones: Swarm picks them among those its node "
                f"advertises",
                f"{_COUNT_HINT}; to choose the node, add deploy.placement.constraints: [node.hostname==NAME]",
            )
        )
    elif req.count == ALL:
        out.append(
            Problem(req.service, f"{req.form.name} asks for every card, which a Swarm task cannot reserve", _COUNT_HINT)
        )
    if req.share:
        out.append(
            Problem(
                req.service,
                "asks to share its cards, but Swarm never gives a reserved card to two tasks",
                "remove share (each task gets cards of its own), or run the sharing work outside Swarm",
            )
        )
    return out


def read_service(name: str, svc: Any, kind: str) -> tuple[StackService | None, list[Problem]]:
    """The reservation one service makes, or None, and the problems with it."""
    req = gpu_request(name, svc)
    written = _written_counts(svc, name, kind)
    if req is None and not written:
        return None, []
    if req is not None and written:
        raise ServiceError(
            name,
            f"asks for GPUs twice: {req.form.name} and {_GENERIC} ({kind})",
            f"keep one (`{KEY}: {{count: N}}`, which render turns into the reservation)",
        )
    if len(written) > 1:
        raise ServiceError(name, f"reserves {kind} {len(written)} times in {_GENERIC}", "write one entry per kind")
    env, labels = env_entries(svc, name), label_entries(svc, name)
    n, global_mode, constraints = replicas(svc, name), _global(svc, name), _constraints(svc, name)
    if req is None:
        return StackService(name, Reservation(written[0], kind), n, global_mode, constraints, None, True), []
    problems = _request_rules(req) + owned_rules(req, env, labels, _SWARM_NAMES)
    if req.count is None or req.count == ALL:
        return None, problems
    return StackService(
        name, Reservation(req.count, kind, req.verify), n, global_mode, constraints, req, False
    ), problems


# --- what Swarm can place ------------------------------------------------------------------------------------------


def _counts(nodes: Sequence[Node], kind: str) -> str:
    return ", ".join(f"{n.hostname}: {n.count(kind)}" for n in nodes) or "no node"


def placement_rules(s: StackService, nodes: Sequence[Node]) -> list[Problem]:
    """Refuse what Swarm could never place; warn of tasks that would stay pending even on an idle swarm."""
    kind, count = s.reservation.kind, s.reservation.count
    if not any(n.count(kind) for n in nodes):
        kinds = gpu_kinds(r for n in nodes for r in n.resources)
        hint = (
            f"render with --kind {kinds[0]} (and check those nodes with `hostagent swarm node-config --check`: "
            f"their runtime must read DOCKER_RESOURCE_{kinds[0].upper()})"
            if kinds
            else "advertise each GPU node's cards: `hostagent swarm node-config` there"
        )
        where = ", ".join(f"{n.hostname}: {'/'.join(gpu_kinds(n.resources)) or 'none'}" for n in nodes)
        return [
            Problem(
                s.service,
                f"reserves {count} {kind} per task, but no node of the swarm advertises {kind} "
                f"(GPU kinds advertised: {where or 'no node'})",
                hint,
            )
        ]
    allowed = [n for n in nodes if all(c.matches(n) for c in s.constraints)]
    limit = f"its placement constraints allow ({', '.join(map(str, s.constraints))}) " if s.constraints else ""
    best = max((n.count(kind) for n in allowed), default=0)
    if count > best:
        hint = f"ask for at most {best} per task and more replicas" if best else "loosen the placement constraints"
        if s.constraints and best:
            hint += ", or loosen the placement constraints"
        return [
            Problem(
                s.service,
                f"reserves {count} {kind} per task, but the most any node {limit}has is {best} "
                f"({_counts(allowed, kind)})",
                hint,
            )
        ]
    if s.global_mode:
        short = [n.hostname for n in allowed if n.count(kind) < count]
        if short:
            return [
                Problem(
                    s.service,
                    f"is global (a task on every node it may run on), but {', '.join(short)} "
                    f"advertise(s) fewer than {count} {kind}: those tasks stay pending",
                    "add a placement constraint that keeps it to the GPU nodes (node.labels.* or node.hostname)",
                    WARNING,
                )
            ]
        return []
    fits = sum(n.count(kind) // count for n in allowed if n.schedulable)
    if s.replicas > fits:
        return [
            Problem(
                s.service,
                f"asks for {s.describe()}, but the nodes it may run on now hold {fits} such "
                f"task(s) at a time ({_counts([n for n in allowed if n.schedulable], kind)}): "
                f"{s.replicas - fits} will stay pending",
                "lower deploy.replicas, or add nodes",
                WARNING,
            )
        ]
    return []


# --- the whole file ------------------------------------------------------------------------------------------------


def examine(
    doc: Any, kind: str, nodes: Sequence[Node] | None, file_env: Mapping[str, Mapping[str, str | None]] | None = None
) -> StackExamination:
    """Every problem with a stack's GPU reservations, and the services that make them; `nodes` None: the swarm
    was not read, so what it can place is not checked; `file_env` as hostagent.compose.rules.examine takes it."""
    svcs, stop = checked_services(doc)
    if stop:
        return StackExamination(stop)
    version, notes, problems = version_rule(doc)
    problems = problems + top_level_lookalikes(doc)
    reserving: list[StackService] = []
    for name, svc in svcs.items():
        try:
            svc = with_file_env(svc, (file_env or {}).get(str(name)), name)
            found, problems_of = read_service(name, svc, kind)
            asks = found is not None or gpu_request(name, svc) is not None
            problems_of = device_var_rules(name, env_entries(svc, name), asks) + problems_of
        except ServiceError as err:
            problems.append(err.problem())
            continue
        problems.extend(problems_of)
        if found is None:
            continue
        reserving.append(found)
        if nodes is not None:
            problems.extend(placement_rules(found, nodes))
    return StackExamination(problems, reserving, notes, version)


def _apply(svc: YAMLMapping, s: StackService) -> None:
    """The reservation in place of the request, and the pin's environment."""
    form = s.req.form if s.req is not None else None
    length = booking.asked(s.service, svc)  # before the form's key goes: the task's label, from its service
    if length is not None:
        set_entries(svc, "labels", {FOR_LABEL: length})
    if isinstance(form, XGpupin):
        svc.pop(KEY, None)
    elif isinstance(form, DeployDevices):  # docker stack deploy takes no device request (format 3 has none)
        assert s.req is not None and s.req.device_index is not None
        devices = device_list(svc)
        del devices[s.req.device_index]
        if not devices:
            del svc["deploy"]["resources"]["reservations"]["devices"]
    if not s.written:
        reserved_list(svc, "generic_resources", create=True).append(s.reservation.generic_resource())
    set_entries(svc, "environment", s.reservation.env())


def render(
    doc: Any, kind: str, nodes: Sequence[Node] | None, file_env: Mapping[str, Mapping[str, str | None]] | None = None
) -> tuple[YAMLMapping, StackExamination]:
    """The stack and what `examine` found; RenderRefused with every refusal when there is one."""
    exam = examine(doc, kind, nodes, file_env)
    if exam.refusals:
        raise RenderRefused(exam.refusals)
    out: YAMLMapping = copy.deepcopy(dict(doc))
    if exam.version is not None:
        out = {"version": exam.version, **{k: v for k, v in out.items() if k != "version"}}
    for s in exam.reserving:
        _apply(out["services"][s.service], s)
    return out, exam


def header(file: str, exam: StackExamination) -> str:
    lines = [
        f"# Rendered by `hostagent compose render --swarm {printable(os.path.basename(file))}` for Docker "
        "Swarm: each task reserves its",
        "# cards as generic resources; Swarm picks them and sets DOCKER_RESOURCE_<KIND>, which gpupin-entrypoint",
        "# proves inside the task. Deploy: docker stack deploy -c THIS_FILE STACK. Re-render; do not edit.",
    ]
    lines += [f"#   {s.service}: {s.describe()}" for s in exam.reserving]
    return "\n".join(lines) + "\n"
