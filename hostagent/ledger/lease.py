"""Leases: the labels a hostagent writes on the objects that count only while it works on them (the ledger lock, and a
pinned container between its create and its start), so that every other client can tell whether they still count:
live, dead or expired, by the daemon's clock. `Renewal` renews a long start's lease on the daemon, through volumes,
for the clients that cannot see its owner (docs/design.md, "The lease").
"""

from __future__ import annotations

import contextlib
import os
import threading

from gpupin.hostagent import engine, start_thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer


OWNER_LABEL = "gpupin.owner"
LEASE_LABEL = "gpupin.lease"
LEASE_S = 30  # long enough for a loaded daemon's list + create; short enough that a dead remote client is forgotten
MAX_LEASE_S = 300  # a lease label is trusted up to this, so a bogus one cannot block a daemon for long

LIVE = "live"
DEAD = "dead"
EXPIRED = "expired"


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None when unreadable.

    With the pid it names one process for the life of a boot: a pid that was reused has another start time."""
    stat = _read(f"/proc/{pid}/stat")
    if ")" not in stat:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # the command name in parentheses may hold blanks
    return fields[19] if len(fields) > 19 else None


def pid_namespace(pid: int | None = None) -> str:
    """The pid namespace of a process (this one by default), as an inode number; "" when unreadable."""
    try:
        return str(os.stat(f"/proc/{'self' if pid is None else pid}/ns/pid").st_ino)
    except OSError:
        return ""


class Owner:
    """The hostagent process that holds a lease."""

    __slots__ = ("boot", "host", "pid", "pidns", "start")

    def __init__(self, host: str, pid: int, start: str, boot: str, pidns: str) -> None:
        self.host = host
        self.pid = pid
        self.start = start
        self.boot = boot
        self.pidns = pidns

    @classmethod
    def of(cls, pid: int) -> Owner:
        """A process of this host and pid namespace (the resident agent signs its caller's container so)."""
        import socket

        return cls(
            socket.gethostname(),
            pid,
            start_time(pid) or "",
            _read("/proc/sys/kernel/random/boot_id"),
            pid_namespace(),
        )

    @classmethod
    def parse(cls, text: str | None) -> Owner | None:
        """The owner a label names (`host=H pid=N start=T boot=B pidns=P`), or None when it names none."""
        if not text:
            return None
        fields = dict(part.partition("=")[::2] for part in text.split())
        try:
            pid = int(fields.get("pid", ""))
        except ValueError:
            return None
        return cls(
            fields.get("host", "?"), pid, fields.get("start", ""), fields.get("boot", ""), fields.get("pidns", "")
        )

    def __str__(self) -> str:
        return f"host={self.host} pid={self.pid} start={self.start} boot={self.boot} pidns={self.pidns}"

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def alive(self) -> bool | None:
        """Whether the owner still runs: True or False for a process of this boot and pid namespace, None when
        this process cannot tell (another machine or namespace, or /proc hides it)."""
        here = this_process()
        if not (self.boot and self.pidns and self.start) or (self.boot, self.pidns) != (here.boot, here.pidns):
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # another user's process: it exists
        start = start_time(self.pid)
        if start is None:
            return None  # /proc mounted with hidepid: only the lease can tell
        return start == self.start


_THIS_PROCESS: Owner | None = None


def this_process() -> Owner:
    """This process, as it signs its leases (read once)."""
    global _THIS_PROCESS
    if _THIS_PROCESS is None:
        _THIS_PROCESS = Owner.of(os.getpid())
    return _THIS_PROCESS


def claim(seconds: int = LEASE_S) -> dict[str, str]:
    """The labels of a lease held by this process."""
    return {OWNER_LABEL: str(this_process()), LEASE_LABEL: str(seconds)}


def seconds(labels: Mapping[str, str]) -> float:
    """The lease's length, from its label (LEASE_S when missing or malformed; at most MAX_LEASE_S)."""
    try:
        value = float(labels.get(LEASE_LABEL) or LEASE_S)
    except ValueError:
        value = LEASE_S
    return min(max(value, 1.0), MAX_LEASE_S) if value == value else float(LEASE_S)


def state(
    labels: Mapping[str, str],
    created: float,
    now: float,
    renewed: Callable[[], float | None] | None = None,
    *,
    owner_alive_holds: bool = True,
) -> str:
    """LIVE, DEAD or EXPIRED: a lease on an object created at `created`, seen at `now` (both the daemon's
    clock, in seconds since the epoch). `renewed`: when its owner last renewed it (asked only when the owner
    cannot be seen from here and the time since the creation is up). `owner_alive_holds`: a live owner keeps it
    live whatever its age (a container's lease; not the lock's)."""
    owner = Owner.parse(labels.get(OWNER_LABEL))
    alive = owner.alive() if owner is not None else None
    if alive is False:
        return DEAD
    if alive and owner_alive_holds:
        return LIVE
    if now - created <= seconds(labels):
        return LIVE
    last = renewed() if renewed is not None and alive is None else None
    return LIVE if last is not None and now - last <= seconds(labels) else EXPIRED


def holder_of(labels: Mapping[str, str]) -> str:
    owner = Owner.parse(labels.get(OWNER_LABEL))
    return owner.describe() if owner is not None else "an unknown client"


OF_LABEL = "gpupin.lease.of"
EVERY_S = LEASE_S / 3


def _name(cid: str, n: int) -> str:
    return f"gpupin-lease-{cid[:12]}-{n}"


def _renewals(api: Any, cid: str) -> list[DaemonAnswer]:
    import json

    data, _ = engine.fetch(api, "/volumes", {"filters": json.dumps({"label": [f"{OF_LABEL}={cid}"]})})
    return list(data.get("Volumes") or [])


def renewed_at(api: Any, cid: str) -> float | None:
    """When the container's owner last renewed its lease (the daemon's clock), or None when it never did."""
    times = [engine.created_time(str(v.get("CreatedAt"))) for v in _renewals(api, cid) if v.get("CreatedAt")]
    return max(times, default=None)


def forget(api: Any, cid: str) -> None:
    """Remove the container's renewals (its start is over, or it was abandoned)."""
    for v in _renewals(api, cid):
        with contextlib.suppress(Exception):  # gone already, or in use by nothing that matters: best effort
            api.remove_volume(v["Name"], force=True)


class Renewal:
    """`with Renewal(cid, version):` around a start: renews the container's lease every EVERY_S on a thread of its
    own, then removes what it made. Its client (the SDK, in the container's API version) is made only when a start
    takes that long: a quick start costs nothing."""

    def __init__(self, cid: str, version: str) -> None:
        self.cid = cid
        self.version = version
        self._api: Any = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._made = False

    def _run(self) -> None:
        n = 0
        while not self._done.wait(EVERY_S):
            n += 1
            try:
                self._api = api = self._api or engine.connect(version=self.version)
                api.create_volume(_name(self.cid, n), labels={OF_LABEL: self.cid, **claim()})
                self._made = True
                if n > 1:
                    api.remove_volume(_name(self.cid, n - 1), force=True)
            except Exception:  # a failed renewal is tried again next time; the start decides the run's fate
                continue

    def __enter__(self) -> Renewal:
        self._thread = start_thread(self._run, "hostagent-lease")
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self._made:
            forget(self._api, self.cid)
