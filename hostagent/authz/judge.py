"""The rules of the authorization plugin, written once: what a request asks (gpupin.hostagent.authz.request) read
with the ledger's holding forms, against the policy's `[enforce]` table. `first_look` is what the plugin decides
alone (no ledger, no agent: a non-GPU request never waits on either); `judge` is the agent's, with who holds which
card and the grants. Under mode `warn` a denial is logged and the request allowed.
"""

from __future__ import annotations

from gpupin.core.contract import NONE, NVD_VAR, VOID, picks_devices
from gpupin.core.errors import shown
from gpupin.hostagent.authz import PROBE, request
from gpupin.hostagent.authz.grant import LABEL, GrantRefused
from gpupin.hostagent.ledger.holding_forms import grants as holding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.authz.grant import Grants
    from gpupin.hostagent.authz.request import Asked
    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.ledger.holding_forms import CardGrant, HostCards
    from gpupin.hostagent.policy import EnforceRule

# Host paths whose bind mount hands the container the host (the escape baseline's `host-binds`).
HOST_PATHS = ("/", "/etc", "/dev", "/var/run/docker.sock", "/run/docker.sock", "/var/run", "/run", "/proc", "/sys")
# Capabilities that leave a container's confinement (the baseline's `capabilities`): `ALL` holds them all.
CAPABILITIES = frozenset({"ALL", "SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO", "SYS_PTRACE", "DAC_READ_SEARCH", "SYS_BOOT"})
PROBE_PATH = f"/containers/{PROBE}/json"
WARN = "WARN "  # a verdict's line that mode warn let through begins so
RUN_HINT = "hostagent run --gpu ID IMAGE pins a card and books it (hostagent ls shows the free ones)"
STACK_HINT = (
    "hostagent compose render --swarm FILE writes the agent's grant on each GPU service; docker stack deploy within "
    "15 minutes"
)


class Verdict:
    """Allowed or not, the line the user's docker CLI prints, and (a grant admitted) whose the container is."""

    __slots__ = ("allow", "msg", "uid")

    def __init__(self, allow: bool, msg: str = "", uid: int | None = None) -> None:
        self.allow = allow
        self.msg = msg
        self.uid = uid

    def to_json(self) -> JSONObject:
        return {"Allow": self.allow, "Msg": self.msg}


ALLOW = Verdict(True)


def _deny(msg: str) -> Verdict:
    return Verdict(False, f"gpupin: {msg}")


def escapes(c: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The parts of the escape baseline a container asks for: (part, how it asks), policy.ESCAPES's names."""
    hc = c.get("HostConfig") or {}
    out = []
    if hc.get("Privileged"):
        out.append(("privileged", "--privileged"))
    if str(hc.get("PidMode") or "") == "host":
        out.append(("host-pid", "--pid host"))
    for m in c.get("Mounts") or []:
        source = "/" + str(m.get("Source") or "").strip("/")
        if source in HOST_PATHS:
            out.append(("host-binds", f"a bind mount of {shown(source)}"))
    caps = {str(x).upper().removeprefix("CAP_") for x in hc.get("CapAdd") or []}
    for cap in sorted(caps & CAPABILITIES):
        out.append(("capabilities", f"--cap-add {cap}"))
    return out


def container_of(asked: Asked) -> DaemonAnswer | None:
    """The container a create or an update would make, as `docker inspect` shows it (None: no body, or neither);
    request.Unreadable for a body the daemon would refuse to decode."""
    if asked.body is None or asked.kind not in (request.CREATE, request.UPDATE, request.SERVICE):
        return None
    if asked.kind == request.SERVICE:
        return request.service_container(request.service(asked.body))
    return request.update_container(asked.body) if asked.kind == request.UPDATE else request.container(asked.body)


def cards_asked(asked: Asked, c: Mapping[str, Any] | None, host: HostCards) -> list[CardGrant]:
    """Every way the request would give its container cards (the ledger's FORMS), or a service's GPU reservation."""
    if asked.kind == request.SERVICE:
        return _service_cards(request.reserved(request.service(asked.body)), c)
    return holding(c, host) if c is not None else []


SERVICE_ENV = "service-env"  # a service's own device variable: a CardGrant's form


def _service_cards(wanted: request.Reserved | None, c: Mapping[str, Any] | None) -> list[CardGrant]:
    """A service's reservation of GPU kinds, and the device variables its tasks would carry (which pick cards on
    a node whose runtime reads them, past Swarm's reservation)."""
    from gpupin.hostagent.ledger.holding_forms import CardGrant

    kinds = wanted.kinds if wanted is not None else {}
    out = [CardGrant("swarm-resource", f"--generic-resource {k}={n}", [], named=False) for k, n in kinds.items()]
    for entry in ((c or {}).get("Config") or {}).get("Env") or []:
        var, _, value = str(entry).partition("=")
        if picks_devices(var) and not (var == NVD_VAR and value in ("", NONE, VOID)):
            out.append(CardGrant(SERVICE_ENV, f"-e {shown(var)}={shown(value)}", [], named=False))
    return out


def first_look(
    asked: Asked, host: HostCards, rule: EnforceRule
) -> tuple[Verdict | None, list[CardGrant], DaemonAnswer | None]:
    """What the plugin decides without the agent: a verdict, or None with the cards asked and the container (the
    agent judges those)."""
    if (asked.method == "GET" and asked.path == PROBE_PATH) or (asked.kind == request.CREATE and asked.name == PROBE):
        return Verdict(False, f"gpupin authz: on (enforce mode {rule.mode})"), [], None
    if rule.mode == "off" or asked.kind is None:
        return ALLOW, [], None
    if asked.body is None:
        # The daemon forwards a body only when it is JSON and under 1 MiB; a create it did not show gpupin cannot
        # be judged (an engine with CVE-2024-41110 forwarded a create without its body).
        return warned(rule, _deny(f"POST {asked.path} came without a body gpupin could read: refused")), [], None
    try:
        c = container_of(asked)
        asked_cards = cards_asked(asked, c, host)
    except request.Unreadable as why:
        return (
            warned(rule, _deny(f"POST {asked.path}: {why}: refused (the daemon would not read it either)")),
            [],
            None,
        )
    if c is not None:
        found = [(part, how) for part, how in escapes(c) if part not in rule.allow]
        if found:
            parts = ", ".join(how for _, how in found)
            return (
                warned(rule, _deny(f"{parts}: refused on this host (the policy's [enforce] allow lists none)")),
                [],
                c,
            )
    if not asked_cards:
        return ALLOW, [], c
    return None, asked_cards, c


def warned(rule: EnforceRule, v: Verdict) -> Verdict:
    """Mode warn: allowed; the line is kept for the log and `ls` (Verdict.msg)."""
    return Verdict(True, WARN + v.msg, v.uid) if rule.mode == "warn" and not v.allow else v


def judge(
    asked: Asked,
    asked_cards: list[CardGrant],
    c: Mapping[str, Any] | None,
    host: HostCards,
    rule: EnforceRule,
    held_by: Callable[[str], str | None],
    grants: Grants,
    over: Callable[[int, int, Mapping[str, Any]], str | None] | None = None,
) -> Verdict:
    """The agent's verdict on a request that reaches cards, before mode warn (`warned` applies it): `held_by(uuid)`
    says who holds or uses a card (None: free); `over(uid, cards, labels)` why a rendered file's grant may not take
    that many more cards for its user now, with the booking its labels ask (the policy's quotas and bookings; None:
    it may)."""
    hows = ", ".join(dict.fromkeys(g.how for g in asked_cards))
    if asked.kind == request.SERVICE:
        return _service(asked, asked_cards, hows, rule, grants)
    if asked.kind == request.UPDATE:
        return _deny(f"an update that gives a container cards ({hows}): refused; {RUN_HINT}")
    unnamed = [g for g in asked_cards if not g.named]
    if unnamed:
        count = len(unnamed[0].uuids) + len(unnamed[0].unknown) or "N"  # `all`: every card; a count: that many
        return _deny(
            f"{', '.join(dict.fromkeys(g.how for g in unnamed))} pins no card: refused; "
            f"hostagent run --count {count} IMAGE picks free cards and pins them"
        )
    unknown = [u for g in asked_cards for u in g.unknown]
    if unknown:
        return _deny(f"{', '.join(shown(u) for u in unknown)} names no card of this host: refused")
    uuids = list(dict.fromkeys(u for g in asked_cards for u in g.uuids))
    index = {c.uuid: c.index for c in host.cards}
    for uuid in uuids:
        who = held_by(uuid)
        if who is not None:
            return _deny(
                f"card {index.get(uuid, '?')} ({uuid}) is {who}: hostagent run --wait waits for it, "
                "hostagent ls shows the free ones"
            )
    if rule.grants:  # mode on, or warn saying what on would refuse
        labels = ((c or {}).get("Config") or {}).get("Labels") or {}
        value = labels.get(LABEL)
        if not isinstance(value, str):
            return _deny(f"only the agent's containers may take cards on this host ({hows}): {RUN_HINT}")
        try:
            uid, rendered = grants.admit(value, asked.name, uuids)
        except GrantRefused as why:
            return _deny(f"{why}: refused; {RUN_HINT}")
        why_not = over(uid, len(uuids), labels) if rendered and over is not None else None
        if why_not is not None:  # a run's grant was given under its quotas; a rendered file's is judged here
            return Verdict(False, f"gpupin: {why_not}", uid)
        return Verdict(True, uid=uid)
    return ALLOW


def _covers(granted: request.Reserved, wanted: request.Reserved) -> bool:
    """A service grant admits the same cards per task, and no more tasks (a scale down takes fewer cards); a global
    service only under a global grant."""
    if wanted.kinds != granted.kinds:
        return False
    if isinstance(wanted.tasks, int) and isinstance(granted.tasks, int):
        return wanted.tasks <= granted.tasks
    return wanted.tasks == granted.tasks


def _service(asked: Asked, asked_cards: list[CardGrant], hows: str, rule: EnforceRule, grants: Grants) -> Verdict:
    """A Swarm service that reserves GPUs (create, or update: each sends the whole spec). Swarm picks each task's
    cards among those its node advertises, and never gives one to two tasks: the reservation is a task's pin, so with
    `grants = false` it is allowed as a pinned create is. Under grants, the spec must carry the agent's service grant
    for this service and at least this reservation (docs/authz.md, Swarm). Which cards a task gets, and whether
    work outside Swarm holds them, the node's daemon decides without asking this plugin."""
    env = [g.how for g in asked_cards if g.form == SERVICE_ENV]
    if env:
        return _deny(
            f"{', '.join(env)}: a service's own device variable picks cards on its nodes past Swarm's reservation: "
            f"refused; reserve them instead (--generic-resource KIND=N; {STACK_HINT})"
        )
    if not rule.grants:
        return ALLOW
    spec = request.service(asked.body)
    wanted = request.reserved(spec)
    name = str(spec.get("Name") or "")
    value = (spec.get("Labels") or {}).get(LABEL)
    if wanted is None or not isinstance(value, str):
        return _deny(f"only the agent's stacks may reserve GPUs on this swarm ({hows}): {STACK_HINT}")
    try:
        opened = grants.open_service(value, request.service_key(spec))
        granted = request.Reserved.parse(opened.reserved)
        if granted is None or not _covers(granted, wanted):
            what = granted if granted is not None else shown(opened.reserved)
            raise GrantRefused(f"service {shown(name)} asks for {wanted}, its grant is for {what}")
        grants.spend_service(opened, name)
    except GrantRefused as why:
        return _deny(f"{why}: refused; {STACK_HINT}")
    return Verdict(True, uid=opened.uid)
