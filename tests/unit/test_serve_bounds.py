"""The resident agent against any local user (issue 24; docs/serve.md, "Limits" and "Who can reach it"), without a
daemon: a flood of idle connections beyond its open-file limit neither spins it nor keeps /api/ls from answering;
under a task limit idle connections cost no thread and a thread it cannot start is a 503, never a traceback; one
uid's idle connections beyond its cap do not keep another uid out; a request naming a Host that is not the agent's
is refused (DNS rebinding); a head or a body that does not come in time is closed; EMFILE at accept backs off; and
a client gives an agent that takes its connection but never answers a few seconds, then takes its own path (run)
or says so (queue, 69). Users are bare uids under setpriv."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.flood import FILES, FLOOD, cpu_share, has_pids_cgroup, idle_tcp, streams_until_refused, task_limit
from tests.support.host import HOSTAGENT, simhost_env
from tests.support.resident import Resident
from tests.support.users import as_other, reach_env, setpriv
from tests.unit.test_serve_robust import Wedged

NO_DOCKER = "unix:///nonexistent/docker.sock"
ATTACKER, OTHER = 5001, 5002
PER_USER = 64  # --max-per-user's default (docs/serve.md, "Limits")
SOCKET_GROUP = grp.getgrgid(65534).gr_name  # the agent socket's group in these tests (nogroup)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setpriv and prlimit as other users need root")


def as_user(uid: int, *argv: str) -> list[str]:
    return as_other(setpriv(uid, 65534, gid=65534), argv)


def timed_get(agent: Resident, path: str, unix: bool) -> tuple[int, float]:
    started = time.monotonic()
    try:
        status = agent.get(path, unix=unix, timeout=5)[0]
    except OSError:
        status = 0
    return status, time.monotonic() - started


@pytest.fixture
def closing() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for s in held:
        s.close()


def test_idle_connections_beyond_the_open_file_limit_neither_spin_the_agent_nor_stop_its_answers(
    closing: list[socket.socket],
) -> None:
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), wrap=("prlimit", f"--nofile={FILES}:{FILES}", "--"))
    try:
        closing += idle_tcp(agent.port, FLOOD)
        time.sleep(1.0)  # every one reached the agent (or its backlog)
        share = cpu_share(agent)
        assert share < 0.2, f"the agent used {share:.0%} of a core with {FLOOD} idle connections open"
        for unix in (True, False):
            status, took = timed_get(agent, "/api/ls", unix)
            assert status == 200, (unix, status, took)  # answered within the request's 5 s
        assert agent.fds() < FILES, agent.fds()
    finally:
        agent.close()
    assert "Traceback" not in agent.stderr, agent.stderr


@pytest.mark.skipif(not has_pids_cgroup(), reason="no cgroup v1 pids hierarchy here")
def test_under_a_task_limit_idle_connections_cost_no_thread_and_a_thread_refused_is_a_503(
    closing: list[socket.socket],
) -> None:
    limit = 24  # the agent's own threads (~6), with room for a few requests
    with task_limit(limit) as enter:
        under_a_task_limit(Resident(simhost_env(DOCKER_HOST=NO_DOCKER), wrap=enter), limit, closing)


def under_a_task_limit(agent: Resident, limit: int, closing: list[socket.socket]) -> None:
    try:
        closing += idle_tcp(agent.port, 80)
        time.sleep(1.0)
        assert agent.threads() < 12, agent.threads()  # none per idle connection
        status, took = timed_get(agent, "/api/ls", unix=False)
        assert status == 200, (status, took)  # answered within the request's 5 s
        # Event streams hold a thread each: past the task limit, the next one is answered 503 in one line.
        streams, refused = streams_until_refused(agent, 2 * limit)
        closing += streams
        head, _, body = refused.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 503 Service Unavailable"), refused
        assert "cannot start a thread" in json.loads(body)["error"], refused
    finally:
        agent.close()
    assert "Traceback" not in agent.stderr and "can't start new thread" not in agent.stderr, agent.stderr


HOLD = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        break
    held.append(s)
print(len(held), flush=True)
time.sleep(120)
"""

GET = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
s.sendall(b"GET /api/ls HTTP/1.0\\r\\n\\r\\n")
print(s.recv(64).split(b"\\r\\n")[0].decode())
"""


def test_one_uids_idle_connections_beyond_its_cap_do_not_keep_another_uid_out() -> None:
    agent = Resident(
        simhost_env(DOCKER_HOST=NO_DOCKER),
        "--group",
        SOCKET_GROUP,
        wrap=("prlimit", f"--nofile={FILES}:{FILES}", "--"),
    )
    holder = subprocess.Popen(
        as_user(ATTACKER, sys.executable, "-c", HOLD, agent.socket, str(FLOOD)), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        opened = int(holder.stdout.readline())
        assert opened > PER_USER, opened  # connected: the agent's backlog and its cap take them
        time.sleep(1.0)
        r = subprocess.run(
            as_user(OTHER, sys.executable, "-c", GET, agent.socket), capture_output=True, text=True, timeout=30
        )
        assert r.stdout.strip() == "HTTP/1.0 200 OK", (r.stdout, r.stderr)  # in, within its socket's 5 s
        assert agent.fds() < PER_USER + 50, agent.fds()  # the attacker's beyond its cap were closed, not kept
        assert cpu_share(agent, 1.0) < 0.3
    finally:
        holder.kill()
        holder.wait()
        agent.close()


def raw_get(port: int, host: str | None) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /api/ls HTTP/1.1\r\n" + (b"Host: %s\r\n" % host.encode() if host else b"") + b"\r\n")
        reply = b""
        while chunk := s.recv(1 << 16):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_http_answers_only_to_its_own_host_names() -> None:
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER))
    try:
        p = agent.port
        for ok in (f"127.0.0.1:{p}", "localhost", f"LOCALHOST:{p}", f"[::1]:{p}", "192.0.2.7", None):
            assert raw_get(p, ok)[0] == 200, ok
        for bad in (f"rebind.example.com:{p}", "localhost.evil.com", "gpu1.example.org"):
            status, body = raw_get(p, bad)
            assert status == 421, (bad, status)
            lines = body.decode().splitlines()
            assert len(lines) == 1 and "does not answer to the name" in json.loads(lines[0])["error"], body
        # The unix socket: no browser reaches it, no Host check there.
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(agent.socket)
            s.sendall(b"GET /api/ls HTTP/1.1\r\nHost: rebind.example.com\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.0 200"), "the unix socket checks no Host"
    finally:
        agent.close()
    named = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), "--http-host", "gpu1.example.org")  # its public name
    try:
        assert raw_get(named.port, "GPU1.example.org:9417")[0] == 200
        assert raw_get(named.port, "gpu1.example.org.evil.com")[0] == 421
    finally:
        named.close()
    bad_name = subprocess.run(
        [HOSTAGENT, "serve", "--http-host", "a b"], env=simhost_env(), capture_output=True, text=True, timeout=30
    )
    assert bad_name.returncode == 64 and bad_name.stderr.startswith("hostagent: ERROR: --http-host"), bad_name.stderr


def test_an_agent_that_never_answers_costs_a_client_a_few_seconds(tmp_path: Path) -> None:
    wedged = Wedged(tmp_path / "agent.sock")
    try:
        env = simhost_env(DOCKER_HOST=NO_DOCKER, GPUPIN_AGENT_SOCKET=str(tmp_path / "agent.sock"))
        started = time.monotonic()
        q = subprocess.run([HOSTAGENT, "queue"], env=env, capture_output=True, text=True, timeout=30)
        took = time.monotonic() - started
        assert q.returncode == 69 and took < 6, (q.returncode, took, q.stderr)
        assert q.stderr.startswith("hostagent: ERROR: the agent at unix://") and "Traceback" not in q.stderr
        # `run`: its own path after the agent's few seconds (here it finds no daemon: the daemon's error, not the
        # agent's).
        started = time.monotonic()
        r = subprocess.run(
            [HOSTAGENT, "run", "--rm", "--gpu", "0", "img", "true"], env=env, capture_output=True, text=True, timeout=60
        )
        took = time.monotonic() - started
        assert took < 10, (took, r.stderr)
        assert "the agent at" not in r.stderr and "Docker daemon" in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        wedged.close()


def closed_within(s: socket.socket, seconds: float, trickle: bytes = b"") -> float:
    """How long until the agent closes `s` (sending `trickle` a byte a second meanwhile); fails past `seconds`."""
    started = time.monotonic()
    s.settimeout(1.0)
    sent = 0
    while time.monotonic() - started < seconds:
        try:
            data = s.recv(4096)
        except TimeoutError:
            if sent < len(trickle):
                with contextlib.suppress(OSError):
                    s.send(trickle[sent : sent + 1])
                sent += 1
            continue
        except ConnectionResetError:
            data = b""
        if not data or data.startswith(b"HTTP/1.0 400"):
            return time.monotonic() - started
    raise AssertionError(f"the agent kept the connection past {seconds} s")


def test_a_request_that_does_not_come_in_time_is_closed() -> None:
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER))
    try:
        with socket.create_connection(("127.0.0.1", agent.port)) as idle:
            assert closed_within(idle, 8) >= 4  # nothing sent: HEAD_S from accept
        with socket.create_connection(("127.0.0.1", agent.port)) as slow:
            slow.sendall(b"GET /api/ls HTTP/1.0\r\n")
            assert closed_within(slow, 8, b"X-Slow: " + b"y" * 60) >= 4  # a head that never ends
        with socket.socket(socket.AF_UNIX) as body:
            body.connect(agent.socket)
            body.sendall(b"POST /api/queue HTTP/1.0\r\nContent-Length: 100\r\n\r\n{")
            assert closed_within(body, 14, b" " * 99) >= 9  # a body trickled: 400 at BODY_S
        assert agent.get("/api/ls")[0] == 200
    finally:
        agent.close()


def test_out_of_files_at_accept_backs_off_and_says_so_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """EMFILE at accept: the listener is left alone for a while (no spinning on a backlog it cannot take), said
    once, and the waiting connection is served once files are back."""
    import errno
    import socketserver

    from gpupin.hostagent.serve import connections

    said: list[str] = []
    monkeypatch.setattr(connections, "say", said.append)
    served: list[bytes] = []

    class Server(socketserver.TCPServer):
        out_of_files = True
        tries = 0

        def get_request(self) -> tuple[socket.socket, object]:
            self.tries += 1
            if self.out_of_files:
                raise OSError(errno.EMFILE, "Too many open files")
            return super().get_request()

    server = Server(("127.0.0.1", 0), socketserver.BaseRequestHandler)

    def serve(_server: socketserver.TCPServer, sock: connections.AcceptedConnection) -> None:
        served.append(sock.head)
        sock.sendall(b"HTTP/1.0 204 No Content\r\n\r\n")

    gate = connections.Acceptor([server], connections.Limits(), lambda caller: caller[0], serve)
    gate.start()
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as client:
            client.sendall(b"GET / HTTP/1.0\r\n\r\n")
            time.sleep(2.0)
            assert server.tries <= 2.0 / connections.BACK_OFF_S + 2, server.tries  # not a spin
            assert said == ["cannot accept connections (Too many open files): trying again every 0.5s"], said
            server.out_of_files = False
            assert client.recv(64).startswith(b"HTTP/1.0 204"), "served once files are back"
        assert served == [b"GET / HTTP/1.0\r\n\r\n"] and said[-1] == "accepting connections again"
    finally:
        gate.stop()
        server.server_close()


NOBODY = 5003  # a local account in no group at all

# Two requests being served (their bodies trickle in), as a uid's whole cap: the next connection of that uid is
# refused at once. Prints "held" once both are in.
TRICKLE = """
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.sendall(b"POST /api/run HTTP/1.0\\r\\nContent-Length: 100\\r\\n\\r\\n{")
    held.append(s)
print("held", flush=True)
time.sleep(60)
"""

# A request larger than the socket's buffers, as a refused client sends it whole before it reads: what it reads.
BIG_POST = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
body = b'{"pad": "' + b"x" * 600_000 + b'"}'
try:
    s.sendall(b"POST /api/run HTTP/1.0\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
except OSError as err:
    print("send failed:", err)
    sys.exit()
answer = b""
while chunk := s.recv(65536):
    answer += chunk
print(answer.decode())
"""


def test_a_refusal_is_a_whole_answer_and_run_goes_its_own_way() -> None:
    """uid 5001 is at its cap (2 here) with requests being served: its next connection is answered 503 at once, and
    the agent reads out the request it is still sending (600 KB, beyond the socket's buffers) so that the client
    reads the answer, never EPIPE. `hostagent run` so refused books by itself (here: no daemon, the daemon's
    error), where it used to exit 69 with "stopped answering (Broken pipe)"."""
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), "--group", SOCKET_GROUP, "--max-per-user", "2")
    os.chmod(agent.dir, 0o755)  # the socket's group reaches its socket
    holder = subprocess.Popen(
        as_user(ATTACKER, sys.executable, "-c", TRICKLE, agent.socket, "2"), stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        time.sleep(0.5)  # both heads in, each with a worker waiting for its body (BODY_S: 10 s)
        big = subprocess.run(
            as_user(ATTACKER, sys.executable, "-c", BIG_POST, agent.socket), capture_output=True, text=True, timeout=30
        )
        head, _, body = big.stdout.partition("\n\n")  # text mode: universal newlines
        assert head.startswith("HTTP/1.0 503 Service Unavailable"), big.stdout[:300] + big.stderr
        assert json.loads(body) == {
            "error": f"the agent serves at most 2 from uid {ATTACKER} connections at once here",
            "hint": "close some, or try again in a moment; the agent's limits: hostagent serve --help",
            "exit": 69,
        }
        env = reach_env(simhost_env(DOCKER_HOST=NO_DOCKER, GPUPIN_AGENT_SOCKET=agent.socket))
        pads = [a for n in range(5) for a in ("-e", f"PAD{n}={'x' * 120_000}")]  # a request of 600 KB
        started = time.monotonic()
        r = subprocess.run(
            as_user(ATTACKER, HOSTAGENT, "run", "--rm", *pads, "--gpu", "0", "img", "true"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
        assert "the agent at" not in r.stderr and "Docker daemon" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and took < 10, (took, r.stderr)
    finally:
        holder.kill()
        holder.wait()
        agent.close()
    assert "internal error" not in agent.stderr, agent.stderr


# Each target's status and its body's lines, over HTTP, as any local account can ask.
GETS = """
import http.client, json, sys
for target in sys.argv[2:]:
    c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=10)
    try:
        c.request("GET", target)
        r = c.getresponse()
        print(json.dumps([target, r.status, r.read().decode(errors="replace").splitlines()]))
    except Exception as err:
        print(json.dumps([target, 0, [type(err).__name__]]))
    finally:
        c.close()
"""

MALFORMED_USAGE = [
    "/api/usage?since=inf",
    "/api/usage?since=1e20",
    "/api/usage?since=-1e12",
    "/api/usage?since=nan",
    "/api/usage?since=-inf",
    "/api/usage?since=garbage",
    "/api/usage?since=%00",
    "/api/usage?since=1e308&by=day",
    "/api/usage?by=nobody",
    "/api/usage?by=%ff%fe&since=0",
]
# Every other route with parameters it takes, garbled, and ones it does not take: answered as without them.
ODD_BUT_SERVED = [
    "/api/usage?since=&by=card",  # by=user is not served on HTTP by default (docs/serve.md)
    "/api/usage?since=0&by=day&since=inf",
    "/api/usage?since=4294967295&by=image",
    "/api/ls?since=inf&by=%ff",
    "/api/agent?%zz=%%",
    "/api/queue?daemon=%00%ff",
    "/api/queue?daemon=&daemon=x",
    "/api/samples?since=nan",
    "/metrics?name[]=x&%=",
]


def test_a_malformed_query_is_a_400_in_one_line_and_never_a_log_line() -> None:
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER))
    try:
        for _ in range(3):  # a flood of them: no line in the agent's log for any
            r = subprocess.run(
                as_other(setpriv(NOBODY), [sys.executable, "-c", GETS, str(agent.port), *MALFORMED_USAGE]),
                capture_output=True,
                text=True,
                timeout=60,
            )
            for line in r.stdout.splitlines():
                target, status, body = json.loads(line)
                assert status == 400 and len(body) == 1, (target, status, body)
                error = json.loads(body[0])
                assert error["exit"] == 64 and error["error"].startswith("GET /api/usage: "), (target, error)
            assert len(r.stdout.splitlines()) == len(MALFORMED_USAGE), r.stdout + r.stderr
        assert "since must be seconds since the epoch, 0 to 4294967295, not inf" in r.stdout
        assert "by must be one of user, card, image, day, not 'nobody'" in r.stdout
        r = subprocess.run(
            as_other(setpriv(NOBODY), [sys.executable, "-c", GETS, str(agent.port), *ODD_BUT_SERVED]),
            capture_output=True,
            text=True,
            timeout=60,
        )
        statuses = {t: s for t, s, _ in map(json.loads, r.stdout.splitlines())}
        assert statuses == dict.fromkeys(ODD_BUT_SERVED, 200), statuses  # a repeated parameter: its first
    finally:
        agent.close()
    assert "internal error" not in agent.stderr and "Traceback" not in agent.stderr, agent.stderr
    assert len(agent.stderr.splitlines()) < 6, agent.stderr  # its start and stop lines, no line per request


def test_an_http_caller_is_the_uid_of_its_socket_whatever_loopback_address_it_takes() -> None:
    """The key of the HTTP caps (docs/serve.md, "Limits"): the uid that owns the client's socket, from the kernel,
    from 127.0.0.2 as from 127.0.0.9; the address only for a caller from elsewhere (IPv6 by its /64); one shared key
    for a local caller the kernel does not name."""
    from gpupin.hostagent.serve.api import Remote, caller_key
    from gpupin.hostagent.serve.tcpuid import local_uid

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        seen = {}
        for address in ("127.0.0.2", "127.0.0.9"):
            client = subprocess.Popen(
                as_other(
                    setpriv(NOBODY),
                    [sys.executable, "-c", CONNECT_FROM, address, str(port)],
                ),
                stdout=subprocess.PIPE,
                stdin=subprocess.PIPE,
                text=True,
            )
            try:
                server.settimeout(30)
                sock, remote = server.accept()
                with sock:
                    seen[address] = caller_key(Remote.of(remote, local_uid(sock.getsockname(), remote)))
            finally:
                client.communicate("", timeout=30)
        assert seen == {"127.0.0.2": f"uid {NOBODY}", "127.0.0.9": f"uid {NOBODY}"}, seen
        # Its own socket, closed before it was asked about: the kernel names root for it, which it is not.
        with socket.create_connection(("127.0.0.1", port)) as mine:
            sock, remote = server.accept()
            with sock:
                assert local_uid(sock.getsockname(), remote) == 0
                mine.close()
                time.sleep(0.1)
                assert local_uid(sock.getsockname(), remote) is None
    assert caller_key(Remote.of(("127.0.0.5", 4000), None)) == "loopback"
    assert caller_key(Remote.of(("::ffff:127.0.0.5", 4000, 0, 0), None)) == "loopback"
    assert caller_key(Remote.of(("192.0.2.7", 4000), None)) == "192.0.2.7"
    assert caller_key(Remote.of(("::ffff:192.0.2.7", 4000, 0, 0), None)) == "192.0.2.7"
    assert caller_key(Remote.of(("2001:db8:1:2:aaaa::1", 4000, 0, 0), None)) == "2001:db8:1:2::/64"
    assert local_uid(("127.0.0.1", 1), ("127.0.0.3", 2)) is None  # no such connection


CONNECT_FROM = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], 0))
s.connect(("127.0.0.1", int(sys.argv[2])))
sys.stdin.read()
"""


class ClosesOnRequests:
    """An agent's socket that reads each request's head and closes without an answer (an agent that died, or one
    that closes under a request): `hostagent run` finds it (it accepts) and is closed on before any 102."""

    def __init__(self, path: Path) -> None:
        import threading

        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        self.heads: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    self.heads.append(conn.recv(65536).split(b"\r\n", 1)[0])

    def close(self) -> None:
        self.server.close()


def test_a_run_closed_on_before_the_agent_took_it_goes_its_own_way(tmp_path: Path) -> None:
    """Closed on before the agent's 102, the agent made nothing for the run: it goes its own way (here: no daemon,
    the daemon's error), where it exited 69, "the agent ... stopped answering"."""
    agent = ClosesOnRequests(tmp_path / "agent.sock")
    try:
        env = simhost_env(DOCKER_HOST=NO_DOCKER, GPUPIN_AGENT_SOCKET=str(tmp_path / "agent.sock"))
        r = subprocess.run(
            [HOSTAGENT, "run", "--rm", "--gpu", "0", "img", "true"], env=env, capture_output=True, text=True, timeout=60
        )
        assert any(h.startswith(b"POST /api/run ") for h in agent.heads), agent.heads  # it was asked
        assert "the agent at" not in r.stderr and "Docker daemon" in r.stderr and "Traceback" not in r.stderr, r.stderr
    finally:
        agent.close()
