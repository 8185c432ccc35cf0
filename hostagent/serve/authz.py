"""`POST /api/authz`: the agent's half of the authorization plugin (gpupin.hostagent.authz). The plugin sends the
requests that reach cards; the agent judges them against its live view (who holds which card, whose it is, until
when) and its grants, without reading the daemon (whose request it judges) or taking the ledger lock (which its own
runs hold while the daemon asks). Root's alone: the plugin runs as root, and a grant is admitted once.
"""

from __future__ import annotations

import time

from gpupin.core.errors import GpupinError, shown
from gpupin.hostagent.authz import judge, request
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.ls.model import HolderShown, Listing, Occupancy
    from gpupin.hostagent.serve.agent import Agent
    from gpupin.hostagent.serve.interfaces import Handler, Peer

ROUTE = "/api/authz"
GRANT_ROUTE = "/api/grant"
MAX_GRANTS = 64  # one request's grants (a compose file's services)


class Judging:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def route(self, handler: Handler, body: JSONObject, peer: Peer) -> None:
        if peer.uid != 0:
            raise GpupinError(f"POST {ROUTE} is the authorization plugin's (root's)", "hostagent authz runs as root")
        msg = body.get("request")
        handler.answer(self.verdict(msg if isinstance(msg, dict) else {}).to_json())

    def verdict(self, msg: JSONObject) -> judge.Verdict:
        from gpupin.hostagent.ledger.holding_forms import HostCards

        asked = request.read(msg)
        rule = self.agent.in_force.policy.enforce
        cards, _, view = self.agent.ledger_now()
        if cards is None or view is None:
            return judge.Verdict(
                rule.mode == "warn",
                "gpupin: the agent cannot read the cards (NVML): containers that take cards are refused until it can",
            )
        host = HostCards(cards, local=True)
        first, asked_cards, c = judge.first_look(asked, host, rule)
        v = (
            first
            if first is not None
            else judge.judge(asked, asked_cards, c, host, rule, _held_by(view), self.agent.grants)
        )
        if v.msg:
            what = f"{asked.method} {asked.path}" + (f" {shown(asked.name)}" if asked.name else "")
            say(f"authz: {'denied' if not v.allow else 'allowed'} {what}: {v.msg}")
            self.agent.judged.append({"at": time.time(), "request": what, "allowed": v.allow, "msg": v.msg})
        return v


def _held_by(view: Listing) -> Callable[[str], str | None]:
    """Who holds or uses each card and MIG device of the view, as the denial says it."""
    uses: dict[str, tuple[Occupancy, list[HolderShown]]] = {}
    for card in view.gpus:
        if card.uuid:
            uses[card.uuid] = (card.use, card.holders)
        for mig in card.mig_devices or []:
            uses[mig.uuid] = (mig.use, card.holders)

    def held_by(uuid: str) -> str | None:
        found = uses.get(uuid)
        if found is None:
            return "not known to the agent"
        use, holders = found
        if use.state in ("free", "shared"):
            return None
        if use.state == "unknown":
            return f"of unknown use ({use.unknown or 'NVML does not say'})"
        holding = [h for h in holders if h.holds]
        if not holding:
            return "in use by processes outside any container gpupin knows"
        return "held by " + ", ".join(_holder(h) for h in holding)

    return held_by


def _holder(h: HolderShown) -> str:
    owner = h.owner.name if h.owner is not None and h.owner.name else None
    until = h.booking.until if h.booking is not None else None
    return (
        shown(h.name)
        + (f" ({shown(owner)})" if owner else "")
        + (f" until {time.strftime('%H:%M', time.localtime(until))}" if until else "")
    )


def grant(agent: Agent, handler: Handler, body: JSONObject, peer: Peer) -> None:
    """`POST /api/grant` {"cards": [[UUID, ...], ...]}: a grant for each list of cards, for any container name, for
    the caller the kernel named (`compose render` writes them into the file it renders); {"grants": null} when the
    policy needs none. A grant books nothing: the create it admits is still refused on a held card."""
    from gpupin.core.errors import UsageError
    from gpupin.hostagent.authz.grant import ANY_NAME, RENDER_S
    from gpupin.hostagent.serve import rights

    refused = rights.refusal(peer)
    if refused is not None:
        raise GpupinError(refused, "grants are for users who may use the daemon themselves")
    rule = agent.in_force.policy.enforce
    if rule.mode == "off" or not rule.grants:
        handler.answer({"grants": None})
        return
    if "services" in body:
        service_grants(agent, handler, body, peer)
        return
    asked = body.get("cards")
    cards, _, _ = agent.ledger_now()
    known = {c.uuid for c in cards or []} | {m.uuid for c in cards or [] for m in c.mig_devices or []}
    if (
        not isinstance(asked, list)
        or not 0 < len(asked) <= MAX_GRANTS
        or not all(isinstance(u, list) and u and all(isinstance(x, str) and x in known for x in u) for u in asked)
    ):
        raise UsageError(
            f"POST {GRANT_ROUTE}: `cards` must be 1 to {MAX_GRANTS} lists of this host's card UUIDs",
            "use a hostagent of the agent's version",
        )
    values = [agent.grants.issue(ANY_NAME, u, peer.uid, ttl=RENDER_S) for u in asked]
    say(f"grant: {len(values)} for uid {peer.uid} ({shown(peer.user())}) on {', '.join(','.join(u) for u in asked)}")
    handler.answer({"grants": values, "expires_in_s": RENDER_S})


def service_grants(agent: Agent, handler: Handler, body: JSONObject, peer: Peer) -> None:
    """`POST /api/grant` {"services": [{"service": KEY, "kinds": {KIND: N}, "tasks": N | "global"}, ...]}: a grant
    per Swarm service that reserves GPUs (`compose render --swarm`), bound to the service's key (any stack's KEY),
    its reservation and the caller; good for one service and its redeploys until it expires (docs/authz.md)."""
    from gpupin.core.errors import UsageError
    from gpupin.hostagent.authz.grant import RENDER_S

    asked = body.get("services")
    wanted: list[tuple[str, request.Reserved]] = []
    for s in asked if isinstance(asked, list) and 0 < len(asked) <= MAX_GRANTS else [None]:
        s = s if isinstance(s, dict) else {}
        key, kinds, tasks = s.get("service"), s.get("kinds"), s.get("tasks")
        if not (
            isinstance(key, str)
            and key
            and isinstance(kinds, dict)
            and kinds
            and all(request.gpu_kind(k) and type(n) is int and n > 0 for k, n in kinds.items())
            and ((type(tasks) is int and tasks >= 0) or tasks == "global")
        ):
            raise UsageError(
                f"POST {GRANT_ROUTE}: `services` must be 1 to {MAX_GRANTS} of {{service, kinds: {{GPU kind: N}}, "
                "tasks: N or global}",
                "use a hostagent of the agent's version",
            )
        wanted.append((key, request.Reserved(kinds, tasks)))
    values = [agent.grants.issue_service(key, r.text(), peer.uid, ttl=RENDER_S) for key, r in wanted]
    what = ", ".join(f"{shown(k)}: {r}" for k, r in wanted)
    say(f"grant: {len(values)} for uid {peer.uid} ({shown(peer.user())}) on services {what}")
    handler.answer({"grants": values, "expires_in_s": RENDER_S})


def routes(agent: Agent) -> dict[str, Callable[[Any, JSONObject, Any], None]]:
    return {ROUTE: Judging(agent).route, GRANT_ROUTE: lambda h, b, p: grant(agent, h, b, p)}
