"""No single point of denial (issue 33; docs/serve.md, "Limits"), on the sandboxed daemon with real uids under
setpriv: uid 5003, in no group at all, holds 8 x 64 `/api/events` streams on the agent's HTTP port from 127.0.0.2
to 127.0.0.9 (and opens again each one turned away), and meanwhile the agent's socket users are served at once:
5002 (the socket's group and the daemon's) runs through the agent and extends its booking, 5001 (the socket's
group only) reads the queue and its usage, each within 2 s. Before, every listener shared one count of 512: the
flood took it all, `queue`, `usage` and `extend` exited 69 and `run` died on a 503 closed under its request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docker.test_hostile_agent import AGENT_GID, DOCKER_MEMBER, NOBODY, SOCKET_ONLY, serve
from tests.docker.test_run_agent import went_through_the_agent
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.users import as_other, reach_env, setpriv
from tests.support.wait import wait_for

ANSWER_S = 2.0  # the contract: a socket user's command answers within this while the flood lasts
ADDRESSES = [f"127.0.0.{n}" for n in range(2, 10)]
EACH = 64
STREAMS_PER_USER = 16  # gpupin.hostagent.serve.connections.STREAMS_PER_USER

POLICY = """
[booking]
default = "1h"
max = "2h"
"""

# The flood, the standard library only, as any user could write it: EACH /api/events streams from each address
# given, kept open and read; one that is turned away or closed is opened again a second later. Each second it
# prints what it holds: {"streams": served now, "refused": 503s read whole, "cut": ended without an answer,
# "ended": streams the agent ended, "opened": connections made}.
FLOOD = r"""
import collections, json, selectors, socket, sys, time
port, each, addresses = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
sel = selectors.DefaultSelector()
stats = {"streams": 0, "refused": 0, "cut": 0, "ended": 0, "opened": 0}
later = collections.deque()  # (when, address), in the order they are due

def open_one(addr):
    s = socket.socket()
    s.bind((addr, 0))
    s.setblocking(False)
    try:
        s.connect(("127.0.0.1", port))
    except BlockingIOError:
        pass
    except OSError:
        s.close()
        later.append((time.monotonic() + 1, addr))
        return
    stats["opened"] += 1
    sel.register(s, selectors.EVENT_WRITE, [addr, b"", False])

for addr in addresses:
    for _ in range(each):
        open_one(addr)
said = time.monotonic()
while True:
    for key, ev in sel.select(0.2):
        s, st = key.fileobj, key.data
        if ev & selectors.EVENT_WRITE:
            try:
                s.send(b"GET /api/events HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            except OSError:
                pass
            sel.modify(s, selectors.EVENT_READ, st)
            continue
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if st[2]:  # a stream: read on, until it ends
            if not data:
                stats["streams"] -= 1
                stats["ended"] += 1
                sel.unregister(s)
                s.close()
                later.append((time.monotonic() + 1, st[0]))
            continue
        st[1] += data
        head, sep, body = st[1].partition(b"\r\n\r\n")
        if data and not sep:
            continue
        if head.startswith(b"HTTP/1.0 200"):
            st[2] = True
            stats["streams"] += 1
            continue
        if data and b"\n" not in body:  # the refusal's line is still coming
            continue
        try:
            whole = head.startswith(b"HTTP/1.0 503") and "error" in json.loads(body.split(b"\n")[0])
        except ValueError:
            whole = False
        stats["refused" if whole else "cut"] += 1
        sel.unregister(s)
        s.close()
        later.append((time.monotonic() + 1, st[0]))
    now = time.monotonic()
    while later and later[0][0] <= now:
        open_one(later.popleft()[1])
    if now - said >= 1:
        said = now
        print(json.dumps(stats), flush=True)
"""


class Flood:
    """FLOOD as `user`, against `port`; `stats()` its last line."""

    def __init__(self, user: list[str], port: int) -> None:
        argv = [sys.executable, "-c", FLOOD, str(port), str(EACH), *ADDRESSES]
        self.proc = subprocess.Popen(as_other(user, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.last: dict[str, int] = {}

    def stats(self) -> dict[str, int]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else "the flood ended"
        self.last = json.loads(line)
        return self.last

    def cpu_seconds(self) -> float:
        """The flooder's own CPU so far (/proc/PID/stat: setpriv execs it, the pid stays)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        self.proc.kill()
        self.proc.communicate()


class Lab:
    """The agent under a policy (bookings of 1h), the socket's users and the flooder."""

    def __init__(self, agent: Agent, tmp: Path) -> None:
        self.agent = agent
        policy = tmp / "policy.toml"
        policy.write_text(POLICY)
        self.resident: Resident = serve(agent, "--policy", str(policy))
        docker_gid = os.stat(agent.sandbox.host[len("unix://") :]).st_gid
        self.member = setpriv(DOCKER_MEMBER, AGENT_GID, docker_gid)
        self.socket_only = setpriv(SOCKET_ONLY, AGENT_GID)
        self.nobody = setpriv(NOBODY)

    def timed(self, user: list[str], *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
        full = reach_env({**self.agent.env, "GPUPIN_AGENT_SOCKET": self.resident.socket, **env})
        started = time.monotonic()
        r = subprocess.run(as_other(user, self.agent.argv(*args)), env=full, capture_output=True, text=True, timeout=60)
        return r, time.monotonic() - started


@pytest.fixture
def lab(agent: Agent, tmp_path: Path) -> Iterator[Lab]:
    os.chmod(tmp_path, 0o755)
    lab = Lab(agent, tmp_path)
    yield lab
    lab.resident.close()


def figures(line: str) -> None:
    """A figure for docs/serve.md and the closing note (pytest -s shows it)."""
    print(f"flood figure: {line}")


def test_a_groupless_flood_of_event_streams_leaves_the_socket_users_served_within_2s(lab: Lab, tmp_path: Path) -> None:
    name = f"flood-{lab.agent.tag}"
    r, _ = lab.timed(lab.member, "run", "-d", "--name", name, "--gpu", "1", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: any(h["name"] == name for g in lab.resident.ls()["gpus"] for h in g["holders"]),
        20,
        "the agent to see the booked container",
    )
    commands: dict[str, tuple[list[str], tuple[str, ...]]] = {
        "run": (lab.member, ("run", "-d", "--gpu", "0", TEST_IMAGE, "true")),
        "extend": (lab.member, ("extend", name, "30m")),
        "queue": (lab.socket_only, ("queue",)),
        "usage": (lab.socket_only, ("usage",)),
    }
    at_rest = {what: lab.timed(user, *args)[1] for what, (user, args) in commands.items()}
    flood_cpu, flood_began = lab.resident.cpu_seconds(), time.monotonic()
    flood = Flood(lab.nobody, lab.resident.port)
    try:
        while flood.stats()["opened"] < len(ADDRESSES) * EACH:
            pass
        flood.stats()  # a second more: every stream asked for, the refused ones opening again
        cpu_before, began = lab.resident.cpu_seconds(), time.monotonic()
        traces = lab.resident.dir / "traces"  # the run writes its trace as uid 5002: a folder it may write
        traces.mkdir(mode=0o777)
        os.chmod(traces, 0o777)
        trace = traces / "trace"
        runs = {
            what: lab.timed(user, *args, **({"GPUPIN_TRACE": str(trace)} if what == "run" else {}))
            for what, (user, args) in commands.items()
        }
        # The HTTP listener's other users: root's scrape, a caller of its own uid, is not the flooder's to deny.
        metrics_began = time.monotonic()
        try:
            metrics = lab.resident.get("/metrics", timeout=ANSWER_S)[0]
        except OSError:
            metrics = 0
        metrics_took = time.monotonic() - metrics_began
        cpu = (lab.resident.cpu_seconds() - cpu_before) / (time.monotonic() - began)
        during = flood.stats()
        flood_s = time.monotonic() - flood_began
        flood_cpu = (lab.resident.cpu_seconds() - flood_cpu) / flood_s
        flooder_cpu = flood.cpu_seconds() / flood_s
    finally:
        flood.close()
    for what, (p, took) in runs.items():
        figures(f"{what}: exit {p.returncode} in {took:.2f}s during the flood, {at_rest[what]:.2f}s before it")
    figures(f"GET /metrics (root, HTTP): {metrics} in {metrics_took:.2f}s")
    figures(f"the agent's CPU during the commands: {cpu:.0%} of a core")
    figures(f"the agent's CPU over the whole flood ({flood_s:.1f}s): {flood_cpu:.0%} of a core")
    figures(f"the flooder's own CPU over it: {flooder_cpu:.0%} of a core")
    figures(f"the flood: {json.dumps(during)}")
    for what, (p, took) in runs.items():
        assert p.returncode == 0 and "Traceback" not in p.stderr, (what, p.stderr)
        assert took < ANSWER_S, (what, took, p.stderr)
    assert went_through_the_agent(trace), runs["run"][0].stderr
    assert "booked until" in runs["extend"][0].stdout
    assert metrics == 200 and metrics_took < ANSWER_S
    # The flooder's streams are its uid's, whatever address it connects from; the rest are refused whole.
    assert during["streams"] <= STREAMS_PER_USER and during["refused"] > 0, during
    assert during["cut"] == 0, during
    code, _, log = lab.resident.stop()
    assert code == 0 and "internal error" not in log and "Traceback" not in log, log
