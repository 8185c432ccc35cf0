"""Processes are holders: every process NVML reports on a card (on a MIG device: on that device), attributed to
the container it runs in (its cgroup, gpupin.hostagent.ledger.procs) or to the host (docs/design.md, "The ledger").

A process of a container that was given the card (or its whole parent card) is that container's use: the ledger
already counts the container. Any other process is *foreign* and makes the card busy: a host process, a process of
a container that was not given the card (an ESCAPE: a misrouting runtime, `--privileged` without the toolkit, a
/dev mount), a process in a container this daemon does not know (another engine's), and a process whose owner
cannot be told (/proc does not show it here). A card whose processes NVML will not list is unknown, never free.

`hostagent run` and compose treat each foreign process as a holder (`Use`, a ledger.Holder) of the card it runs
on, so that one rule decides "free"; `--share` lets a request in beside them (deliberate sharing), and
`run --count --max-load/--max-memory` accepts them on a card loaded less than the limits.
"""

from __future__ import annotations

from gpupin.hostagent.ledger import procs
from gpupin.hostagent.ledger.holders import Holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card, Process

HOST, CONTAINER, UNKNOWN = "host", "container", "unknown"  # whose a process is
_USERS: dict[int, str] = {}  # uid -> user name, for this process's life


class Use(Holder):
    """One process on a card or MIG device (`uuids`: that one), and whose it is, read from /proc when first asked
    (`run` decides without it: any process on a card keeps an exclusive request off it, since a container given the
    card holds it anyway; only what a refusal or a listing says needs the owner).

    `owner`: HOST, CONTAINER (`container_id`; `container` its name when this daemon knows it) or UNKNOWN.
    `foreign`: no grant of its container explains it (None: cannot be told, the ledger being unread).
    `escape`: a container of this daemon that was not given the card."""

    __slots__ = ("_given", "_names", "_where", "card_uuid", "command", "kind", "pid", "used_memory", "user")
    process = True

    def __init__(
        self,
        p: Process,
        key: str,
        card_uuid: str,
        given: Mapping[str, set[str]] | None,
        names: Mapping[str, str] | None,
    ) -> None:
        super().__init__(f"pid {p.pid}", "", "running", [key], False, "process")
        self.pid = p.pid
        self.kind = p.type
        self.used_memory = p.used_memory
        self.card_uuid = card_uuid
        self._given = given  # container id -> the cards its grants name (None: the ledger is unread)
        self._names = names  # container id -> name, every container of this daemon
        self._where: procs.HostProcess | None = None
        self.user: str | None = None
        self.command: str | None = None

    @property
    def where(self) -> procs.HostProcess:
        if self._where is None:
            self._where = procs.locate(self.pid)
        return self._where

    @property
    def container_id(self) -> str | None:
        return self.where.container_id

    @property
    def container(self) -> str | None:
        cid = self.container_id
        return self._names.get(cid) if self._names is not None and cid is not None else None

    @property
    def owner(self) -> str:
        return UNKNOWN if not self.where.visible else CONTAINER if self.container_id else HOST

    @property
    def foreign(self) -> bool | None:
        cid = self.container_id
        if not self.where.visible or cid is None:
            return True
        if self._given is None:
            return None
        return not ({self.uuids[0], self.card_uuid} & self._given.get(cid, set()))

    @property
    def escape(self) -> bool:
        return bool(self.foreign) and self.container is not None

    def _read(self) -> None:
        """Its user and command, from /proc, when first asked (only refusals and listings need them)."""
        if self.owner != UNKNOWN and self.command is None and self.user is None:
            where = procs.describe(self.pid, _USERS, procs.HostProcess(self.pid, visible=True))
            self.user, self.command = where.user, where.command

    def describe(self) -> str:
        self._read()
        who = (
            f"pid {self.pid}"
            + (f" of {self.user}" if self.user else "")
            + (f" ({self.command})" if self.command else "")
        )
        if self.owner == HOST:
            return f"{who}, a process of the host"
        if self.owner == UNKNOWN:
            why = (
                "gone, or hidden from this user"
                if procs.pids_visible()
                else "hostagent runs in a pid namespace of its own: give it the host's (--pid host)"
            )
            return f"{who}, whose owner /proc does not show ({why})"
        cid = (self.container_id or "")[:12]
        if self.container is None:
            return f"{who} in container {cid}, which this Docker daemon does not know (another engine's)"
        if self.escape:
            return f"{who} in container {self.container} ({cid}), which was not given this card: ESCAPE"
        return f"{who} in container {self.container} ({cid})"

    def to_dict(self) -> dict[str, Any]:
        self._read()
        return {
            "pid": self.pid,
            "type": self.kind,
            "owner": self.owner,
            "user": self.user,
            "command": self.command,
            "container_id": self.container_id,
            "container": self.container,
            "foreign": self.foreign,
            "escape": self.escape,
            "describe": self.describe(),
        }


class Unlisted(Holder):
    """A card whose processes NVML will not list: who uses it is unknown, so it holds the card for every request
    that is not --share."""

    __slots__ = ("reason",)
    process = True

    def __init__(self, card: Card) -> None:
        super().__init__(
            f"card {card.index}", "", "unknown", [card.uuid or ""], False, "unknown", why="its processes are unknown"
        )
        self.reason = f"NVML would not list its processes: {card.processes_error}"

    def describe(self) -> str:
        return f"someone NVML would not name ({self.reason}; run hostagent as root, or use it anyway with --share)"


def mig_of(p: Process, card: Card) -> str | None:
    """The MIG device a process runs on (a card in MIG mode names its GPU and compute instance), or None."""
    if p.gpu_instance_id is None:
        return None
    return next(
        (
            m.uuid
            for m in card.mig_devices
            if m.gpu_instance_id == p.gpu_instance_id and p.compute_instance_id in (None, m.compute_instance_id)
        ),
        None,
    )


def attribute(
    cards: Sequence[Card], holders: Iterable[Holder] | None, containers: Mapping[str, str] | None
) -> list[Use]:
    """Every process of these cards, attributed (when asked: Use). `holders`: the ledger's (None: unread, so
    whether a container's process is foreign cannot be told); `containers`: id -> name of every container of this
    daemon."""
    given: dict[str, set[str]] | None = None
    if holders is not None:
        given = {}
        for h in holders:
            given.setdefault(h.id, set()).update(h.uuids)
    return [
        Use(p, mig_of(p, card) or card.uuid or "", card.uuid or "", given, containers)
        for card in cards
        for p in card.process_list
    ]


def blocking(cards: Sequence[Card], uses: Iterable[Use], attributed: bool = True) -> dict[str, list[Holder]]:
    """Card or MIG UUID -> what holds it besides the containers given it: its foreign processes (`attributed`:
    each process's owner read from /proc; else every process, which decides the same for a request that does not
    share, as a container given the card holds it anyway), or the card itself when NVML will not list its
    processes."""
    out: dict[str, list[Holder]] = {}
    for u in uses:
        if not attributed or u.foreign is not False:
            out.setdefault(u.uuids[0], []).append(u)
    for card in cards:
        if card.processes_error is not None and card.uuid:
            out.setdefault(card.uuid, []).append(Unlisted(card))
    return out
