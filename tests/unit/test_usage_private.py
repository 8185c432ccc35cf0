"""Usage is personal (issue 33; docs/serve.md, "Who can reach it"): the record is root's (0600), so through the
agent's socket a user sees their own intervals alone, by user, card, image and day (`hostagent usage`, /api/usage,
/metrics), while root and the policy's `[usage] readers` see everyone's; on loopback HTTP, which any local account
reaches, no row or series per user is served unless the host's owner turns it on (`serve --http-per-user`).

A resident agent without a daemon, on a record written beforehand with four users' intervals; the users are bare
uids under setpriv, each in the socket's group (nogroup), one of them also in the readers' group."""

from __future__ import annotations

import grp
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.record.store import Figures, IntervalRow, Store
from gpupin.hostagent.record.writer import user_name
from tests.support.host import HOSTAGENT, simhost_env
from tests.support.resident import Resident
from tests.support.users import as_other, reach_env, setpriv
from tests.support.wait import wait_for

NO_DOCKER = "unix:///nonexistent/docker.sock"
SOCKET_GROUP = 65534  # the agent socket's group here (nogroup): every user below may use the socket
READERS = 4242  # the group the policy names in [usage] readers (a bare gid: no group of that name is needed)
ALICE, BOB, ADMIN = 5001, 5002, 5003  # two users, and one in the readers' group
T0 = time.time() - 2 * 86400

# (uid, image, card index, seconds): each user's intervals, one hour apart, closed
INTERVALS = [
    (ALICE, "alice/train", 0, 3600.0),
    (ALICE, "alice/eval", 1, 1800.0),
    (BOB, "bob/secret-project", 2, 7200.0),
    (BOB, "bob/secret-project", 0, 600.0),
    (ADMIN, "admin/bench", 3, 60.0),
    (0, "root/burn", 3, 900.0),
]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setpriv as other users needs root")

FETCH = """
import http.client, json, socket, sys
where, paths = sys.argv[1], sys.argv[2:]
out = {}
for path in paths:
    if where.startswith("/"):
        conn = http.client.HTTPConnection("agent", timeout=10)
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.connect(where)
    else:
        conn = http.client.HTTPConnection(where, timeout=10)
    conn.request("GET", path)
    res = conn.getresponse()
    out[path] = [res.status, res.read().decode()]
    conn.close()
print(json.dumps(out))
"""


def record(folder: Path) -> Path:
    folder.mkdir(mode=0o700)
    path = folder / "record.db"
    s = Store(str(path))
    for i, (uid, image, card, seconds) in enumerate(INTERVALS):
        start = T0 + i * 3600
        row = IntervalRow(f"c{i}", f"run-{i}", image, f"GPU-{card}", card, uid, user_name(uid), start, start)
        rid = s.open_interval(row)
        s.close_interval(rid, row, Figures(start, start + seconds, energy_j=seconds * 100), start + seconds, "exit")
    s.close()
    return path


def want(uids: set[int], by: str) -> dict[str, float]:
    """The GPU-seconds per `by` of these users' intervals (by day: their sum, on whatever days)."""
    out: dict[str, float] = {}
    for uid, image, card, seconds in INTERVALS:
        if uid in uids:
            key = {"user": user_name(uid), "image": image, "card": f"GPU-{card}", "day": "all"}[by]
            out[key] = out.get(key, 0.0) + seconds
    return out


def got(rows: list[dict[str, Any]], by: str) -> dict[str, float]:
    if by == "day":
        return {"all": sum(r["gpu_seconds"] for r in rows)} if rows else {}
    return {r[by]: r["gpu_seconds"] for r in rows}


def record_of(resident: Resident) -> str:
    return resident.argv[resident.argv.index("--record") + 1]


def as_user(uid: int, *groups: int) -> list[str]:
    return setpriv(uid, SOCKET_GROUP, *groups, gid=SOCKET_GROUP)


def fetch(prefix: list[str], where: str, *paths: str) -> dict[str, tuple[int, str]]:
    """GET each path as the user `prefix` runs as: on the unix socket `where`, or HTTP at `where` (HOST:PORT)."""
    r = subprocess.run(
        as_other(prefix, [sys.executable, "-c", FETCH, where, *paths]), capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return {k: (v[0], v[1]) for k, v in json.loads(r.stdout).items()}


def series(text: str) -> dict[str, float]:
    """The per-user record series of a /metrics text: 'name{user="U"}' -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(("gpupin_gpu_seconds_total{", "gpupin_energy_joules_total{")):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Resident]]:
    """Start an agent on the record (written once), its socket for the group nogroup, with these arguments."""
    os.chmod(tmp_path, 0o755)
    path = record(tmp_path / "lib")
    started: list[Resident] = []

    def agent(*args: str) -> Resident:
        env = simhost_env(DOCKER_HOST=NO_DOCKER)
        group = grp.getgrgid(SOCKET_GROUP).gr_name
        policy = str(tmp_path / "policy.toml")  # none until a test writes it: nothing enforced, no readers
        one = Resident(env, "--record", str(path), "--group", group, "--policy", policy, *args)
        started.append(one)
        os.chmod(one.dir, 0o755)  # the socket's own mode and group say who may connect
        return one

    yield agent
    for one in started:
        one.close()


@pytest.fixture
def resident(start: Callable[..., Resident]) -> Resident:
    """An agent with no policy (who sees what, without `[usage] readers`)."""
    return start()


def test_through_the_socket_a_user_sees_their_own_usage_alone(resident: Resident) -> None:
    """`hostagent usage` as alice (the record is unreadable to her: through the socket) prints her intervals alone,
    by user, card, image and day, and says so; bob's images, cards and GPU-hours reach her in no form."""
    env = reach_env({**os.environ, "GPUPIN_AGENT_SOCKET": resident.socket, "GPUPIN_RECORD": record_of(resident)})
    for by in ("user", "card", "image", "day"):
        r = subprocess.run(
            as_other(as_user(ALICE), [HOSTAGENT, "usage", "--json", "--by", by]),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        data = json.loads(r.stdout)
        assert got(data["rows"], by) == want({ALICE}, by), (by, data)
        assert data["only"] == {"uid": ALICE, "user": user_name(ALICE)}, data
        assert "bob" not in r.stdout and "secret" not in r.stdout and "GPU-2" not in r.stdout, r.stdout
    table = subprocess.run(
        as_other(as_user(ALICE), [HOSTAGENT, "usage", "--by", "image"]), env=env, capture_output=True, text=True
    )
    assert table.returncode == 0 and [ln.split()[0] for ln in table.stdout.splitlines()[1:]] == [
        "alice/train",
        "alice/eval",
    ], table.stdout
    named = f" ({user_name(ALICE)})" if user_name(ALICE) != str(ALICE) else ""  # a bare uid is said once
    assert (
        f"usage: your own intervals alone, uid {ALICE}{named}: root and the policy's usage.readers see everyone's"
        in table.stderr
    ), table.stderr
    # /metrics on the socket: her own series, no one else's
    metrics = fetch(as_user(ALICE), resident.socket, "/metrics")["/metrics"]
    assert metrics[0] == 200 and series(metrics[1]) == {
        f'gpupin_gpu_seconds_total{{user="{user_name(ALICE)}"}}': 5400.0,
        f'gpupin_energy_joules_total{{user="{user_name(ALICE)}"}}': 540000.0,
    }, metrics[1]


def test_root_and_the_policys_readers_see_everyones(start: Callable[..., Resident], tmp_path: Path) -> None:
    """A user in the group `[usage] readers` names sees every user's rows and series on the socket, as root does,
    from the policy's reload on (SIGHUP); bob, outside it, his own alone."""
    resident = start()
    admin = fetch(as_user(ADMIN, READERS), resident.socket, "/api/usage?by=user")["/api/usage?by=user"]
    assert got(json.loads(admin[1])["rows"], "user") == want({ADMIN}, "user"), admin  # no policy: their own
    (tmp_path / "policy.toml").write_text(f'[usage]\nreaders = ["@{READERS}"]\n')
    resident.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "usage readers" in json.loads(resident.get("/api/agent")[1])["policy"]["summary"], 10, "reload")
    everyone = {uid for uid, *_ in INTERVALS}
    paths = [f"/api/usage?by={by}" for by in ("user", "card", "image", "day")] + ["/metrics"]
    for prefix in (as_user(ADMIN, READERS), []):  # the readers' group, and root (no setpriv)
        seen = fetch(prefix, resident.socket, *paths) if prefix else {p: resident.get(p, unix=True) for p in paths}
        for by in ("user", "card", "image", "day"):
            status, body = seen[f"/api/usage?by={by}"][:2]
            assert status == 200, body
            data = json.loads(body)
            assert got(data["rows"], by) == want(everyone, by) and data["only"] is None, (prefix, by, data)
        metrics = seen["/metrics"][1]
        text = metrics.decode() if isinstance(metrics, bytes) else metrics
        assert {k for k in series(text) if k.startswith("gpupin_gpu_seconds")} == {
            f'gpupin_gpu_seconds_total{{user="{user_name(uid)}"}}' for uid in everyone
        }, text
    bob = fetch(as_user(BOB), resident.socket, "/api/usage?by=user")["/api/usage?by=user"]
    assert got(json.loads(bob[1])["rows"], "user") == want({BOB}, "user"), bob


def test_loopback_http_serves_no_usage_per_user_unless_turned_on(start: Callable[..., Resident]) -> None:
    """On HTTP (any local account, here alice): /api/usage?by=user is refused (403, one JSON line that says how to
    turn it on), the host's totals by card, image and day are served, and /metrics has no per-user series; an agent
    started with --http-per-user serves both."""
    resident = start()
    url = f"127.0.0.1:{resident.port}"
    everyone = {uid for uid, *_ in INTERVALS}
    paths = [f"/api/usage?by={by}" for by in ("user", "card", "image", "day")] + ["/metrics"]
    seen = fetch(as_user(ALICE), url, *paths)
    status, body = seen["/api/usage?by=user"]
    assert status == 403 and body.count("\n") == 1, body
    refusal = json.loads(body)
    assert refusal["error"] == "usage per user is not served over HTTP by this agent", refusal
    assert "--http-per-user" in refusal["hint"] and refusal["exit"] == 64, refusal
    for by in ("card", "image", "day"):
        status, body = seen[f"/api/usage?by={by}"]
        assert status == 200 and got(json.loads(body)["rows"], by) == want(everyone, by), (by, body)
    metrics = seen["/metrics"]
    assert metrics[0] == 200 and "gpupin_gpu_utilization_percent" in metrics[1], metrics
    assert series(metrics[1]) == {} and "gpupin_gpu_seconds" not in metrics[1], metrics[1]
    resident.close()
    on = start("--http-per-user")  # the same record
    seen = fetch(as_user(ALICE), f"127.0.0.1:{on.port}", *paths)
    status, body = seen["/api/usage?by=user"]
    assert status == 200 and got(json.loads(body)["rows"], "user") == want(everyone, "user"), body
    assert {k for k in series(seen["/metrics"][1]) if k.startswith("gpupin_gpu_seconds")} == {
        f'gpupin_gpu_seconds_total{{user="{user_name(uid)}"}}' for uid in everyone
    }
