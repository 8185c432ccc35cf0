"""`POST /api/run`: the agent books the cards and creates the container for the `hostagent run` that asks, with the
code a run without the agent uses (gpupin.hostagent.run.launch) and its NVML and engine client already loaded; the
caller starts and follows it. The agent builds the container from the request its caller parsed, under the same
lock as every client, signs it with the caller's lease, and acts only for callers who could use the daemon
themselves (docs/design.md, "The resident agent").
"""

from __future__ import annotations

import contextlib
import threading
import time

from gpupin.core.errors import UsageError, shorten, shown
from gpupin.hostagent import agentlink, engine, mark
from gpupin.hostagent.engine import podman
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.run import launch, request_json
from gpupin.hostagent.run.reads import CallersOwn
from gpupin.hostagent.serve import rights, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.serve.agent import Agent
    from gpupin.hostagent.serve.interfaces import Handler, Peer

ROUTE = "/api/run"
KEPT_CLIENTS = 4  # Engine clients kept between runs (more run at once only when many ask at once)
INFO_S = 10.0  # how long the daemon's /info is reused (its runtimes and CDI folders change with its configuration)


class LeftToCaller(Exception):
    """This run is the caller's to make (the answer says why): the agent has made nothing for it. `pull`: only its
    image's pull is (its registry credentials, its progress on its terminal): the caller pulls and asks again."""

    def __init__(self, why: str, pull: bool = False) -> None:
        super().__init__(why)
        self.pull = pull


def owner_labels(claimed: Any, peer: Peer) -> dict[str, str]:
    """The lease the container is signed with: the caller's, as it names itself, once it is the process the kernel
    named when the connection was accepted (its pid and start time then: a pid reused since names another)."""
    owner = lease.Owner.parse(claimed if isinstance(claimed, str) else None)
    if owner is None:
        raise UsageError("the run request names no owner for its lease", "use a hostagent of the agent's version")
    here = lease.this_process()
    if peer.pidns and peer.pidns != here.pidns and (owner.boot, owner.pidns) != (here.boot, here.pidns):
        pass  # a caller in a pid namespace of its own names itself there: its lease is renewed, as a remote one's
    elif (owner.boot, owner.pidns, owner.pid, owner.start) != (here.boot, here.pidns, peer.pid, peer.start):
        raise UsageError(
            f"the run request's lease names pid {shorten(owner.pid)}, but the caller is pid {peer.pid}",
            "the process that starts the container must be the one that asks",
        )
    return {lease.OWNER_LABEL: str(owner), lease.LEASE_LABEL: str(lease.LEASE_S)}


class Runs:
    """The route, and the Engine clients it keeps (one per request at a time: the SDK's is not thread-safe)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._idle: list[Any] = []
        self._mutex = threading.Lock()
        self._info: tuple[float, DaemonAnswer] | None = None

    def info(self, api: Any) -> DaemonAnswer:
        """The daemon's /info, asked again after INFO_S (a run's look does not wait for it each time)."""
        now = time.monotonic()
        kept = self._info
        if kept is not None and now - kept[0] < INFO_S:
            return kept[1]
        data = engine.info(api)
        self._info = (now, data)
        return data

    def _client(self) -> Any:
        with self._mutex:
            if self._idle:
                return self._idle.pop()
        return engine.connect()

    def _done(self, api: Any) -> None:
        with self._mutex:
            if len(self._idle) < KEPT_CLIENTS:
                self._idle.append(api)
                return
        api.close()

    def route(self, handler: Handler, body: JSONObject, peer: Peer) -> None:
        # What waits until the answer is sent: the ledger lock let go, then the request's client kept. The caller
        # starts meanwhile; a thread of the agent's own would take the interpreter's lock from the answer.
        after: list[Callable[[], None]] = []
        try:
            handler.answer(self.reserve(body, peer, after))
        except LeftToCaller as why:
            handler.answer({"direct": str(why), "pull": True} if why.pull else {"direct": str(why)})
        finally:
            for then in after:
                then()

    def reserve(self, body: JSONObject, peer: Peer, after: list[Callable[[], None]]) -> JSONObject:
        mark("asked")
        why = agentlink.other_daemon(body.get("daemon"))
        if why is not None:
            raise LeftToCaller(why)
        refused = rights.refusal(peer)
        if refused is not None:
            raise LeftToCaller(refused)
        sent = body.get("request")
        if not isinstance(sent, dict) or sent.get("wire") != request_json.VERSION:
            raise LeftToCaller(f"the agent reads run requests of version {request_json.VERSION}")  # another hostagent's
        owner = owner_labels(body.get("owner"), peer)
        try:
            req = request_json.load(sent)
        except CallersOwn as err:
            raise LeftToCaller(str(err)) from None
        if req.pull == "always":
            raise LeftToCaller("--pull always", pull=True)
        admit = self._admit(req, peer)  # a --for past the policy's maximum: refused before anything is read
        lines: list[str] = []
        cards, picks = launch.read_cards(req, lines.append)
        mark("cards")
        api = self._client()
        try:
            daemon_info, detection = engine.daemon_view(api, ask=req.via is None, info_of=self.info)
            created = launch.reserve(
                api,
                req,
                lambda: (cards, picks),
                daemon_info,
                detection,
                owner,
                missing_image=self._missing(req.image),
                notify=lines.append,
                admit=admit,
                spares=None
                if podman.version(api)
                else self.agent.standby_locks,  # Docker's rename and import: measured
                after=after.append,
                sign=self._signer(peer),
            )
        finally:
            after.append(lambda: self._done(api))  # a requests session outlives a failed call: kept for the next run
        # The audit line: who, as the kernel named them at accept, and what was made for them.
        cards_made = ",".join(t.uuid for t in created.spec.targets)
        with contextlib.suppress(OSError, ValueError):  # a log that cannot be written must not fail a made run
            say(f"run: {created.cid[:12]} on {cards_made} for uid {peer.uid} ({shown(peer.user())}) pid {peer.pid}")
        self.agent.note_owner(created.cid, peer.uid)  # the caller at accept owns it, and its intervals in the record
        after.append(self.agent.owners.flush)  # written once the caller has its answer
        return {"id": created.cid, "api": api.api_version, "via": created.spec.pin.via, "say": lines}

    def _admit(self, req: Any, peer: Peer) -> Any:
        """The booking and the quotas of the policy in force, for the caller the kernel named (never a name the
        request carries: gpupin.hostagent.policy.admit)."""
        from gpupin.hostagent.ledger.booking import Caller
        from gpupin.hostagent.policy import admit

        caller = Caller(peer.uid, {peer.gid, *peer.groups})
        return admit.for_run(
            self.agent.in_force.policy,
            caller,
            req.book_for,
            self.agent.bookings.extensions(),
            self.agent.owners.uids,
            self.agent.finished,
            cards=req.count or len(req.gpus) or None,
        )

    def _signer(self, peer: Peer) -> Callable[[Any], dict[str, str]] | None:
        """The grant the authorization plugin admits the create by, under enforce mode `on` (none otherwise: the
        container is what a run without the agent makes)."""
        if self.agent.in_force.policy.enforce.mode != "on":
            return None
        from gpupin.hostagent.authz.grant import LABEL

        grants = self.agent.grants
        return lambda spec: {LABEL: grants.issue(spec.req.name or "", [t.uuid for t in spec.targets], peer.uid)}

    @staticmethod
    def _missing(image: str) -> Any:
        def pull_is_the_callers() -> None:
            # Pulls are the caller's: its registry credentials, its progress on its terminal.
            raise LeftToCaller(f"the image {image} is not on the daemon", pull=True)

        return pull_is_the_callers


def routes(agent: Agent) -> dict[str, Callable[[Any, JSONObject, Any], None]]:
    return {ROUTE: Runs(agent).route}
