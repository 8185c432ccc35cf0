"""Hostile local users against the resident agent (issue 24), with real uids under setpriv, on the sandboxed daemon:
5001 is in the agent socket's group only, 5002 also in the daemon socket's group, 5003 in neither. The agent takes
the caller's identity when it accepts the connection (a pid reused since lends no rights), builds what it creates
from the request with every refusal of `hostagent run` (a forged create body is malformed), books only for callers
who may use the daemon (a daemon on TCP: root, or --daemon-group), and its queue cannot be frozen (a count past the
host's cards, turns taken and never used, one uid's many places). Each attack here worked on the agent before."""

from __future__ import annotations

import grp
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.engine.address import Endpoint
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.run import request_json
from gpupin.hostagent.run.request import RunRequest
from tests.support.forwarder import Forwarder
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.users import as_other, reach_env, setpriv
from tests.support.wait import wait_for

A800, RTX = uuids("mixed-4")[:2]  # cards 0 and 1
AGENT_GID = 5100  # the agent socket's group
SOCKET_ONLY, DOCKER_MEMBER, NOBODY = 5001, 5002, 5003

# The hostile client: the standard library only, as any user could write it. Modes:
#   post SOCKET ROUTE    one POST, the body on stdin ("owner": "SELF" becomes this process's lease owner); prints
#                        the status and the answer's first line
#   reused SOCKET        connect from a child that hands the connection over and exits; print the child's pid, then
#                        POST /api/run the body read from stdin on that connection
#   again SOCKET         join the queue with the body on stdin, answer every turn with `again`; print each line
#   hold SOCKET          join the queue with the body on stdin, print the first line, stay until stdin closes
CLIENT = r"""
import json, os, socket, sys

def owner():
    stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    return (f"host={socket.gethostname()} pid={os.getpid()} start={stat[19]} boot={boot} "
            f"pidns={os.stat('/proc/self/ns/pid').st_ino}")

def request(sock, route, body):
    data = json.dumps(body).encode()
    sock.sendall(b"POST %s HTTP/1.0\r\nHost: agent\r\nContent-Length: %d\r\n\r\n%s" % (route.encode(), len(data), data))

def answer(sock):  # the status and the first line of the body (a join that streams is not read further)
    f = sock.makefile("rb")
    print(f.readline().split()[1].decode())
    while f.readline().strip():
        pass
    print(f.readline().decode().strip())

mode, path = sys.argv[1], sys.argv[2]
if mode == "reused":
    a, b = socket.socketpair()
    child = os.fork()
    if child == 0:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        socket.send_fds(a, [b"x"], [s.fileno()])
        os._exit(0)
    _, fds, _, _ = socket.recv_fds(b, 1, 1)
    os.waitpid(child, 0)
    print(child, flush=True)
    sock = socket.socket(fileno=fds[0])
    request(sock, "/api/run", json.loads(sys.stdin.readline()))
    answer(sock)
    sys.exit()
body = json.loads(sys.stdin.readline())
if body.get("owner") == "SELF":
    body["owner"] = owner()
sock = socket.socket(socket.AF_UNIX)
sock.connect(path)
if mode == "post":
    request(sock, sys.argv[3], body)
    answer(sock)
    sys.exit()
request(sock, "/api/queue", body)
f = sock.makefile("rb")
while f.readline().strip():
    pass
print(f.readline().decode().strip(), flush=True)
if mode == "hold":
    sys.stdin.read()
    sys.exit()
for line in f:
    print(line.decode().strip(), flush=True)
    if b'"turn"' in line:
        sock.sendall(b"again\n")
"""


# The create body of the issue: every device, the host's root bound (what an agent of wire 1 sent on as given).
FORGED = {"container": {}, "host": {"privileged": True, "binds": ["/:/host"]}, "create": {}, "raw host": {}}


def as_user(uid: int, *groups: int) -> list[str]:
    return setpriv(uid, *groups)


class Users:
    """The three hostile users' setpriv prefixes on this sandbox."""

    def __init__(self, agent: Agent) -> None:
        self.docker_gid = os.stat(agent.sandbox.host[len("unix://") :]).st_gid
        self.socket_only = as_user(SOCKET_ONLY, AGENT_GID)
        self.docker_member = as_user(DOCKER_MEMBER, AGENT_GID, self.docker_gid)
        self.nobody = as_user(NOBODY)


def client(user: list[str], mode: str, sock: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        as_other(user, [sys.executable, "-c", CLIENT, mode, sock, *args]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def post(user: list[str], sock: str, route: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    p = client(user, "post", sock, route)
    out, err = p.communicate(json.dumps(body) + "\n", timeout=120)
    assert p.returncode == 0, err
    status, answer = out.split("\n", 1)
    return int(status), json.loads(answer)


def serve(agent: Agent, *args: str, env: dict[str, str] | None = None) -> Resident:
    """An agent whose socket the agent group (AGENT_GID) may reach, as `--group` gives it."""
    r = Resident(env or agent.env, "--interval", "0.2", *args)
    os.chmod(r.dir, 0o755)
    os.chown(r.socket, 0, AGENT_GID)
    return r


@pytest.fixture
def resident(agent: Agent) -> Iterator[Resident]:
    r = serve(agent)
    yield r
    r.close()


@pytest.fixture
def users(agent: Agent) -> Users:
    return Users(agent)


def run_body(agent: Agent, daemon: str, **options: Any) -> dict[str, Any]:
    """What `hostagent run --gpu 1 TEST_IMAGE true` sends, tagged for the test's clean-up."""
    req = RunRequest(TEST_IMAGE, ["true"], gpus=["1"], labels=[f"gpupin.test={agent.tag}"], environ={}, **options)
    return {"daemon": daemon, "owner": "SELF", "request": request_json.dump(req)}


def sandbox_daemon(agent: Agent) -> str:
    return Endpoint(agent.sandbox.host).lock_key()


def created(agent: Agent) -> list[dict[str, str]]:
    return agent.containers()


def test_a_pid_reused_by_a_docker_member_lends_the_caller_no_rights(
    agent: Agent, resident: Resident, users: Users
) -> None:
    """uid 5001 connects from a child that exits, and asks once a docker member's process has that pid."""
    attacker = client(users.socket_only, "reused", resident.socket)
    assert attacker.stdout is not None and attacker.stdin is not None
    pid = int(attacker.stdout.readline())
    member = None
    for _ in range(50):  # the next pid the kernel gives is the one after ns_last_pid
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        p = subprocess.Popen([*users.docker_member, "sleep", "120"])
        if p.pid == pid:
            member = p
            break
        p.kill()
        p.wait()
    assert member is not None, f"could not start a process at pid {pid}"
    try:
        cmdline = Path(f"/proc/{pid}/cmdline")
        wait_for(lambda: b"sleep" in cmdline.read_bytes(), 10, "the docker member's process to run sleep")
        # The forged request of the issue: the lease in the docker member's process's name, and a create body
        # with every device and the host's root.
        body = run_body(agent, sandbox_daemon(agent))
        body["owner"] = str(lease.Owner.of(pid))
        body["request"]["payload"] = FORGED
        out, err = attacker.communicate(json.dumps(body) + "\n", timeout=120)
    finally:
        member.kill()
        member.wait()
    assert attacker.returncode == 0, err
    status, answer = out.split("\n", 1)
    assert (int(status), json.loads(answer)) == (
        200,
        {"direct": f"uid {SOCKET_ONLY} may not use the Docker daemon at {agent.sandbox.host}"},
    )
    assert created(agent) == []


@pytest.mark.parametrize(
    ("options", "argv"),
    [
        ({"volumes": ["/:/host"]}, ["-v", "/:/host"]),
        ({"devices": ["/dev/nvidia1"]}, ["--device", "/dev/nvidia1"]),
        ({"env": ["DOCKER_RESOURCE_GPU=0"]}, ["-e", "DOCKER_RESOURCE_GPU=0"]),
    ],
    ids=["bind-root", "device", "docker-resource-env"],
)
def test_a_hand_made_request_gets_the_refusal_hostagent_run_gives(
    agent: Agent, resident: Resident, users: Users, options: dict[str, Any], argv: list[str]
) -> None:
    body = run_body(agent, sandbox_daemon(agent))
    sent = body["request"]
    for key, value in options.items():  # past the client's own checks, as a raw client sends them
        sent["options"][key] = sent["options"].get(key, []) + value
    # An agent of the old wire took the caller's create body as given: the same options, made into it by hand.
    sent.get("payload", {}).setdefault("host", {}).update({"binds": ["/:/host"], "devices": ["/dev/nvidia1"]})
    sent.get("env", []).append(["DOCKER_RESOURCE_GPU", "0", None, False])
    status, answer = post(users.docker_member, resident.socket, "/api/run", body)
    direct = subprocess.run(
        as_other(users.docker_member, agent.argv("run", "--gpu", "1", *argv, TEST_IMAGE, "true")),
        env=reach_env({**agent.env, "GPUPIN_AGENT": "0"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert direct.returncode == 64, direct.stderr
    assert answer.get("exit") == 64 and status == 400, answer
    assert direct.stderr.count("\n") == 1 and answer["error"] in direct.stderr and answer["hint"] in direct.stderr
    assert created(agent) == []


def test_words_instead_of_a_request_are_left_to_the_caller(agent: Agent, resident: Resident, users: Users) -> None:
    """The agent parses no command line (an older client sent its words first): it makes nothing and says the run
    is the caller's own, which then parses, reads its own files and goes without it."""
    body = {
        "daemon": sandbox_daemon(agent),
        "owner": "SELF",
        "words": ["--gpu", "1", "--label", f"gpupin.test={agent.tag}", TEST_IMAGE, "true"],
        "cwd": "/",
        "stdin_tty": False,
    }
    status, answer = post(users.docker_member, resident.socket, "/api/run", body)
    assert status == 200 and set(answer) == {"direct"}, answer
    assert created(agent) == []


@pytest.mark.parametrize("forged", ["payload", "privileged", "owner"])
def test_a_forged_body_is_refused_and_creates_nothing(
    agent: Agent, resident: Resident, users: Users, forged: str
) -> None:
    body = run_body(agent, sandbox_daemon(agent))
    if forged == "payload":  # a create body of the caller's making, beside the options
        body["request"]["payload"] = FORGED
    elif forged == "privileged":
        body["request"]["options"]["privileged"] = True
    else:  # a lease in another process's name (it would live as long as that process)
        body["owner"] = str(lease.Owner.of(resident.proc.pid))
    status, answer = post(users.docker_member, resident.socket, "/api/run", body)
    assert status == 400 and answer["exit"] == 64, answer
    expected = "the caller is pid" if forged == "owner" else "the run request is malformed"
    assert expected in answer["error"]
    assert created(agent) == []


def test_a_caller_in_hundreds_of_groups_is_judged_by_all_of_them(
    agent: Agent, resident: Resident, users: Users
) -> None:
    """A docker member in 400 groups: Python's getsockopt reads at most 1024 bytes (256 groups) of SO_PEERGROUPS,
    so the agent asks libc for the rest; the daemon socket's group, far past the first 64 in the kernel's sorted
    list, still lets the caller book (before: past 256 groups, every group was lost and the run sent direct)."""
    many = sorted({*range(1, users.docker_gid), *range(20_000, 20_400)} - {AGENT_GID})[:399]
    member = as_user(DOCKER_MEMBER, AGENT_GID, *many, users.docker_gid)
    status, answer = post(member, resident.socket, "/api/run", run_body(agent, sandbox_daemon(agent)))
    assert status == 200 and "id" in answer, answer
    assert [c["ID"] for c in created(agent)] == [answer["id"]]
    # The agent's audit line: what it made, for whom as the kernel named them at accept.
    resident.close()
    made = [ln for ln in resident.stderr.splitlines() if "serve: run: " in ln]
    assert len(made) == 1 and re.fullmatch(
        f"hostagent: serve: run: {answer['id'][:12]} on {RTX} for uid {DOCKER_MEMBER} \\({DOCKER_MEMBER}\\) pid [0-9]+",
        made[0],
    ), made


@pytest.fixture
def tcp(agent: Agent) -> Iterator[Forwarder]:
    f = Forwarder(agent.sandbox.host[len("unix://") :])
    yield f
    f.close()


def test_a_daemon_on_tcp_is_booked_for_root_only_unless_a_group_is_named(
    agent: Agent, users: Users, tcp: Forwarder
) -> None:
    env = {**agent.env, "DOCKER_HOST": tcp.url}
    r = serve(agent, env=env)
    try:
        status, answer = post(users.socket_only, r.socket, "/api/run", run_body(agent, tcp.url))
        assert (status, answer) == (
            200,
            {
                "direct": f"uid {SOCKET_ONLY} may not use the Docker daemon at {tcp.url} through the agent (not a "
                "unix socket: root only, or the members of hostagent serve --daemon-group)"
            },
        )
        assert created(agent) == []
    finally:
        r.close()
    group = grp.getgrgid(users.docker_gid).gr_name  # the sandbox socket's group, whose member 5002 is
    r = serve(agent, "--daemon-group", group, env=env)
    try:
        status, answer = post(users.docker_member, r.socket, "/api/run", run_body(agent, tcp.url))
        assert status == 200 and "id" in answer, answer
        assert [c["ID"] for c in created(agent)] == [answer["id"]]
    finally:
        r.close()


def queue_body(agent: Agent, **ask: Any) -> dict[str, Any]:
    """A join of the sandbox daemon's queue (the agent queues only for callers of the daemon it serves)."""
    return {
        "daemon": sandbox_daemon(agent),
        "name": f"hostile-{uuid.uuid4().hex[:6]}",
        "image": TEST_IMAGE,
        "command": ["true"],
        **ask,
    }


def test_the_queue_takes_no_count_past_the_host_s_healthy_cards(agent: Agent, resident: Resident, users: Users) -> None:
    status, answer = post(users.docker_member, resident.socket, "/api/queue", queue_body(agent, count=99))
    assert status == 400 and answer["exit"] == 64, answer
    assert answer["error"] == "POST /api/queue: --count 99, but this host has 4 healthy whole card(s)"


def test_only_callers_who_may_use_the_daemon_join_the_queue(agent: Agent, resident: Resident, users: Users) -> None:
    status, answer = post(users.socket_only, resident.socket, "/api/queue", queue_body(agent, gpus=["1"]))
    assert status == 400 and answer["exit"] == 64, answer
    assert f"uid {SOCKET_ONLY} may not use the Docker daemon" in answer["error"]
    assert json.loads(resident.get("/api/queue")[1])["waiters"] == []
    outside = client(users.nobody, "post", resident.socket, "/api/queue")  # not in the agent's group: no connect
    _, err = outside.communicate(json.dumps(queue_body(agent, gpus=["1"])) + "\n", timeout=60)
    assert outside.returncode == 1 and "PermissionError" in err, err


def test_one_uid_holds_at_most_8_places(agent: Agent, resident: Resident, users: Users) -> None:
    held = [client(users.docker_member, "hold", resident.socket) for _ in range(8)]
    try:
        for p in held:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write(json.dumps(queue_body(agent, gpus=["2"])) + "\n")  # card 2: a host process's, never free
            p.stdin.flush()
            assert "queued" in p.stdout.readline()
        status, answer = post(users.docker_member, resident.socket, "/api/queue", queue_body(agent, gpus=["2"]))
        assert status == 409 and answer["exit"] == 75, answer
        assert answer["error"] == f"POST /api/queue: uid {DOCKER_MEMBER} already waits in 8 places of the queue"
    finally:
        for p in held:
            p.communicate("", timeout=30)
    # The agent's log: one line per join and per leave, who as the kernel named them, the request, the place.
    resident.close()
    pids = {str(p.pid) for p in held}
    lines = [ln for ln in resident.stderr.splitlines() if "serve: queue: " in ln]
    who = f": --gpu 2 for uid {DOCKER_MEMBER} ({DOCKER_MEMBER}) pid "
    joins = [ln for ln in lines if "queue: joined at " in ln]
    leaves = [ln for ln in lines if "queue: left from " in ln]
    assert [ln.split(" pid ")[0] for ln in joins] == [
        f"hostagent: serve: queue: joined at {n} of {n}{who}".split(" pid ")[0] for n in range(1, 9)
    ], lines
    assert len(leaves) == 8 and all(who in ln for ln in leaves), lines
    assert {ln.rsplit(" ", 1)[1] for ln in joins} == {ln.rsplit(" ", 1)[1] for ln in leaves} == pids, lines


def test_turns_taken_and_never_used_lose_the_place(agent: Agent, resident: Resident, users: Users) -> None:
    """A client takes its turns on card 0 and answers `again` forever: a later waiter gets the free card anyway."""
    freezer = client(users.docker_member, "again", resident.socket)
    assert freezer.stdin is not None and freezer.stdout is not None
    try:
        freezer.stdin.write(json.dumps(queue_body(agent, gpus=["0"])) + "\n")
        freezer.stdin.flush()
        assert "queued" in freezer.stdout.readline()
        while "turn" not in freezer.stdout.readline():  # its turns have begun
            pass
        began = time.monotonic()
        later = agent(
            "run", "--rm", "--gpu", "0", "--wait", "60", TEST_IMAGE, "true", GPUPIN_AGENT_SOCKET=resident.socket
        )
        took = time.monotonic() - began
        out, _ = freezer.communicate(timeout=10)
    finally:
        if freezer.poll() is None:
            freezer.kill()
            freezer.communicate()
    assert later.returncode == 0, later.stderr
    assert took < 20, took
    assert json.loads(out.strip().splitlines()[-1]) == {
        "lost": "3 turns went unused while their cards were free: the place is lost"
    }
    # Each unused turn and the loss are lines of the agent's log, naming the user and the request.
    resident.close()
    who = f": --gpu 0 for uid {DOCKER_MEMBER} ({DOCKER_MEMBER}) pid {freezer.pid}"
    lines = [ln for ln in resident.stderr.splitlines() if f"pid {freezer.pid}" in ln]
    assert lines[:4] == [
        f"hostagent: serve: queue: joined at 1 of 1{who}",
        *[f"hostagent: serve: queue: turn on {A800} unused, lapse {n} of 3{who}" for n in (1, 2, 3)],
    ], lines
    assert len(lines) == 5 and re.fullmatch(
        "hostagent: serve: queue: lost its place at 1 of [12]" + re.escape(who), lines[4]
    )
