"""Host processes as /proc shows them: who runs a GPU process, what it is, and which container it is in.

NVML reports compute processes by pid in the pid namespace of its caller: on the host (where hostagent runs)
those are host pids, which /proc/<pid> describes. A process that is gone, or that /proc does not show (hostagent
in a container of its own, a hidepid mount), gives None for what cannot be read: never an error, as a listing
must survive a process ending while it is read.
"""

from __future__ import annotations

import re

# A container's cgroup path ends in its 64-hex id: /docker/<id> (cgroupfs), /system.slice/docker-<id>.scope
# (systemd), .../cri-containerd-<id>.scope or /kubepods/.../<id> under Kubernetes.
_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?:\.scope)?$")


class HostProcess:
    """What /proc tells of one pid: its user (the real uid's name, as ps and nvitop show it; the number when no
    user has that uid), its command name (/proc/<pid>/status Name, as ps -o comm) and its container id."""

    __slots__ = ("command", "container_id", "pid", "user")

    def __init__(self, pid: int, user: str | None = None, command: str | None = None,
                 container_id: str | None = None) -> None:
        self.pid = pid
        self.user = user
        self.command = command
        self.container_id = container_id


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:  # gone (ENOENT, ESRCH), hidden (EACCES), or never a pid here
        return None


def container_id(cgroup: str) -> str | None:
    """The container id in /proc/<pid>/cgroup text (the innermost one), or None for a process not in one."""
    for line in reversed(cgroup.splitlines()):
        m = _CONTAINER_ID.search(line.rsplit(":", 1)[-1].rstrip("/"))
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


def describe(pid: int, users: dict[int, str] | None = None) -> HostProcess:
    """What /proc says of `pid`; fields that cannot be read are None. `users` caches uid -> name."""
    proc = HostProcess(pid)
    status = _read(f"/proc/{pid}/status")
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
    cgroup = _read(f"/proc/{pid}/cgroup")
    proc.container_id = container_id(cgroup) if cgroup is not None else None
    return proc
