#!/usr/bin/env python3
"""A test fixture in front of the sandboxed daemon: another address for the same dockerd (TCP, optionally TLS with
client certificates, or another unix socket), and, on request, the daemon failures a real daemon gives only on a
bad day (a 500 on one path, a connection dropped before the answer), or a success the daemon never gave (a 204 to
`POST /containers/ID/start`: the container stays created, its client goes on as if it had started).

    daemon_proxy.py --listen tcp://127.0.0.1:2375 --to /run/gpupin-sandbox/docker.sock
    daemon_proxy.py --listen unix:///tmp/x.sock --to ... --fail 'GET /containers/json=500' --drop 'POST .*/start$'
    daemon_proxy.py --listen tcp://127.0.0.1:2376 --to ... --tls CERT KEY CA     (client certificates required)

One request per connection: the proxy rewrites `Connection` to `close` (the daemon then closes after its answer,
and clients do not reuse the connection), except for upgrades (attach), which it relays untouched. Prints `ready`
on stdout once it listens; runs until killed. Used by the tests only (inside a network namespace they create for
TCP), never by gpupin itself.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import ssl
import sys
import threading

Rule = tuple[str, re.Pattern[str], int]  # method, path pattern, status (0: drop the connection)


def _rules(fails: list[str], drops: list[str]) -> list[Rule]:
    out: list[Rule] = []
    for spec in fails:
        what, _, status = spec.rpartition("=")
        method, _, path = what.partition(" ")
        out.append((method, re.compile(path), int(status)))
    for spec in drops:
        method, _, path = spec.partition(" ")
        out.append((method, re.compile(path), 0))
    return out


def _relay(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)  # pass the end on; the other direction ends on its own


def _serve(client: socket.socket, target: str, rules: list[Rule]) -> None:
    with client:
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 1 << 16:
                data = client.recv(1 << 16)
                if not data:
                    return
                head += data
        except OSError:
            return
        head, _, rest = head.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path = [*lines[0].split(), "", ""][:2]
        path = re.sub(r"^/v[0-9.]+", "", path)  # rules match the unversioned path with its query
        for m, pattern, status in rules:
            if m == method and pattern.search(path):
                if status:
                    body = b"" if status == 204 else b'{"message":"injected by the test proxy"}'
                    client.sendall(
                        b"HTTP/1.1 %d Injected\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                        b"Connection: close\r\n\r\n%s" % (status, len(body), body)
                    )
                return  # status 0: drop the connection without an answer
        upgrade = any(ln.lower().startswith("upgrade:") for ln in lines[1:])
        if not upgrade:
            lines = [ln for ln in lines if not ln.lower().startswith("connection:")] + ["Connection: close"]
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(target)
            upstream.sendall("\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + rest)
        except OSError:
            upstream.close()
            return
        with upstream:
            back = threading.Thread(target=_relay, args=(upstream, client), daemon=True)
            back.start()
            _relay(client, upstream)
            back.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="tcp://HOST:PORT or unix:///PATH")
    p.add_argument("--to", required=True, help="the daemon's unix socket")
    p.add_argument(
        "--fail",
        action="append",
        default=[],
        metavar="'METHOD PATH_REGEX=STATUS'",
        help="answer STATUS to matching requests (the path without /vX.Y, with its query; 204: without a body, "
        "a success the daemon never saw)",
    )
    p.add_argument(
        "--drop",
        action="append",
        default=[],
        metavar="'METHOD PATH_REGEX'",
        help="close matching requests' connections without an answer",
    )
    p.add_argument("--tls", nargs=3, metavar=("CERT", "KEY", "CA"), help="TLS, client certificates required")
    args = p.parse_args(argv)
    rules = _rules(args.fail, args.drop)
    if args.listen.startswith("unix://"):
        path = args.listen[len("unix://") :]
        if os.path.exists(path):
            os.unlink(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
    else:
        host, _, port = args.listen[len("tcp://") :].rpartition(":")
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, int(port)))
    server.listen(128)
    context = None
    if args.tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.tls[0], args.tls[1])
        context.load_verify_locations(args.tls[2])
        context.verify_mode = ssl.CERT_REQUIRED
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()

        def handle(c: socket.socket = conn) -> None:
            if context is not None:
                try:
                    c = context.wrap_socket(c, server_side=True)
                except (ssl.SSLError, OSError):
                    c.close()
                    return
            _serve(c, args.to, rules)

        threading.Thread(target=handle, daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
