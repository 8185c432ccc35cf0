"""Host processes as /proc shows them: which container a GPU process runs in, who runs it, and what it is.

NVML reports a card's processes by their pids in the host's pid namespace. /proc describes those pids only when
hostagent runs in that namespace too: in a pid namespace of its own (a container without `--pid host`) a pid from
NVML names another process or none, so nothing is read there (`pids_visible`). A process that is gone, or that
/proc hides (a hidepid mount), gives None for what cannot be read: never an error, as a listing must survive a
process ending while it is read.

The container comes from /proc/<pid>/cgroup (cgroup v1 or v2, the systemd or the cgroupfs driver): a path part
that ends in a 64-hex id, bare or with an engine's prefix and `.scope` (`/docker/<id>`,
`/system.slice/docker-<id>.scope`, `cri-containerd-<id>`, `crio-<id>`, `libpod-<id>`, `nerdctl-<id>`, Kubernetes'
`/kubepods/.../<id>`). A cgroup that names no container (a session scope, `/process_api/<32 hex>`, a service)
is the host's.
"""

from __future__ import annotations

import functools
import os
import re

# A path part that is a container's cgroup: an optional engine prefix, the 64-hex id, an optional .scope.
_CONTAINER_PART = re.compile(r"(?:[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*-)?([0-9a-f]{64})(?:\.scope)?")
# /proc/self/ns/pid of the initial pid namespace: the kernel's PROC_PID_INIT_INO (include/linux/proc_ns.h).
_HOST_PID_NS = "pid:[4026531836]"


class HostProcess:
    """What /proc tells of one pid: whether it could be read, its user (the real uid's name, as ps and nvitop
    show it; the number when no user has that uid), its command name (/proc/<pid>/status Name, as ps -o comm) and
    its container id (None: the host's)."""

    __slots__ = ("command", "container_id", "pid", "user", "visible")

    def __init__(
        self,
        pid: int,
        user: str | None = None,
        command: str | None = None,
        container_id: str | None = None,
        visible: bool = False,
    ) -> None:
        self.pid = pid
        self.user = user
        self.command = command
        self.container_id = container_id
        self.visible = visible


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
    """The container id in /proc/<pid>/cgroup text (the innermost one), or None for a process not in one."""
    for line in reversed(cgroup.splitlines()):
        for part in reversed(line.split(":", 2)[-1].split("/")):
            m = _CONTAINER_PART.fullmatch(part)
            if m:
                return m.group(1)
    return None


def _user_name(uid: int, cache: dict[int, str]) -> str:
    if uid not in cache:
        import pwd

        try:
            cache[uid] = pwd.getpwuid(uid).pw_name
        except KeyError:  # a uid no user of this host has (a container's own user, say)
            cache[uid] = str(uid)
    return cache[uid]


def locate(pid: int) -> HostProcess:
    """The pid's container (one read of /proc/<pid>/cgroup: what `hostagent run` needs for every process);
    `visible` False when /proc does not show it here."""
    cgroup = _read(f"/proc/{pid}/cgroup") if pids_visible() else None
    if cgroup is None:
        return HostProcess(pid)
    return HostProcess(pid, container_id=container_id(cgroup), visible=True)


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
