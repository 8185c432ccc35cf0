"""Every rule about a compose file's GPUs, each written once; `examine` runs them all for `check` and `render`.
`render` refuses on exactly the errors the rendered file would still have (`Problem.refuses_render`); the rest
are problems of the file as written, which rendering fixes. The rules: docs/compose.md, "One set of rules for
`check` and `render`".
"""

from __future__ import annotations

import re

from gpupin.core.contract import EXPECT_VAR, LABEL, NVD_VAR, SHARED_LABEL, VERIFY_VAR, picks_devices
from gpupin.core.errors import EX_UNAVAILABLE, GpupinError
from gpupin.core.expectation import parse_expect
from gpupin.core.identity import is_full_uuid, match_uuid
from gpupin.core.resolve import BUS_ID, INDEX, UUID, Target, form, resolve
from gpupin.hostagent import gpus
from gpupin.hostagent.compose import devicefiles
from gpupin.hostagent.compose.gpurequest import ALL, KEY, GpuRequest, lookalike
from gpupin.hostagent.compose.place import Assignment, bookings, place
from gpupin.hostagent.compose.problems import ERROR, WARNING, Problem, ServiceError, printable, quoted
from gpupin.hostagent.compose.request_forms import gpu_request
from gpupin.hostagent.compose.service import env_entries, label_entries, replicas, with_file_env
from gpupin.hostagent.pin import OWNED_LABELS, OWNED_VARS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card
    from gpupin.hostagent.ledger.holders import Holder
    from gpupin.hostagent.yamlfile import YAMLMapping

# The service names compose accepts (the compose specification's and docker-compose 1.29's pattern).
SERVICE_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_RENDER = "`hostagent compose render`"


class Examination:
    """What `examine` found: the problems, the requests, and the cards each service gets (the plan)."""

    def __init__(
        self,
        problems: Sequence[Problem],
        requests: Sequence[GpuRequest] = (),
        plan: Mapping[str, Sequence[Target]] | None = None,
        named: int = 0,
        counted: int = 0,
    ) -> None:
        self.problems = list(problems)
        self.requests = list(requests)
        self.plan = {k: list(v) for k, v in (plan or {}).items()}
        self.named = named  # distinct cards the file names
        self.counted = counted  # cards asked for by count, which render places

    @property
    def ok(self) -> bool:
        """`check` passes: no error (warnings allowed)."""
        return not any(p.severity == ERROR for p in self.problems)

    @property
    def refusals(self) -> list[Problem]:
        """What `render` refuses on."""
        return [p for p in self.problems if p.refuses_render]

    def summary(self) -> str:
        line = f"ok: {len(self.requests)} service(s) with GPUs, {self.named} card(s) pinned"
        if self.counted:
            line += f", {self.counted} more to be placed by {_RENDER} (count)"
        warnings = sum(p.severity == WARNING for p in self.problems)
        return line + (f" ({warnings} warning(s))" if warnings else "")


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "text", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__
    )


def services(doc: Any) -> YAMLMapping:
    """The `services` mapping of a compose document, or ServiceError(None, ...)."""
    if not isinstance(doc, dict):
        raise ServiceError(
            None,
            "it is not a compose file (its top level is not a mapping)",
            "a compose file is a mapping with a `services:` key",
        )
    svcs = doc.get("services")
    fix = "list the services under `services:`, each a mapping with `image:` and the rest"
    if svcs is None:
        raise ServiceError(None, "it has no `services:`", fix)
    if not isinstance(svcs, dict):
        raise ServiceError(None, f"`services` is {_kind(svcs)}, not a mapping", fix)
    if not svcs:
        raise ServiceError(None, "`services:` is empty", fix)
    return svcs


def name_problems(svcs: Mapping[Any, Any]) -> list[Problem]:
    """Service names compose would refuse, one problem each (a name is a key: a string in compose's pattern)."""
    problems: list[Problem] = []
    for name in svcs:
        if name is None:
            problems.append(Problem(None, "a service has no name (its key is empty or null)", "give it a name"))
        elif not isinstance(name, str):
            problems.append(
                Problem(
                    None,
                    f"the service name {quoted(name)} is not a string (YAML reads it as {_kind(name)})",
                    f"quote it: '{quoted(name, 40)}'",
                )
            )
        elif not SERVICE_NAME.fullmatch(name):
            problems.append(
                Problem(
                    None,
                    f"the service name {quoted(name)} has characters compose does not allow",
                    "use letters, digits, '.', '_' and '-'",
                )
            )
    return problems


# --- one service ------------------------------------------------------------------------------------------------


def resolve_named(req: GpuRequest, cards: Sequence[Card]) -> tuple[list[Target], list[Problem], bool]:
    """The cards a request names, in its order; the problems; whether every spec named a card that can be given.

    A standard form is also read as the NVIDIA runtime reads it as written: an index names another card after a
    hot-plug, a UUID prefix or a bus id without its domain is refused by the runtime (render writes full UUIDs)."""
    problems: list[Problem] = []
    good: list[str] = []
    for spec in req.specs:
        try:
            target = gpus.resolve_spec(spec, cards)
        except GpupinError as err:
            problems.append(Problem(req.service, err.message, err.hint, exit_code=err.exit_code))
            continue
        good.append(spec)
        if not req.form.standard:
            continue
        what, refused = f"{req.form.spec_name} {spec}", req.form.not_taken
        fix = f"write the card's UUID {target.uuid}, or let {_RENDER} pin it"
        written = form(spec)
        if written == INDEX:
            problems.append(
                Problem(
                    req.service,
                    f"{what} is an NVML index: today it is {target.describe()}, but "
                    "indices follow PCI bus order and name another card after a card is added, "
                    "removed or lost",
                    f"pin it by UUID: {req.form.by_uuid(target.uuid)} (or "
                    f"`{KEY}: {{gpus: [{target.uuid}]}}` and render)",
                    render_fixes=True,
                )
            )
        elif written == UUID and not is_full_uuid(spec.strip()):
            problems.append(Problem(req.service, f"{what} is a UUID prefix, {refused}", fix, render_fixes=True))
        elif written == BUS_ID and spec.count(":") < 2:
            problems.append(
                Problem(req.service, f"{what} is a bus id without its PCI domain, {refused}", fix, render_fixes=True)
            )
    try:
        targets = gpus.resolve_specs(good, cards)  # the resolver's own rule: a card asked for twice
    except GpupinError as err:
        problems.append(Problem(req.service, err.message, err.hint, exit_code=err.exit_code))
        return [], problems, False
    return targets, problems, len(good) == len(req.specs)


def compose_version_rules(req: GpuRequest) -> list[Problem]:
    """A form that only newer compose versions read: what an older one does with the file as written."""
    if req.form.older_compose is None:
        return []
    return [
        Problem(
            req.service,
            f"asks for GPUs with {req.form.name}: {req.form.older_compose}",
            f"let {_RENDER} write the device request, which every compose version reads",
            WARNING,
            render_fixes=True,
        )
    ]


def every_card(cards: Sequence[Card]) -> list[Target]:
    """`count: all`: every whole card that can be handed out, in NVML order (as Docker gives them)."""
    return [Target(c) for c in cards if c.error is None and c.uuid and not c.mig_mode]


def owned_rules(
    req: GpuRequest, env: Mapping[str, str | None], labels: Mapping[str, str], fix: str | None = None
) -> list[Problem]:
    """The pin's variables and labels beside `x-gpupin` or a count, where no one can know the cards by hand. `fix`
    replaces the hint where the cards come from elsewhere (a Swarm stack: from Swarm, in each task)."""
    if req.form.standard and req.count is not None and req.count != ALL:
        beside = f"beside a {req.describe_count()}, which names no card"
        owned_vars: Sequence[str] = OWNED_VARS
        owned_labels: Sequence[str] = (LABEL,)
        fix = fix or f"name the cards in device_ids, or remove it and let {_RENDER} write it"
    elif not req.form.standard:
        beside = f"beside `{KEY}`"
        owned_vars, owned_labels = OWNED_VARS, OWNED_LABELS
        fix = fix or "remove it: render writes it from the cards it pins"
    else:
        return []
    problems = [
        Problem(req.service, f"environment sets {var} by hand {beside}", fix) for var in owned_vars if var in env
    ]
    for label in owned_labels:
        if label in labels:
            hint = f"say it in `{KEY}` (share: true or false)" if label == SHARED_LABEL else f"{fix} (it is the ledger)"
            problems.append(Problem(req.service, f"sets the label {label} by hand {beside}", hint))
    if req.verify is not None and env.get(VERIFY_VAR) not in (None, req.verify):
        problems.append(
            Problem(
                req.service,
                f"environment sets {VERIFY_VAR}={quoted(env[VERIFY_VAR])} but {KEY}.verify is {req.verify}",
                f"keep one: {KEY}.verify (render writes {VERIFY_VAR} from it)",
            )
        )
    return problems


def device_var_rules(service: str, env: Mapping[str, str | None], pinned: bool) -> list[Problem]:
    """A variable the NVIDIA toolkit reads to pick the devices it exposes, set by hand: the container would get
    devices that no pin names and no ledger row explains (NVIDIA_VISIBLE_DEVICES is a request form's own:
    forms and agreement_rules judge it)."""
    out = []
    for var in sorted(v for v in env if picks_devices(v) and v != NVD_VAR):
        what = (
            "beside its pin, so it could get devices outside it"
            if pinned
            else "so the NVIDIA runtime may give it devices that no request names and nothing checks"
        )
        value = env[var]
        named = f"{var} (from the shell)" if value is None else f"{var}={quoted(value)}"
        out.append(
            Problem(
                service,
                f"environment sets {named}, which the NVIDIA toolkit reads to pick the devices it exposes, {what}",
                "remove it, and ask for the cards with a device request or `x-gpupin` (then "
                f"{_RENDER})"
                + (
                    " (on a Swarm, Swarm sets DOCKER_RESOURCE_* in each task)"
                    if var.startswith("DOCKER_RESOURCE_")
                    else ""
                ),
            )
        )
    return out


def _expectation(
    req: GpuRequest, value: str, targets: list[Target], cards: Sequence[Card]
) -> tuple[list[Target], list[Problem]]:
    """A hand-set GPUPIN_EXPECT beside named cards: the same cards at their bus ids, in the order it gives (its
    order is the local-rank order, so render keeps it)."""
    fix = f"let {_RENDER} write it, or list exactly the service's cards: {EXPECT_VAR}=" + ",".join(
        t.expect_entry() for t in targets
    )
    try:
        expectation = parse_expect(value)
    except GpupinError as err:
        return targets, [Problem(req.service, err.message, fix)]
    uuids = [c.uuid for c in cards if c.uuid] + [m.uuid for c in cards for m in c.mig_devices]
    named: list[str] = []
    problems: list[Problem] = []
    for e in expectation.cards:
        try:
            uuid = match_uuid(e.uuid, uuids)
        except GpupinError as err:
            problems.append(Problem(req.service, f"{EXPECT_VAR} names {e.uuid}: {err.message}", fix))
            continue
        named.append(uuid)
        at = resolve(uuid, cards).bus_id  # where it is, whatever its state (resolve_named judged that)
        if e.bus_id is not None and e.bus_id != at:
            problems.append(
                Problem(
                    req.service,
                    f"{EXPECT_VAR} puts {uuid} at {e.bus_id}, but it is at {at}: "
                    "the entrypoint will refuse to start (78)",
                    fix,
                )
            )
    if not problems and sorted(named) != sorted(t.uuid for t in targets):
        problems.append(
            Problem(
                req.service,
                f"{EXPECT_VAR} names {', '.join(named)} but the service is given "
                f"{', '.join(t.uuid for t in targets) or 'no card'}: the entrypoint will refuse to start (78)",
                fix,
            )
        )
    if problems:
        return targets, problems
    by_uuid = {t.uuid: t for t in targets}
    return [by_uuid[u] for u in named], []


def agreement_rules(
    req: GpuRequest,
    env: Mapping[str, str | None],
    labels: Mapping[str, str],
    targets: list[Target],
    cards: Sequence[Card],
) -> tuple[list[Target], list[Problem]]:
    """Where a standard form names its cards, what else names them by hand must name the same ones: two statements
    of which cards a service runs on, of which at most one can be right. Returns the cards in local-rank order."""
    if not req.form.standard or (req.count is not None and req.count != ALL):
        return targets, []
    problems: list[Problem] = []
    want = ",".join(t.uuid for t in targets)
    expect = env.get(EXPECT_VAR)
    if expect is not None:
        targets, problems = _expectation(req, expect, targets, cards)
    ledger = labels.get(LABEL)
    if ledger is not None and {u.strip() for u in ledger.split(",") if u.strip()} != {t.uuid for t in targets}:
        problems.append(
            Problem(
                req.service,
                f"the label {LABEL}={quoted(ledger)} is not the cards the service is given, so the ledger "
                "would be wrong about who holds which card",
                f"let {_RENDER} write it, or make it {want}",
            )
        )
    nvd = env.get(NVD_VAR)
    if nvd is not None and req.form.env_var != NVD_VAR:  # the runtime form's NVIDIA_VISIBLE_DEVICES is its request
        try:
            named = {gpus.resolve_spec(s.strip(), cards).uuid for s in nvd.split(",") if s.strip()}
        except GpupinError:
            named = set()
        if named != {t.uuid for t in targets}:
            problems.append(
                Problem(
                    req.service,
                    f"environment sets {NVD_VAR}={quoted(nvd)}, which disagrees with the device request",
                    f"remove it ({_RENDER} writes it), or make it {want}",
                )
            )
    return targets, problems


def _not_a_pin(req: GpuRequest, given: Sequence[Target]) -> Problem:
    first = ", ".join(f"{t.card.index} = {t.uuid}" for t in given)
    n = len(given) if req.count == ALL else req.count
    return Problem(
        req.service,
        f"{req.describe_count()} is not a pin: Docker gives the first {n} card(s) by index "
        f"({first}), whoever holds them, and nothing checks it inside the container",
        f"name the cards: `{KEY}: {{gpus: [...]}}` or `{KEY}: {{count: {max(n or 1, 1)}}}`, then {_RENDER}",
        WARNING,
        render_fixes=True,
    )


# --- the whole file ---------------------------------------------------------------------------------------------


def top_level_lookalikes(doc: Any) -> list[Problem]:
    """Top-level keys that look like x-gpupin (x-gpu-pin, x-gpupins...): a warning, since x-gpupin is read in a
    service, and a top-level x- key often only holds an anchor (in a service, a lookalike is an error:
    hostagent.compose.request_forms)."""
    if not isinstance(doc, dict):
        return []
    return [
        Problem(
            None,
            f"the top-level key `{printable(k)}` looks like `{KEY}`, which is read in a service, never at the top "
            "level",
            f"did you mean {KEY}? Put it in each service that needs cards (a top-level key may hold an anchor for "
            f"them: `{KEY}: *NAME` in the service)",
            WARNING,
        )
        for k in doc
        if lookalike(k)
    ]


def checked_services(doc: Any) -> tuple[YAMLMapping, list[Problem]]:
    """The document's services, or the problems that stop every further check (no services mapping, names
    compose would refuse): the first step of check, render and render --swarm alike."""
    try:
        svcs = services(doc)
    except ServiceError as err:
        return {}, [err.problem()]
    return svcs, name_problems(svcs)


def unknown_ledger(counted: int, unknown: str | None) -> list[Problem]:
    """A count cannot be placed while which cards are free is unknown (`unknown`: why the ledger was not read):
    render refuses it (69), and check reports it, one rule for both."""
    if unknown is None or not counted:
        return []
    return [
        Problem(
            None,
            f"the file asks for {counted} card(s) by count, which render places on free cards, but which cards "
            f"are free is unknown: {unknown}",
            "start Docker or set DOCKER_HOST, or name the cards",
            exit_code=EX_UNAVAILABLE,
        )
    ]


def examine(
    doc: Any,
    cards: Sequence[Card],
    busy: Mapping[str, Sequence[Holder]],
    unknown: str | None = None,
    file_env: Mapping[str, Mapping[str, str | None]] | None = None,
) -> Examination:
    """Every problem with a compose file's GPUs on this host, and the cards render gives each service; pure over
    the cards, the ledger (card UUID -> the running containers that hold it; `unknown`: why it was not read,
    None when it was) and `file_env` (service -> what its `env_file:` files set, under `environment`:
    hostagent.compose.project.Project.file_env)."""
    file_env = file_env or {}
    svcs, stop = checked_services(doc)
    if stop:
        return Examination(stop)
    problems: list[Problem] = []
    requests: list[GpuRequest] = []
    named: list[Assignment] = []
    counted: list[GpuRequest] = []
    as_written: list[Assignment] = []
    for name, svc in svcs.items():
        try:
            svc = with_file_env(svc, file_env.get(str(name)), name)
            req = gpu_request(name, svc)
            by_file = devicefiles.assignment(svc, name, cards)
            if by_file is not None:
                named.append(by_file)
                if req is None and replicas(svc, name) > 1:
                    problems.append(
                        Problem(
                            name,
                            f"asks for {replicas(svc, name)} replicas, and its device files "
                            "give every replica the same cards",
                            "make one service per replica, each with device files of its own",
                        )
                    )
            env = env_entries(svc, name)
            problems.extend(device_var_rules(name, env, req is not None))
            if req is None:
                continue
            requests.append(req)
            labels = label_entries(svc, name)
            n = replicas(svc, name)
        except ServiceError as err:
            problems.append(err.problem())
            continue
        if n > 1:
            problems.append(
                Problem(
                    name,
                    f"asks for {n} replicas of a pinned service: every replica would get the same cards",
                    "make one service per replica, each with its own cards (on a "
                    "Docker Swarm, `hostagent compose render --swarm` gives each replica its own)",
                )
            )
        problems.extend(owned_rules(req, env, labels))
        problems.extend(compose_version_rules(req))
        if req.count is None or req.count == ALL:
            if req.count is None:
                targets, found, complete = resolve_named(req, cards)
                problems.extend(found)
            else:
                targets, complete = every_card(cards), True
                problems.append(_not_a_pin(req, targets))
            if complete:
                targets, found = agreement_rules(req, env, labels, targets, cards)
                problems.extend(found)
                named.append(Assignment(req, targets))
            continue
        counted.append(req)
        if req.form.standard:  # as written, Docker gives a count the first cards by index
            given = every_card(cards)[: req.count]
            problems.append(_not_a_pin(req, given))
            as_written.append(Assignment(req, given, as_written=True))
    plan, placing = place(named, counted, cards, busy)
    problems.extend(placing)
    order = {name: i for i, name in enumerate(svcs)}
    written = sorted([*named, *as_written], key=lambda a: order[a.req.service])
    problems.extend(p for p in bookings(written, busy) if p.render_fixes)  # the rest came from place()
    problems.extend(unknown_ledger(sum(r.count or 0 for r in counted), unknown))
    problems.extend(top_level_lookalikes(doc))
    problems.sort(key=lambda p: order.get(p.service, -1) if p.service is not None else -1)
    return Examination(
        problems,
        requests,
        plan,
        len({t.uuid for a in named if a.pinned for t in a.targets}),
        sum(r.count or 0 for r in counted),
    )
