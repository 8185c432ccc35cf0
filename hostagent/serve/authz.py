"""`POST /api/authz`: the agent's half of the authorization plugin (gpupin.hostagent.authz). The plugin sends the
requests that reach cards; the agent judges them against its live view (who holds which card, whose it is, until
when) and its grants, without reading the daemon (whose request it judges) or taking the ledger lock (which its own
runs hold while the daemon asks). Root's alone: the plugin runs as root, and a grant is admitted once.
"""

from __future__ import annotations

import os
import threading
import time

from gpupin.core.errors import GpupinError, shown
from gpupin.hostagent.authz import judge, request
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.ledger.booking import Caller
    from gpupin.hostagent.ls.model import HolderShown, Listing, Occupancy
    from gpupin.hostagent.policy import Policy
    from gpupin.hostagent.serve.agent import Agent
    from gpupin.hostagent.serve.interfaces import Handler, Peer

ROUTE = "/api/authz"
GRANT_ROUTE = "/api/grant"
MAX_GRANTS = 64  # one request's grants (a compose file's services)
CREATED_S = 60.0  # from a create's verdict to the daemon's answer to it (the plugin forwards that at once)
PENDING = 1024  # verdicts awaiting their create's answer, at most (the oldest go first)


class Judging:
    """The verdicts, and what the agent learns when the daemon has answered a create it let through: whose the
    container is (the grant it was admitted by) and whether mode warn let it in. The answer alone names the
    container (its id), so each verdict that needs it is kept until then, by the request's digest."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._pending: dict[bytes, Kept] = {}  # the request's digest -> its verdict, until its create's answer
        self._made: list[Made] = []  # the granted creates let in within CREATED_S
        self._lock = threading.Lock()

    def route(self, handler: Handler, body: JSONObject, peer: Peer) -> None:
        if peer.uid != 0:
            raise GpupinError(f"POST {ROUTE} is the authorization plugin's (root's)", "hostagent authz runs as root")
        msg = body.get("request")
        msg = msg if isinstance(msg, dict) else {}
        answer = body.get("response")
        if isinstance(answer, dict):
            warned = body.get("warned")  # the plugin's own verdict (mode warn), where it decided alone
            handler.answer({"noted": self.created(msg, answer, warned if isinstance(warned, str) else None)})
            return
        handler.answer(self.verdict(msg).to_json())

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
        if first is None:
            over = _policy_of_rendered(self.agent, view, self._just_made)
            first = judge.warned(
                rule, judge.judge(asked, asked_cards, c, host, rule, _held_by(view), self.agent.grants, over)
            )
        v = first
        if v.msg:
            what = f"{asked.method} {asked.path}" + (f" {shown(asked.name)}" if asked.name else "")
            say(f"authz: {'denied' if not v.allow else 'allowed'} {what}: {v.msg}")
            self.agent.judged.append({"at": time.time(), "request": what, "allowed": v.allow, "msg": v.msg})
        if asked.kind == request.CREATE and v.allow and (v.uid is not None or v.msg.startswith(judge.WARN)):
            self._keep(_digest(msg), v, len({u for g in asked_cards for u in g.uuids}))
        return v

    def _just_made(self) -> list[Made]:
        """The granted creates let through within CREATED_S, which a view may not show yet: the quotas count them
        (two services of one file are created milliseconds apart)."""
        now = time.monotonic()
        with self._lock:
            self._made = [m for m in self._made if m.at > now - CREATED_S][-PENDING:]
            return list(self._made)

    def _keep(self, digest: bytes, v: judge.Verdict, cards: int) -> None:
        now = time.monotonic()
        with self._lock:
            for d in [d for d, k in self._pending.items() if k.at < now - CREATED_S]:
                del self._pending[d]
            while len(self._pending) >= PENDING:
                del self._pending[next(iter(self._pending))]
            made = Made(now, v.uid, cards) if v.uid is not None else None
            self._pending.pop(digest, None)  # kept last: the oldest first out
            self._pending[digest] = Kept(now, made, v.msg.removeprefix(judge.WARN) if v.msg else "")
            if made is not None:
                self._made.append(made)

    def created(self, msg: JSONObject, answer: JSONObject, warned: str | None = None) -> bool:
        """The daemon's answer to a create let through (the plugin's AuthZRes): the container's owner is the uid
        its grant was issued for, and a create mode warn let in (the agent's verdict, or the plugin's `warned`) is
        marked for `ls`. True: noted."""
        digest = _digest(msg)
        with self._lock:
            kept = self._pending.get(digest)
            stale = kept is not None and kept.at < time.monotonic() - CREATED_S
            if stale or (kept is not None and kept.made is not None):
                del self._pending[digest]  # a grant's is for one create; a warning's, for each alike within the time
            if stale:
                kept = None
        if kept is None and warned:
            kept = Kept(0.0, None, warned)
        if kept is None:
            return False
        cid = request.created_id(answer)
        made = kept.made
        if cid is None:  # refused after all (a name in use, an image missing): nothing was made
            if made is not None:
                made.at = 0.0
            return False
        if made is not None:
            made.cid = cid
            self.agent.note_owner(cid, made.uid)
            self.agent.owners.flush()
        if kept.line:
            self.agent.owners.warn(cid, kept.line)
        return True


class Made:
    """A granted create let through: when, for whom, how many cards, and its container once the daemon said."""

    __slots__ = ("at", "cards", "cid", "uid")

    def __init__(self, at: float, uid: int, cards: int) -> None:
        self.at = at
        self.uid = uid
        self.cards = cards
        self.cid: str | None = None


class Kept:
    """A verdict awaiting its create's answer: when, the grant's create (None: no grant), mode warn's line."""

    __slots__ = ("at", "line", "made")

    def __init__(self, at: float, made: Made | None, line: str) -> None:
        self.at = at
        self.made = made
        self.line = line


def _digest(msg: JSONObject) -> bytes:
    """One request, as the daemon sends it in its AuthZReq and again in its AuthZRes."""
    import hashlib

    parts = (msg.get("RequestMethod"), msg.get("RequestUri"), msg.get("RequestBody"))
    return hashlib.sha256("\0".join(str(p or "") for p in parts).encode()).digest()


def _policy_of_rendered(
    agent: Agent, view: Listing, just_made: Callable[[], list[Made]]
) -> Callable[[int, int, Mapping[str, Any]], str | None]:
    """Why a rendered file's grant may not take `cards` more for `uid` now (None: it may): the policy's quotas, from
    the view's holdings and the granted creates it does not show yet (each counted once), and its bookings (the
    length the container's labels ask, which render wrote: gpupin.hostagent.compose.booking). The holdings are
    read only when a rendered grant is judged, not for every request that reaches a card."""
    from gpupin.hostagent.policy import admit
    from gpupin.hostagent.serve.queue import view_holdings

    policy = agent.in_force.policy
    if not policy.enforced:
        return lambda _uid, _cards, _labels: None

    def over(uid: int, cards: int, labels: Mapping[str, Any]) -> str | None:
        held = view_holdings(view)
        counted = {h.id for card in view.gpus for h in card.holders if h.owner is not None and h.owner.verified}
        held += [admit.Holding(m.uid, m.cards, None, "a container just created") for m in just_made()
                 if m.cid not in counted]  # fmt: skip
        who = caller(uid)
        return _booking(policy, who, labels) or admit.over(policy, who, cards, held, agent.finished)

    return over


def _booking(policy: Policy, who: Caller, labels: Mapping[str, Any]) -> str | None:
    """Why the booking a granted create's labels ask is not one the policy gives its user (None: it is): where the
    policy ends bookings, render wrote the length (the user's own, else the default), and it must still be there."""
    from gpupin.hostagent.ledger.booking import FOR_LABEL, length, parse_duration

    asked = labels.get(FOR_LABEL)
    if asked is None:
        if length(policy, who, None) is None and policy.booking_max(who.uid, who.gids) is None:
            return None
        return f"its {FOR_LABEL} label (the booking hostagent compose render wrote) is gone: render the file again"
    try:
        length(policy, who, parse_duration(str(asked)), FOR_LABEL)
    except (ValueError, GpupinError) as err:
        return getattr(err, "message", str(err))
    return None


def caller(uid: int) -> Caller:
    """A uid the agent did not see at accept (a grant's), with its groups from the user database."""
    import pwd

    from gpupin.hostagent.ledger.booking import Caller

    try:
        pw = pwd.getpwuid(uid)
        gids = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, OSError):
        gids = frozenset()
    return Caller(uid, gids)


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
    from gpupin.hostagent.ledger.booking import Caller, length

    policy = agent.in_force.policy
    who = Caller(peer.uid, {peer.gid, *peer.groups})
    if policy.enforced:  # 75 (or 64: never) now, not at `docker compose up`; the create is judged again then
        from gpupin.hostagent.policy import admit
        from gpupin.hostagent.serve.queue import view_holdings

        view = agent.snapshot().listing
        held = view_holdings(view) if view is not None else []
        cards_asked = sum(len(set(u)) for u in asked)
        admit.check(policy, who, cards_asked, held, agent.finished)
    book_s = length(policy, who, None)  # the caller's default, for render to write where a service asks none
    values = [agent.grants.issue(ANY_NAME, u, peer.uid, ttl=RENDER_S) for u in asked]
    say(f"grant: {len(values)} for uid {peer.uid} ({shown(peer.user())}) on {', '.join(','.join(u) for u in asked)}")
    handler.answer({"grants": values, "expires_in_s": RENDER_S, "booking_s": book_s})


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
