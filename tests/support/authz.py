"""Docker's authorization plugins on a sandboxed daemon (docs/authz.md): where the plugin's socket goes, turning
`authorization-plugins` on and off at run time (daemon.json, then SIGHUP), and a stand-in plugin that denies every
container create, for the tests of that plumbing before and beside gpupin's own (`hostagent authz`).

Each sandbox's daemons run in a mount namespace of their own in which /run/docker/plugins, the one folder where
dockerd looks for a plugin's socket, is the sandbox's `plugins` folder (tests/sandbox/sandbox.sh): a plugin for the
sandbox listens at `plugin_socket(sandbox)`, never in the host's folder.

Measured on Engines 20.10, 26 and 28.5 (docs/authz.md, The daemon's side):
- a SIGHUP reloads the plugin list, but `docker info`'s Plugins.Authorization keeps showing the list the daemon
  started with; the reload's own log line is what says it took (`reloaded`);
- a reload that lists a plugin the daemon cannot find ends the daemon (15 s after the SIGHUP: its reload
  validates the list and fails fatally), so `turn_on` checks the socket first.
"""

from __future__ import annotations

import base64
import http.server
import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from tests.support.wait import wait_for

PLUGIN = "gpupin"
CONTENT_TYPE = "application/vnd.docker.plugins.v1.2+json"
DENIED_MSG = "denied by test"
PROBE = "gpupin-authz-probe"  # hostagent.setup.PROBE
PROBE_MSG = "gpupin authz: on"


class Daemon(Protocol):
    """A sandboxed dockerd whose run folder holds its daemon.json, dockerd.pid, dockerd.log and plugins/ (seen as
    its /run/docker/plugins): a Sandbox, or a node of the test swarm."""

    @property
    def run_dir(self) -> Path: ...

    @property
    def engine(self) -> str: ...


def plugin_socket(sandbox: Daemon, name: str = PLUGIN) -> Path:
    """Where the sandbox's daemon finds plugin `name` (its /run/docker/plugins/NAME.sock)."""
    return sandbox.run_dir / "plugins" / f"{name}.sock"


def daemon_json(sandbox: Daemon) -> Path:
    return sandbox.run_dir / "daemon.json"


def dockerd_pid(sandbox: Daemon) -> int:
    return int((sandbox.run_dir / "dockerd.pid").read_text())


def activates(socket_path: Path, timeout: float = 2.0) -> bool:
    """Whether a plugin answers Plugin.Activate at `socket_path` and implements authz."""
    import http.client

    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(str(socket_path))

    conn = UnixConnection("plugin", timeout=timeout)
    try:
        conn.request("POST", "/Plugin.Activate", body=b"{}", headers={"Accept": CONTENT_TYPE})
        answer = json.loads(conn.getresponse().read() or b"{}")
    except (OSError, ValueError):
        return False
    finally:
        conn.close()
    return isinstance(answer, dict) and "authz" in (answer.get("Implements") or [])


def _reload_lines(sandbox: Daemon) -> int:
    return (sandbox.run_dir / "dockerd.log").read_text(errors="replace").count("Reloaded configuration")


def _reload(sandbox: Daemon, config: dict[str, object], timeout: float) -> None:
    """Write daemon.json, SIGHUP dockerd and wait for its log to say the reload took (docker info cannot say)."""
    path = daemon_json(sandbox)
    before = _reload_lines(sandbox)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config) + "\n")
    tmp.replace(path)
    os.kill(dockerd_pid(sandbox), signal.SIGHUP)
    wait_for(lambda: _reload_lines(sandbox) > before, timeout, f"Engine {sandbox.engine}'s dockerd to reload {path}")


def turn_on(sandbox: Daemon, name: str = PLUGIN, timeout: float = 30) -> None:
    """Add plugin `name` to the sandbox daemon's authorization-plugins and reload it. The plugin must be serving at
    plugin_socket(): a reload naming a plugin the daemon cannot find ends the daemon."""
    sock = plugin_socket(sandbox, name)
    assert activates(sock), f"no authz plugin answers at {sock}: turning it on would stop Engine {sandbox.engine}"
    config = json.loads(daemon_json(sandbox).read_text())
    plugins = list(config.get("authorization-plugins") or [])
    if name not in plugins:
        config["authorization-plugins"] = [*plugins, name]
    _reload(sandbox, config, timeout)


def turn_off(sandbox: Daemon, timeout: float = 30) -> None:
    """Remove every authorization plugin from the sandbox daemon and reload it (no plugin needs to answer)."""
    config = json.loads(daemon_json(sandbox).read_text())
    config.pop("authorization-plugins", None)
    _reload(sandbox, config, timeout)


@contextmanager
def plugin_on(sandbox: Daemon, name: str = PLUGIN) -> Iterator[Path]:
    """The sandbox's daemon with plugin `name` on (already serving at the yielded socket), off again after."""
    turn_on(sandbox, name)
    try:
        yield plugin_socket(sandbox, name)
    finally:
        turn_off(sandbox)


# The stand-in plugin: `python -m tests.support.authz SOCKET LOG` serves Docker's authz protocol at SOCKET, denies
# every container create with DENIED_MSG and gpupin's probe with PROBE_MSG, allows the rest, and appends
# "METHOD URI" of each request to LOG.


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path == "/Plugin.Activate":
            answer: dict[str, object] = {"Implements": ["authz"]}
        elif self.path == "/AuthZPlugin.AuthZReq":
            method, uri = body.get("RequestMethod", ""), body.get("RequestUri", "")
            with open(self.server.log, "a") as log:
                log.write(f"{method} {uri}\n")
            path = uri.split("?")[0]
            creates = method == "POST" and path.endswith("/containers/create")
            # gpupin's probe (hostagent setup authz, doctor): denied by contract, so the daemon is seen to ask it.
            probed = path.endswith(f"/containers/{PROBE}/json")
            answer = (
                {"Allow": False, "Msg": PROBE_MSG if probed else DENIED_MSG} if creates or probed else {"Allow": True}
            )
        elif self.path == "/AuthZPlugin.AuthZRes":
            answer = {"Allow": True}
        else:
            self.send_error(404)
            return
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, log: str) -> None:
        self.log = log
        super().__init__(path, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, _ = self.socket.accept()
        return conn, ("plugin", 0)  # http.server logs a (host, port) client address


def request_body(raw: str) -> object:
    """An AuthZReq's RequestBody (base64 of the JSON the client sent)."""
    return json.loads(base64.b64decode(raw)) if raw else None


@contextmanager
def stand_in_plugin(socket_path: Path, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The stand-in plugin in a process of its own (a test may kill it), serving at `socket_path`."""
    socket_path.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.authz", str(socket_path), str(log)])
    try:
        wait_for(lambda: activates(socket_path), 10, f"the stand-in plugin at {socket_path}")
        yield proc
    finally:
        proc.kill()
        proc.wait()
        socket_path.unlink(missing_ok=True)


def serve(socket_path: str, log: str) -> None:
    Path(socket_path).unlink(missing_ok=True)
    with _Server(socket_path, log) as server:
        server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
