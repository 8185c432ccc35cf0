"""What any local user can do to the resident agent (issue 24): idle connections by the hundred, and a task limit
for the agent to meet (a pids cgroup: the agent runs as root, so RLIMIT_NPROC is no limit to it)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.resident import Resident

FILES = 400  # the agent's open-file limit in the flood tests (prlimit --nofile)
FLOOD = 420  # idle connections, beyond it
PIDS = Path("/sys/fs/cgroup/pids")  # cgroup v1's pids hierarchy


def idle_tcp(port: int, n: int) -> list[socket.socket]:
    """`n` connections that send nothing."""
    held = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        held.append(s)
    return held


def idle_unix(path: str, n: int) -> list[socket.socket]:
    """`n` connections to a unix socket that send nothing (fewer where its backlog is full)."""
    held = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            pass
        except OSError:
            s.close()
            continue
        held.append(s)
    return held


def cpu_share(agent: Resident, seconds: float = 2.0) -> float:
    """The share of one core the agent used over `seconds`."""
    before = agent.cpu_seconds()
    time.sleep(seconds)
    return (agent.cpu_seconds() - before) / seconds


@contextlib.contextmanager
def task_limit(limit: int) -> Iterator[tuple[str, ...]]:
    """A pids cgroup of `limit` tasks (threads count), removed after; yields the command prefix that starts a
    process in it (for Resident's `wrap`)."""
    cg = PIDS / f"gpupin-test-{os.getpid()}"
    cg.mkdir()
    try:
        (cg / "pids.max").write_text(f"{limit}\n")
        yield ("sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh")
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:  # its last task is still leaving
                time.sleep(0.1)


def has_pids_cgroup() -> bool:
    return (PIDS / "cgroup.procs").exists()


def streams_until_refused(agent: Resident, most: int) -> tuple[list[socket.socket], bytes]:
    """Open /api/events streams (each holds one of the agent's threads) until one is not served; (the streams, what
    that one read: a 503, or nothing where the agent dropped it). Fails when `most` are served."""
    held = []
    for _ in range(most):
        s = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        held.append(s)
        s.sendall(b"GET /api/events HTTP/1.0\r\n\r\n")
        try:
            first = s.recv(4096)
        except OSError:
            first = b""
        if not first.startswith(b"HTTP/1.0 200"):
            return held, first
    for s in held:
        s.close()
    raise AssertionError(f"{most} event streams served: the agent never ran out of threads")
