"""`hostagent ls --host` against agents that misbehave (issue 24, "Files and hosts"): small HTTP servers on
127.0.0.1 that send a huge body, a byte a second, a listing of the wrong shape, or terminal escapes. Each is one
line for that host, within the deadline, and the other hosts' tables still print."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.host import hostagent

ESC = "\x1b]0;owned\x07\x1b[2J"
Serve = Callable[[socket.socket], None]


@pytest.fixture
def server() -> Iterator[Callable[[Serve], str]]:
    """Start a server on 127.0.0.1 that answers each connection with `serve`; returns its HOST:PORT."""
    socks: list[socket.socket] = []

    def start(serve: Serve) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        socks.append(listener)

        def loop() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=answer, args=(conn,), daemon=True).start()

        def answer(conn: socket.socket) -> None:
            with conn:
                try:
                    conn.recv(65536)
                    serve(conn)
                except OSError:
                    pass

        threading.Thread(target=loop, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for s in socks:
        s.close()


def replying(body: bytes, status: str = "200 OK") -> Serve:
    def serve(conn: socket.socket) -> None:
        conn.sendall(
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    return serve


@pytest.fixture(scope="module")
def listing(fakegpu: Path) -> dict[str, object]:
    """A real listing of the simulated host, as an agent sends it."""
    r = hostagent("ls", "--json", DOCKER_HOST="unix:///nonexistent/docker.sock")
    data: dict[str, object] = json.loads(r.stdout)
    return data


def ls(*hosts: str, timeout: float = 30) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    args = [a for h in hosts for a in ("--host", h)]
    r = hostagent("ls", *args, "--color", "never", timeout=timeout)
    return time.monotonic() - started, r


def clean(r: subprocess.CompletedProcess[str]) -> None:
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "\x1b" not in out and "\x07" not in out, out


def test_a_huge_answer_is_refused_without_reading_it_all(server: Callable[[Serve], str]) -> None:
    def endless(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
        block = b"1," * (1 << 16)
        while True:
            conn.sendall(block)

    took, r = ls(server(endless))
    assert r.returncode == 69 and "larger than 8 MiB" in r.stderr, r
    assert took < 10
    clean(r)


def test_a_byte_a_second_does_not_hold_ls_past_its_deadline(server: Callable[[Serve], str]) -> None:
    def slow(conn: socket.socket) -> None:
        for b in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000:
            conn.sendall(bytes([b]))
            time.sleep(1)

    took, r = ls(server(slow), timeout=20)
    assert r.returncode == 69 and "within 5 s" in r.stderr, r
    assert took < 10, took
    clean(r)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"gpus": 5}', "the answer has no 'driver_version'"),
        (
            b'{"gpus": [1], "driver_version": null, "docker": {"available": true}}',
            "the answer.gpus[0] is not an object",
        ),
        (b'{"gpus": 5, "driver_version": null, "docker": {"available": true}}', "the answer.gpus is not a list"),
        (b'{"gpus": [], "driver_version": 1e999, "docker": {"available": true}}', "driver_version is not str"),
        (b"[" * 100000, "no agent's JSON"),
    ],
)
def test_a_listing_of_the_wrong_shape_is_one_line_and_the_good_hosts_print(
    server: Callable[[Serve], str], listing: dict[str, object], body: bytes, says: str
) -> None:
    bad = server(replying(body))
    good = server(replying(json.dumps(listing).encode()))
    _, alone = ls(bad)
    assert alone.returncode == 69 and says in alone.stderr, alone
    assert alone.stderr.count("ERROR:") == 1
    clean(alone)
    _, both = ls(good, bad)
    assert both.returncode == 0, both
    rows = both.stdout.splitlines()
    assert rows[0].split()[:3] == ["HOST", "GPU", "NAME"]
    assert [r.split()[1] for r in rows[1:5]] == ["[0]", "[1]", "[2]", "[3]"], rows
    assert rows[5].startswith(bad) and "unreachable" in rows[5] and says in rows[5], rows
    assert both.stderr.count("WARNING:") == 1
    clean(both)


def test_remote_text_never_reaches_the_terminal_raw(server: Callable[[Serve], str], listing: dict[str, object]) -> None:
    evil = json.loads(json.dumps(listing))
    evil["hostname"] = "host" + ESC + "\nSPOOFED LINE"
    evil["gpus"][0]["name"] = "card" + ESC
    evil["gpus"][1]["unknown"] = "why" + ESC
    evil["gpus"][2]["error"] = "lost" + ESC + "\nSPOOFED"
    good = server(replying(json.dumps(evil).encode()))
    refusing = server(replying(json.dumps({"error": "no" + ESC + "\nSPOOFED"}).encode(), "500 Internal Server Error"))
    for hosts in ([good], [good, refusing], [refusing]):
        _, r = ls(*hosts)
        clean(r)
        assert not any(line.startswith("SPOOFED") for line in (r.stdout + r.stderr).splitlines()), r
    _, r = ls(good)
    assert r.returncode == 0 and "\\x1b]0;owned" in r.stdout, r


def test_a_remote_rootless_owner_is_checked_and_never_obeyed(
    server: Callable[[Serve], str], listing: dict[str, object]
) -> None:
    """A host's words for another user's rootless container (`whose`) are shown, escaped; an owner without them
    falls back to the container id; a malformed one is that host's one line."""
    process = {
        "pid": 7, "type": "C", "owner": "rootless", "user": "5026", "command": "sleep", "container_id": None,
        "container": None, "foreign": True, "escape": False, "used_memory_mib": 1, "mig_uuid": None,
        "rootless": {"uid": 5026, "user": "5026", "runtime": None, "whose": "uid 5026" + ESC + "\nSPOOFED"},
    }  # fmt: skip
    evil = json.loads(json.dumps(listing))
    evil["gpus"][1]["processes"] = [process]
    _, r = ls(server(replying(json.dumps(evil).encode())))
    assert r.returncode == 0 and "uid 5026\\x1b]0;owned" in r.stdout, r
    clean(r)
    assert not any(line.startswith("SPOOFED") for line in r.stdout.splitlines()), r
    evil["gpus"][1]["processes"] = [{k: v for k, v in process.items() if k != "rootless"}]
    _, r = ls(server(replying(json.dumps(evil).encode())))
    assert r.returncode == 0 and re.search(r"^\s+process\s+7\s", r.stdout, re.M), r
    evil["gpus"][1]["processes"] = [{**process, "rootless": {"uid": "root", "user": "x", "runtime": None, "whose": ""}}]
    _, r = ls(server(replying(json.dumps(evil).encode())))
    assert r.returncode == 69 and "rootless.uid is not int" in r.stderr, r
