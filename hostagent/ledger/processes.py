"""Processes are holders: every process NVML reports on a card (on a MIG device: on that device), attributed from
/proc to the container it runs in or to the host. One that no grant of its container explains is *foreign* and
makes its card busy, as a holder (`GpuProcess`), so that one rule decides "free". A cgroup's name is anyone's to
choose: a process is a container's only in its real cgroup or pid namespace, and a rootless container's uid is the
kernel's (docs/ledger.md, "What holds a card").
"""

from __future__ import annotations

import fcntl
import functools
import os
import re
import struct

from gpupin.core.errors import shown
from gpupin.hostagent.ledger.holders import Holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence
    from typing import Any

    from gpupin.core.nvml import Card, Process


# Whose a process is: the host's, a container's, unknown (/proc does not show it), unnamed (its cgroup names a
# container of this daemon that it is not in: anyone can name a cgroup so), or a user's rootless container.
HOST, CONTAINER, UNKNOWN, UNNAMED, ROOTLESS = "host", "container", "unknown", "unnamed", "rootless"
MIB = 1024 * 1024
_USERS: dict[int, str] = {}  # uid -> user name, for this process's life


class GpuProcess(Holder):
    """One process on a card or MIG device (`uuids`: that one), and whose it is, read from /proc when first asked: `run`
    decides without it (a container given the card holds it anyway); only a refusal or a listing needs the owner.
    `owner`: HOST, CONTAINER, UNKNOWN, UNNAMED or ROOTLESS. `foreign`: no grant of its container explains it (None:
    the ledger unread). `escape`: a container of this daemon that was not given the card."""

    __slots__ = (
        "_given",
        "_names",
        "_places",
        "_where",
        "card_uuid",
        "command",
        "kind",
        "pid",
        "used_memory",
        "user",
    )
    process = True

    def __init__(
        self,
        p: Process,
        key: str,
        card_uuid: str,
        given: Mapping[str, set[str]] | None,
        names: Mapping[str, str] | None,
        places: ContainerCgroups | None = None,
    ) -> None:
        super().__init__(f"pid {p.pid}", "", "running", [key], False, "process")
        self.pid = p.pid
        self.kind = p.type
        self.used_memory = p.used_memory
        self.card_uuid = card_uuid
        self._given = given  # container id -> the cards its grants name (None: the ledger is unread)
        self._names = names  # container id -> name, every container of this daemon
        self._places = places  # where this daemon's containers run (None: the ledger is unread)
        self._where: HostProcess | None = None
        self.user: str | None = None
        self.command: str | None = None

    @property
    def where(self) -> HostProcess:
        if self._where is None:
            self._where = locate(self.pid, self._places)
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
        where = self.where
        return (
            UNKNOWN
            if not where.visible
            else UNNAMED
            if where.claimed is not None and where.container_id is None
            else ROOTLESS
            if where.rootless_uid is not None
            else CONTAINER
            if where.container_id
            else HOST
        )

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
            where = describe(self.pid, _USERS, HostProcess(self.pid, visible=True))
            self.user, self.command = where.user, where.command

    def describe(self) -> str:
        self._read()
        who = (
            f"pid {self.pid}"
            + (f" of {shown(self.user)}" if self.user else "")
            + (f" ({shown(self.command)})" if self.command else "")
        )
        if self.owner == HOST:
            return f"{who}, a process of the host"
        if self.owner == UNNAMED:
            return (
                f"{who} in cgroup {shown(self.where.cgroup)}, which is not container "
                f"{(self.where.claimed or '')[:12]}'s: its owner cannot be named"
            )
        rootless = self.rootless() if self.owner == ROOTLESS else None
        if rootless is not None:
            return f"{who} in {rootless['whose']}"
        if self.owner == UNKNOWN:
            why = (
                "gone, or hidden from this user"
                if pids_visible()
                else "hostagent runs in a pid namespace of its own: give it the host's (--pid host)"
            )
            return f"{who}, whose owner /proc does not show ({why})"
        cid = (self.container_id or "")[:12]
        if self.container is None:
            return f"{who} in container {cid}, which this Docker daemon does not know (another engine's)"
        if self.escape:
            return f"{who} in container {shown(self.container)} ({cid}), which was not given this card: ESCAPE"
        return f"{who} in container {shown(self.container)} ({cid})"

    def rootless(self) -> dict[str, Any] | None:
        """Whose rootless container it is (ROOTLESS; else None): the uid the kernel names, its user's name, the
        runtime and container its cgroup names (the user's own claim), and all of it in words (`whose`: "rootless
        podman container 1f0e2d3c4b5a of uid 1001 (alice)")."""
        uid = self.where.rootless_uid
        if uid is None:
            return None
        name = _user_name(uid, _USERS)
        user = f"uid {uid}" + (f" ({shown(name)})" if name != str(uid) else "")
        runtime, cid = self.where.runtime, (self.container_id or "")[:12]
        whose = (
            f"rootless {runtime + ' ' if runtime else ''}container {cid} of {user}"
            if cid
            else f"a user namespace of {user} (a rootless container)"
        )
        return {"uid": uid, "user": name, "runtime": runtime, "whose": whose}


class UnlistedProcesses(Holder):
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


# Use that NVML names no process for (unseen_use): an idle H200 reads 615-618 MiB used at 0% load
# (bench/records/real-gpu-session-2-2xH200-2026-11-30.log, and -3-); a PyTorch process there used 4614 MiB.
UNSEEN_MIB = 1024  # more memory used than this, and than UNSEEN_SHARE of the card's, is use
UNSEEN_SHARE = 0.01
UNSEEN_LOAD = 5  # a load of this many percent or more is use


def unseen_use(card: Card) -> str | None:
    """What says a card is in use though NVML lists no process on it (memory used, load), or None: a process in
    a pid namespace or VM that NVML does not show here, or one it hides. Not asked of a card in MIG mode (its
    memory and load are its devices'), nor of one whose processes NVML will not list (unknown already)."""
    if card.error is not None or card.processes_error is not None or card.process_list or card.mig_mode:
        return None
    signs = []
    used, total = card.memory_used, card.memory_total
    if used is not None and total and used > max(UNSEEN_MIB * MIB, total * UNSEEN_SHARE):
        signs.append(f"{used // MIB} MiB used")
    if card.utilization_gpu is not None and card.utilization_gpu >= UNSEEN_LOAD:
        signs.append(f"{card.utilization_gpu}% load")
    return ", ".join(signs) or None


class UnseenUse(Holder):
    """A card in use by processes NVML does not name (unseen_use): busy, as a card a host process uses; --share
    and --count --max-load/--max-memory judge it as such."""

    __slots__ = ("signs",)
    process = True

    def __init__(self, card: Card, signs: str) -> None:
        super().__init__(f"card {card.index}", "", "running", [card.uuid or ""], False, "unseen", why="in use")
        self.signs = signs

    def describe(self) -> str:
        return f"an owner NVML does not name ({self.signs}, no process listed)"


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
    cards: Sequence[Card],
    holders: Iterable[Holder] | None,
    containers: Mapping[str, str] | None,
    places: ContainerCgroups | None = None,
) -> list[GpuProcess]:
    """Every process of these cards, attributed (when asked: GpuProcess). `holders`: the ledger's (None: unread, so
    whether a container's process is foreign cannot be told); `containers`: id -> name of every container of this
    daemon; `places`: where they run (the reading's)."""
    given: dict[str, set[str]] | None = None
    if holders is not None:
        given = {}
        for h in holders:
            given.setdefault(h.id, set()).update(h.uuids)
    return [
        GpuProcess(p, mig_of(p, card) or card.uuid or "", card.uuid or "", given, containers, places)
        for card in cards
        for p in card.process_list
    ]


def blocking(cards: Sequence[Card], uses: Iterable[GpuProcess], attributed: bool = True) -> dict[str, list[Holder]]:
    """Card or MIG UUID -> what holds it besides the containers given it: its foreign processes (`attributed`:
    each process's owner read from /proc; else every process, which decides the same for a request that does not
    share, as a container given the card holds it anyway), or the card itself when NVML will not list its
    processes or when its memory or load says it is used by processes NVML does not name."""
    out: dict[str, list[Holder]] = {}
    for u in uses:
        if not attributed or u.foreign is not False:
            out.setdefault(u.uuids[0], []).append(u)
    for card in cards:
        if card.processes_error is not None and card.uuid:
            out.setdefault(card.uuid, []).append(UnlistedProcesses(card))
        signs = unseen_use(card)
        if signs is not None and card.uuid:
            out.setdefault(card.uuid, []).append(UnseenUse(card, signs))
    return out


# A path part that is a container's cgroup: an optional engine prefix, the 64-hex id, an optional .scope.
_CONTAINER_PART = r"(?:([A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*)-)?([0-9a-f]{64})(?:\.scope)?"
# The runtime a cgroup prefix names (libpod: podman's scopes, `libpod-<id>.scope`, and its conmon's).
_RUNTIMES = {"libpod": "podman", "libpod-conmon": "podman", "docker": "docker"}
# ioctl(2) requests on a namespace file (linux/nsfs.h: _IO(0xb7, 2), _IO(0xb7, 4)); user namespaces nest 32 deep.
_NS_GET_PARENT, _NS_GET_OWNER_UID = 0xB702, 0xB704
_USERNS_DEPTH = 32
# /proc/self/ns/pid of the initial pid namespace: the kernel's PROC_PID_INIT_INO (include/linux/proc_ns.h).
_HOST_PID_NS = "pid:[4026531836]"


class HostProcess:
    """What /proc tells of one pid: whether it could be read, its user (the real uid's name, as ps and nvitop
    show it; the number when no user has that uid), its command name (/proc/<pid>/status Name, as ps -o comm) and
    its container id (None: the host's, or an unnamed owner). `claimed`: the container of this daemon that its
    cgroup names when it is not in it (`cgroup`: that path). `rootless_uid`: the uid whose user namespace it runs
    in (userns_owner), when it is no container's of this daemon; `runtime`: the one its cgroup's name says."""

    __slots__ = ("cgroup", "claimed", "command", "container_id", "pid", "rootless_uid", "runtime", "user", "visible")

    def __init__(
        self,
        pid: int,
        user: str | None = None,
        command: str | None = None,
        container_id: str | None = None,
        visible: bool = False,
        claimed: str | None = None,
        cgroup: str | None = None,
        rootless_uid: int | None = None,
        runtime: str | None = None,
    ) -> None:
        self.pid = pid
        self.rootless_uid = rootless_uid
        self.runtime = runtime
        self.user = user
        self.command = command
        self.container_id = container_id
        self.visible = visible
        self.claimed = claimed
        self.cgroup = cgroup


class ContainerCgroups:
    """Where each running container of this daemon is (gpupin.hostagent.ledger.read fills it from the inspects):
    its real cgroup, from the daemon's cgroup driver (`driver`: /info's CgroupDriver, or how to ask for it once)
    and its HostConfig.CgroupParent, and its pid namespace (that of its State.Pid). `ids`: every container of
    this daemon (a cgroup that names one of them elsewhere is not its)."""

    def __init__(
        self,
        containers: Mapping[str, tuple[int, str]],
        driver: str | Callable[[], str | None] | None,
        ids: Iterable[str] = (),
    ) -> None:
        self.containers = dict(containers)  # id -> (State.Pid, HostConfig.CgroupParent)
        self._driver = driver
        self.ids = frozenset(ids) | frozenset(self.containers)
        self._namespaces: dict[tuple[int, int], str] | None = None

    def driver(self) -> str | None:
        """The daemon's cgroup driver (None: unknown; then only pid namespaces name a container)."""
        if callable(self._driver):
            try:
                self._driver = self._driver()
            except Exception:  # the daemon went away since the reading: its cgroups cannot be told
                self._driver = None
        return self._driver

    def cgroup(self, cid: str) -> str | None:
        """The container's real cgroup path, as /proc/<pid>/cgroup shows it from the host (None: not known)."""
        if cid not in self.containers:
            return None
        return real_cgroup(self.driver(), self.containers[cid][1], cid)

    def owner(self, pid: int, cgroup: str, claimed: str | None) -> str | None:
        """The container of this daemon that `pid` is in (`cgroup`: its /proc/<pid>/cgroup text; `claimed`: the
        id its path names), or None."""
        real = self.cgroup(claimed) if claimed is not None else None
        if real is not None and any(_within(path, real) for path in _paths(cgroup)):
            return claimed
        ns = _namespace(str(pid))
        return self.namespaces().get(ns) if ns is not None else None

    def namespaces(self) -> dict[tuple[int, int], str]:
        """(device, inode) of a pid namespace -> the container it is, read once; the host's own namespace is no
        container's (`--pid host`)."""
        if self._namespaces is None:
            own = _namespace("self")
            found: dict[tuple[int, int], str] = {}
            for cid, (init, _) in sorted(self.containers.items()):
                ns = _namespace(str(init)) if init > 0 else None
                if ns is not None and ns != own:
                    found.setdefault(ns, cid)  # `--pid container:X` shares X's: either is in that container
            self._namespaces = found
        return self._namespaces


def real_cgroup(driver: str | None, parent: str, cid: str) -> str | None:
    """Where the daemon puts a container's cgroup (moby daemon/oci_linux.go): the systemd driver makes the scope
    `docker-<id>.scope` in the slice `parent` (default system.slice; `a-b.slice` is /a.slice/a-b.slice), cgroupfs
    the folder `<parent>/<id>` (default /docker). None for a driver it does not know."""
    if driver == "systemd":
        name = parent or "system.slice"
        if not name.endswith(".slice"):
            return None
        stem = name[: -len(".slice")]
        parts = [] if stem in ("", "-") else stem.split("-")
        return "".join(f"/{'-'.join(parts[: i + 1])}.slice" for i in range(len(parts))) + f"/docker-{cid}.scope"
    if driver == "cgroupfs":
        return f"/{(parent or '/docker').strip('/')}/{cid}".replace("//", "/")
    return None


def _paths(cgroup: str) -> list[str]:
    """The path of each hierarchy in /proc/<pid>/cgroup text (v1: one line per hierarchy; v2: `0::path`)."""
    return [line.split(":", 2)[-1] for line in cgroup.splitlines() if line.count(":") >= 2]


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")  # its own sub-cgroups (systemd or Docker in it) are its


def _namespace(pid: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:  # gone, or hidden
        return None
    return st.st_dev, st.st_ino


@functools.lru_cache(maxsize=1)
def pids_visible() -> bool:
    """Whether this process sees the host's pids (runs in the initial pid namespace), so that /proc/<pid> is the
    process NVML names."""
    try:
        return os.readlink("/proc/self/ns/pid") == _HOST_PID_NS
    except OSError:  # no /proc, or a kernel without pid namespaces: nothing to trust
        return False


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:  # gone (ENOENT, ESRCH), hidden (EACCES), or never a pid here
        return None


def container_id(cgroup: str) -> str | None:
    """The container id that /proc/<pid>/cgroup text names (the innermost one), or None for a path that names
    none. A name only: anyone may name a cgroup so (ContainerCgroups.owner says whether it is that container's)."""
    found = _named(cgroup)
    return found[0] if found is not None else None


def runtime_named(cgroup: str) -> str | None:
    """The runtime that the innermost container name in /proc/<pid>/cgroup text says made it (`libpod-<id>.scope`:
    podman), or None. A name only, like container_id."""
    found = _named(cgroup)
    return _RUNTIMES.get(found[2]) if found is not None else None


def _named(cgroup: str) -> tuple[str, str, str] | None:
    """(the id, the path that names it, the part's prefix), innermost first."""
    for path in reversed(_paths(cgroup)):
        for part in reversed(path.split("/")):
            m = re.fullmatch(_CONTAINER_PART, part)
            if m:
                return m.group(2), path, m.group(1) or ""
    return None


def _ns_key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def userns_owner(pid: int | str) -> int | None:
    """The uid that made the outermost user namespace `pid` runs in below this process's own, as the kernel tells
    it (NS_GET_OWNER_UID: for a rootless container, the user who ran the runtime, whichever uid the process has in
    it); None when it runs in this process's user namespace, is gone or hidden (reading another user's namespace
    needs root), or the kernel will not walk the namespaces."""
    try:
        own = os.stat("/proc/self/ns/user")
        fd = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    own_key = (own.st_dev, own.st_ino)
    try:
        if _ns_key(fd) == own_key:
            return None
        for _ in range(_USERNS_DEPTH):
            parent = fcntl.ioctl(fd, _NS_GET_PARENT)  # a new fd; EPERM above this process's own namespace
            outermost = _ns_key(parent) == own_key
            if outermost:
                os.close(parent)
                uid: int = struct.unpack("I", fcntl.ioctl(fd, _NS_GET_OWNER_UID, bytes(4)))[0]
                return uid
            os.close(fd)
            fd = parent
        return None
    except OSError:  # gone meanwhile, or a namespace outside this process's
        return None
    finally:
        os.close(fd)


def _user_name(uid: int, cache: dict[int, str]) -> str:
    if uid not in cache:
        import pwd

        try:
            cache[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:  # a uid no user of this host has (a container's own user, say)
            cache[uid] = str(uid)
    return cache[uid]


def locate(pid: int, places: ContainerCgroups | None = None) -> HostProcess:
    """The pid's container (one read of /proc/<pid>/cgroup); `visible` False when /proc does not show it here.
    With `places` (the ledger read), a cgroup that names a container of this daemon counts only when the process
    is really in it (ContainerCgroups.owner); else that name is `claimed`, and whose the process is cannot be said.
    Without them, the name is all there is (another engine's container, or the ledger unread: never free either way)."""
    cgroup = _read(f"/proc/{pid}/cgroup") if pids_visible() else None
    if cgroup is None:
        return HostProcess(pid)
    named = _named(cgroup)
    claimed, path, prefix = named if named is not None else (None, None, "")
    if places is not None:
        real = places.owner(pid, cgroup, claimed)
        if real is not None:
            return HostProcess(pid, container_id=real, visible=True)
        if claimed is not None and claimed in places.ids:
            return HostProcess(pid, visible=True, claimed=claimed, cgroup=path)
    # Root's own user namespaces (Docker's userns-remap, rootful podman's --userns) are no user's.
    uid = userns_owner(pid) or None
    runtime = _RUNTIMES.get(prefix) if claimed is not None else None
    return HostProcess(pid, container_id=claimed, visible=True, rootless_uid=uid, runtime=runtime)


def describe(pid: int, users: dict[int, str] | None = None, proc: HostProcess | None = None) -> HostProcess:
    """What /proc says of `pid` (its container too, unless `proc`, its `locate`, is given); fields that cannot be
    read are None. `users` caches uid -> name."""
    proc = proc if proc is not None else locate(pid)
    status = _read(f"/proc/{pid}/status") if proc.visible else None
    if status is None:
        return proc
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "Name":
            proc.command = value.strip()
        elif key == "Uid":
            fields = value.split()
            if fields and fields[0].isdigit():
                proc.user = _user_name(int(fields[0]), users if users is not None else {})
            break  # Uid comes after Name
    return proc
