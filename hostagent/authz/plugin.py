"""`hostagent authz`: Docker's authorization plugin `gpupin`, on /run/docker/plugins/gpupin.sock, where the daemon
finds it by name (`authorization-plugins` in daemon.json). The daemon asks it about every API request and refuses
every request while it does not answer, so it is small, threaded, and decides alone whatever reaches no card (no
agent, no ledger, no NVML read per request): those are allowed in microseconds. What reaches cards goes to the
agent (POST /api/authz), and is refused while the agent does not answer. Protocol: moby's pkg/authorization.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver
import stat
import sys
import threading

from gpupin.core.errors import GpupinError, UsageError, shown
from gpupin.hostagent.authz import CONTENT_TYPE, NAME, judge, request
from gpupin.hostagent.authz.grant import LABEL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.ledger.holding_forms import HostCards
    from gpupin.hostagent.policy import EnforceRule

AGENT_S = 3.0  # the agent's answer; the daemon's own call to the plugin gives up later (and then refuses)
MAX_MESSAGE = 4 << 20  # the daemon forwards bodies under 1 MiB, base64 (4/3), with the headers beside


def _say(line: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"hostagent authz: {line}\n")
        sys.stderr.flush()


class Plugin:
    """The plugin's state: this host's cards (read once: which cards exist does not change while the daemon runs
    them), the policy's `[enforce]` table (read again when its file changes), and where the agent listens."""

    def __init__(self, agent_socket: str, policy_file: str, host: HostCards) -> None:
        self.agent_socket = agent_socket
        self.policy_file = policy_file
        self.host = host
        self._rule: tuple[tuple[int, int] | None, EnforceRule] | None = None
        self._mutex = threading.Lock()

    def rule(self) -> EnforceRule:
        """The `[enforce]` table of the policy file as it is now. No file: mode off. A file that cannot be read or
        has mistakes: the last good table; none yet: mode on, with what reaches cards left to the agent (which
        keeps its own last good policy), so a broken file never opens the door."""
        from gpupin.hostagent.policy import EnforceRule, load_policy

        try:
            st = os.stat(self.policy_file)
            key: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            key = None
        except OSError:
            key = (-1, -1)
        kept = self._rule
        if kept is not None and kept[0] == key:
            return kept[1]
        with self._mutex:
            if key is None:
                rule = EnforceRule()
            else:
                try:
                    rule = load_policy(self.policy_file).enforce
                except GpupinError as err:
                    rule = kept[1] if kept is not None else EnforceRule(mode="on")
                    _say(f"the policy is not read ({err.message}): keeping enforce mode {rule.mode}")
            self._rule = (key, rule)
            return rule

    def authz_request(self, msg: JSONObject) -> JSONObject:
        asked = request.read(msg)
        rule = self.rule()
        verdict, _, _ = judge.first_look(asked, self.host, rule)
        if verdict is None:
            verdict = self.ask_agent(msg, rule)
        if verdict.msg:
            _say(f"{'allowed' if verdict.allow else 'denied'} {asked.method} {asked.path}: {verdict.msg}")
        return verdict.to_json()

    def ask_agent(self, msg: JSONObject, rule: EnforceRule) -> judge.Verdict:
        try:
            data = self._agent({"request": _sent(msg)})
            if not isinstance(data.get("Allow"), bool):
                raise OSError(f"it answered {shown(str(data)[:200])}")
            return judge.Verdict(data["Allow"], str(data.get("Msg") or ""))
        except (OSError, ValueError) as err:
            line = (
                f"gpupin: the agent does not answer on {self.agent_socket} ({type(err).__name__}: {err}): "
                "containers that take cards are refused until it is back (systemctl start gpupin-hostagent); "
                "other containers are not affected"
            )
            return judge.Verdict(True, judge.WARN + line) if rule.mode == "warn" else judge.Verdict(False, line)

    def authz_response(self, msg: JSONObject) -> None:
        """The daemon's answer to a create: where the agent judged it (a grant: whose the container is) or mode
        warn let it in, the agent is told the container's id. Never refuses: the create is made already."""
        if msg.get("ResponseStatusCode") != 201:
            return
        asked = request.read(msg)
        rule = self.rule()
        if asked.kind != request.CREATE or rule.mode == "off":
            return
        verdict, _, c = judge.first_look(asked, self.host, rule)
        if verdict is not None and not verdict.msg.startswith(judge.WARN):
            return  # decided here, and nothing to note (a container that takes no card)
        labels = ((c or {}).get("Config") or {}).get("Labels") or {}
        if verdict is None and rule.mode != "warn" and LABEL not in labels:
            return  # the agent let it in without a grant (grants = false): nothing to note either
        told: JSONObject = {
            "request": _sent(msg),
            "response": {k: msg.get(k) for k in ("ResponseStatusCode", "ResponseBody")},
        }
        if verdict is not None:
            told["warned"] = verdict.msg.removeprefix(judge.WARN)
        try:
            self._agent(told)
        except (OSError, ValueError) as err:  # its owner stays unproven, as a create the agent did not see
            _say(f"the agent was not told of {asked.name or 'a container'}'s create: {type(err).__name__}: {err}")

    def _agent(self, payload: JSONObject) -> JSONObject:
        """POST /api/authz to the agent: its answer (OSError, ValueError: none)."""
        from gpupin.hostagent import http1

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(AGENT_S)
            sock.connect(self.agent_socket)
            answer = http1.exchange(sock, "POST", "/api/authz", payload, host="localhost")
            data = answer.json()
        finally:
            sock.close()
        if answer.status != 200 or not isinstance(data, dict):
            raise OSError(f"it answered {answer.status}: {shown(str(data)[:200])}")
        return data


def _sent(msg: JSONObject) -> JSONObject:
    """What the agent is sent of the daemon's message: the request, as the daemon sent it."""
    return {k: msg.get(k) for k in ("RequestMethod", "RequestUri", "RequestBody", "User")}


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found"}
IDLE_S = 300.0  # a connection of the daemon's plugin client that says nothing this long is closed
MAX_HEADERS = 64


def _response(status: int, obj: Any) -> bytes:
    body = json.dumps(obj).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


_ALLOWED = _response(200, {"Allow": True})  # every AuthZRes; an AuthZReq the plugin lets through silently
_ACTIVATED = _response(200, {"Implements": ["authz"]})
_CREATE = b"/containers/create"  # in the message's RequestUri: the only answer the plugin reads


class _Handler(socketserver.StreamRequestHandler):
    """One connection of the daemon's plugin client, kept open between calls: HTTP/1.1 read by hand, for the few
    headers that matter (http.server's header parsing was most of a call's cost, and the daemon calls the plugin
    twice for every request it serves)."""

    plugin: Plugin
    timeout = IDLE_S

    def handle(self) -> None:
        try:
            while self._one():
                pass
        except (OSError, ValueError):
            pass  # the daemon closed the connection, or sent what is not HTTP: it dials again

    def _one(self) -> bool:
        """Answer one call; False when the connection is to close."""
        line = self.rfile.readline(8192)
        parts = line.split()
        if len(parts) != 3:
            return False
        path = parts[1].decode("latin-1")
        length, keep = 0, parts[2] == b"HTTP/1.1"
        for _ in range(MAX_HEADERS):
            header = self.rfile.readline(8192)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                keep = value.strip().lower() != b"close"
            elif name == b"transfer-encoding":
                self.wfile.write(_response(400, {"Err": "gpupin: a chunked message is not read"}))
                return False
        else:
            return False
        if not 0 <= length <= MAX_MESSAGE:
            self.wfile.write(_response(400, {"Err": f"gpupin: a message of {length} bytes"}))
            return False
        raw = self.rfile.read(length)
        self.wfile.write(self._answer(path, raw))
        return keep

    def _answer(self, path: str, raw: bytes) -> bytes:
        if path == "/AuthZPlugin.AuthZRes":  # every answer is let through; only a create's is read
            if _CREATE in raw:
                with contextlib.suppress(Exception):  # a bug must not hold the daemon's answer back
                    msg = json.loads(raw)
                    if isinstance(msg, dict):
                        self.plugin.authz_response(msg)
            return _ALLOWED
        if path == "/Plugin.Activate":
            return _ACTIVATED
        if path != "/AuthZPlugin.AuthZReq":
            return _response(404, {"Err": f"no such call {path}"})
        try:
            msg = json.loads(raw or b"{}")
            if not isinstance(msg, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            return _response(400, {"Err": f"gpupin: the daemon's message cannot be read: {err}"})
        try:
            verdict = self.plugin.authz_request(msg)
        except Exception as err:  # a bug: the request is refused with a line, the plugin keeps serving
            verdict = {"Allow": False, "Msg": f"gpupin: the plugin failed: {type(err).__name__}: {err}"}
        return _ALLOWED if verdict == {"Allow": True, "Msg": ""} else _response(200, verdict)


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _host_cards() -> HostCards:
    from gpupin.core import nvml
    from gpupin.hostagent.ledger.holding_forms import HostCards

    try:
        cards = nvml.list_cards(mig=True, tolerate_lost=True)
    except GpupinError as err:
        # Device files and CDI names are still read (as minors, as names), and judged by the agent.
        _say(f"NVML cannot be read ({err.message}): cards are known by their device numbers only")
        cards = []
    return HostCards(cards, local=True)


def _take_socket(path: str) -> None:
    """Make way for the socket at `path`: a stale one (nobody answers) is removed; a live one is another plugin's."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UsageError(f"{shown(path)} exists and is not a socket", "give --socket another path, or remove it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        os.unlink(path)  # stale: its server is gone
        return
    finally:
        probe.close()
    raise UsageError(f"a plugin already answers on {shown(path)}", "stop it first, or give --socket another path")


def serve(socket_path: str, agent_socket: str, policy_file: str, ready: threading.Event | None = None) -> int:
    """Serve until SIGTERM or SIGINT (0)."""
    import signal

    _take_socket(socket_path)  # a bad path is refused before the cards are read (and NVML warns of anything)
    plugin = Plugin(agent_socket, policy_file, _host_cards())
    old = os.umask(0o177)  # the socket is root's alone: only the daemon speaks to it
    try:
        server = _Server(socket_path, type("PluginHandler", (_Handler,), {"plugin": plugin}))
    finally:
        os.umask(old)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():  # the command's; a test serves from a thread
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, lambda _n, _f: stop.set())
    thread = threading.Thread(target=server.serve_forever, name="authz", daemon=True)
    thread.start()
    rule = plugin.rule()
    _say(
        f"serving Docker's authorization plugin {NAME} on {socket_path} ({len(plugin.host.cards)} cards, enforce mode "
        f"{rule.mode}, agent at {agent_socket})"
    )
    if ready is not None:
        ready.set()
    try:
        while not stop.wait(3600):
            pass
    finally:
        server.shutdown()
        server.server_close()
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
    return 0
