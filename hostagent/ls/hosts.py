"""`hostagent ls --host URL ...`: the views of resident agents (`hostagent serve`), read from their /api/ls: one
table, with the host in each row when there are several. A remote agent is not trusted: its answer is read within
one deadline and a size, checked against the fields ls reads (SCHEMA), and shown through the one rule for a value
from elsewhere; a host that fails is one line (docs/ls.md).
"""

from __future__ import annotations

import json
import math
import socket
import sys
import time

from gpupin.core.errors import AgentUnavailableError, UsageError, printable, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core import JSONObject

TIMEOUT = 5.0  # seconds for the whole exchange with one agent
MAX_ANSWER = 8 << 20  # bytes: a listing of 8 cards with 500 holders each is under 2 MiB
SHOWN = 200  # characters of one remote text in the table (gpupin.core.errors.shown)
HINT = (
    "start the agent there (`hostagent serve`), or check the URL: http://HOST:PORT or unix:///run/gpupin/hostagent.sock"
)


def _split(url: str) -> tuple[str, str | None, str, int]:
    """(scheme, unix path, host, port) of an agent's address."""
    if url.startswith("unix://"):
        return "unix", url[len("unix://") :], "localhost", 0
    rest = url[len("http://") :] if url.startswith("http://") else url
    if "://" in rest:
        raise UsageError(f"--host {printable(url)}: the agent is reached by http:// or unix://", HINT)
    hostport = rest.split("/", 1)[0]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--host {printable(url)}: no port (the agent listens on HOST:PORT, 9417 by default)", HINT)
    return "http", None, host.strip("[]") or "127.0.0.1", int(port)


# --- the answer's schema: the fields ls reads, with their types ------------------------------------------------


class Opt:
    """A value of `spec`, or null."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec


NUM = (int, float)
_HEALTH = Opt({"healthy": Opt(bool), "reasons": [str], "?since": Opt(str)})
_HOLDER = {
    "id": str,
    "name": str,
    "state": str,
    "how": str,
    "?via": Opt(str),
    "shared": bool,
    "holds": bool,
    "why": Opt(str),
    "uuids": [str],
    "label": Opt([str]),
    "mismatch": bool,
    # whose it is (an agent of an earlier version does not say)
    "?owner": Opt({"uid": Opt(int), "name": Opt(str), "verified": bool, "claimed_uid": Opt(int)}),
    "?warned": Opt(str),  # let in by the authorization plugin under enforce mode warn
}
_PROCESS = {
    "pid": int,
    "type": str,
    "owner": str,
    "user": Opt(str),
    "command": Opt(str),
    "container_id": Opt(str),
    "container": Opt(str),
    "foreign": Opt(bool),
    "escape": Opt(bool),
    "?rootless": Opt({"uid": int, "user": str, "runtime": Opt(str), "whose": str}),
    "used_memory_mib": Opt(NUM),
    "mig_uuid": Opt(str),
}
_OCCUPANCY = {"held": Opt(bool), "?shared": Opt(bool), "?state": Opt(str), "?health": _HEALTH}
_MIG = {
    "uuid": Opt(str),
    "index": Opt(int),
    "name": Opt(str),
    "memory_total_mib": Opt(NUM),
    "memory_used_mib": Opt(NUM),
    **_OCCUPANCY,
}
_GPU = {
    "index": int,
    "error": Opt(str),
    "uuid": Opt(str),
    "bus_id": Opt(str),
    "name": Opt(str),
    "memory_total_mib": Opt(NUM),
    "memory_used_mib": Opt(NUM),
    "utilization_gpu": Opt(NUM),
    "temperature_c": Opt(NUM),
    "power_draw_w": Opt(NUM),
    "power_limit_w": Opt(NUM),
    "mig_mode": Opt(bool),
    "mig_devices": [_MIG],
    "unknown": Opt(str),
    "holders": [_HOLDER],
    "mislabelled": [_HOLDER],
    "processes": [_PROCESS],
    "?idle_seconds": Opt(NUM),
    "?idle": Opt(bool),
    **_OCCUPANCY,
}
SCHEMA = {
    "?hostname": Opt(str),
    "driver_version": Opt(str),
    "?cuda_driver_version": Opt(str),
    "docker": {"available": bool},
    "gpus": [_GPU],
}


def invalid(value: Any, spec: Any, where: str = "the answer") -> str | None:
    """Where `value` departs from `spec` (a type or tuple of types, Opt, [item spec], {key: spec}, `?key` for a key
    that may be absent), or None. Booleans are not numbers; numbers are finite."""
    if isinstance(spec, Opt):
        return None if value is None else invalid(value, spec.spec, where)
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{where} is not a list"
        return next((w for i, item in enumerate(value) if (w := invalid(item, spec[0], f"{where}[{i}]"))), None)
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where} is not an object"
        for key, sub in spec.items():
            name = key.removeprefix("?")
            if name not in value:
                if key.startswith("?"):
                    continue
                return f"{where} has no {name!r}"
            if (w := invalid(value[name], sub, f"{where}.{name}")) is not None:
                return w
        return None
    kinds = spec if isinstance(spec, tuple) else (spec,)
    if isinstance(value, bool) and bool not in kinds:
        return f"{where} is not {kinds[0].__name__}"
    if not isinstance(value, kinds) or (isinstance(value, float) and not math.isfinite(value)):
        return f"{where} is not {kinds[0].__name__}"
    return None


def _shown(value: Any) -> Any:
    """Every text of the answer as the one rule shows a value from elsewhere."""
    if isinstance(value, str):
        return shown(value, SHOWN)
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shown(v) for v in value]
    return value


# --- one exchange, bounded ---------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON has")


def _exchange(url: str, deadline: float) -> tuple[int, bytes]:
    """The status and body of GET /api/ls, read within `deadline` (time.monotonic) and MAX_ANSWER bytes."""
    _, path, host, port = _split(url)

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no whole answer within {TIMEOUT:g} s")
        return remaining

    if path is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(left())
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        authority = "localhost"
    else:
        sock = socket.create_connection((host, port), timeout=left())
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    with sock:
        request = (
            f"GET /api/ls HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: gpupin-hostagent\r\nConnection: close\r\n\r\n"
        )
        sock.settimeout(left())
        sock.sendall(request.encode("latin-1"))
        data = bytearray()
        while True:
            sock.settimeout(left())
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_ANSWER:
                raise ConnectionError(f"an answer larger than {MAX_ANSWER >> 20} MiB")
            if _complete(data):
                break
    return _parse(bytes(data))


def _head(data: bytes) -> tuple[int, dict[str, str], bytes] | None:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(None, 2)
    if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit() or len(status[1]) != 3:
        raise ConnectionError("not an HTTP answer")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    return int(status[1]), fields, body


def _complete(data: bytearray) -> bool:
    """Whether an answer with a Content-Length has all of its body (then the agent need not close first)."""
    found = _head(bytes(data[: data.find(b"\r\n\r\n") + 4])) if b"\r\n\r\n" in data else None
    if found is None:
        return False
    length = found[1].get("content-length", "")
    return length.isdigit() and len(data) - (data.find(b"\r\n\r\n") + 4) >= int(length)


def _parse(data: bytes) -> tuple[int, bytes]:
    found = _head(data)
    if found is None:
        raise ConnectionError("the connection was closed before a whole answer" if data else "no answer")
    status, fields, body = found
    if fields.get("transfer-encoding", "").lower() == "chunked":
        parts, rest = [], body
        while True:
            line, sep, rest = rest.partition(b"\r\n")
            size_text = line.split(b";", 1)[0].strip()
            if not sep or not size_text or len(size_text) > 8:
                raise ConnectionError("a malformed chunked answer")
            size = int(size_text, 16)
            if size == 0:
                break
            parts.append(rest[:size])
            rest = rest[size + 2 :]
        body = b"".join(parts)
    elif fields.get("content-length", "").isdigit():
        body = body[: int(fields["content-length"])]
    return status, body


def fetch(url: str) -> JSONObject:
    """The agent's /api/ls object, checked against SCHEMA; AgentUnavailableError (69) when it cannot be read or
    is not a listing. Its texts are as the agent sent them (--json prints them so; the table through `shown`)."""
    where = printable(url)
    try:
        status, body = _exchange(url, time.monotonic() + TIMEOUT)
    except TimeoutError:
        raise AgentUnavailableError(
            f"no agent answers at {where}: no whole answer within {TIMEOUT:g} s", HINT
        ) from None
    except (OSError, ValueError) as err:
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise AgentUnavailableError(f"no agent answers at {where}: {shown(why, SHOWN)}", HINT) from None
    try:
        data = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise AgentUnavailableError(f"{where} answered {status} with no agent's JSON", HINT) from None
    if status != 200 or not isinstance(data, dict) or "gpus" not in data:
        error = data.get("error") if isinstance(data, dict) else None
        raise AgentUnavailableError(
            f"the agent at {where} answered {status}: {shown(error, SHOWN) if error else 'no listing'}",
            "see the agent's log (journalctl -u gpupin-hostagent)",
        )
    wrong = invalid(data, SCHEMA)
    if wrong is not None:
        raise AgentUnavailableError(
            f"the agent at {where} answered a listing that ls cannot read: {wrong}",
            "run the same version of hostagent on both hosts",
        )
    return data


def command(urls: Sequence[str], as_json: bool, color: str) -> int:
    from gpupin.hostagent.ls import view

    for url in urls:
        _split(url)  # every address checked before any is read
    if len(urls) == 1:
        data = fetch(urls[0])
        out = json.dumps(data) + "\n" if as_json else view.render(_shown(data), view.use_color(color, sys.stdout))
        sys.stdout.write(out)
        return 0
    results: list[tuple[str, JSONObject | None, str | None]] = []
    for url in urls:
        try:
            results.append((url, fetch(url), None))
        except AgentUnavailableError as err:
            sys.stderr.write(f"hostagent: WARNING: {err.message}\n")
            results.append((url, None, err.message))
    if as_json:
        sys.stdout.write(json.dumps([d if d is not None else {"url": u, "error": e} for u, d, e in results]) + "\n")
    else:
        shown_results = [(printable(u), _shown(d) if d is not None else None, e) for u, d, e in results]
        sys.stdout.write(merged(shown_results, view.use_color(color, sys.stdout)))
    return 0 if any(d is not None for _, d, _ in results) else AgentUnavailableError.exit_code


def merged(results: Sequence[tuple[str, JSONObject | None, str | None]], color: bool = False) -> str:
    """One table of every host's cards: HOST, index, name, utilization, memory, state, idle, holders."""
    from gpupin.hostagent.ls.view import BOLD, CYAN, DIM, NA, RED, Cell, _duration, _lines, _state

    def na(value: object, suffix: str = "") -> str:
        return NA if value is None else f"{value}{suffix}"

    header = [
        Cell(t, DIM, right=t in ("UTIL", "MEMORY"))
        for t in ("HOST", "GPU", "NAME", "UTIL", "MEMORY", "STATE", "IDLE", "HELD BY")
    ]
    rows = [header]
    for url, data, error in results:
        if data is None:
            rows.append([Cell(url, BOLD), Cell("", parts=[(f"unreachable: {error}", f"{BOLD};{RED}")])])
            continue
        host = data.get("hostname") or url
        for g in data["gpus"]:
            if g["error"]:
                rows.append(
                    [
                        Cell(host, BOLD),
                        Cell(f"[{g['index']}]", CYAN),
                        Cell("", parts=[(f"ERROR: {g['error']}", f"{BOLD};{RED}")]),
                    ]
                )
                continue
            # How long a held card has sat at 0% (the agent's samples): IDLE past its --idle-after.
            idle = f"{'IDLE ' if g.get('idle') else ''}{_duration(g['idle_seconds'])}" if g.get("idle_seconds") else ""
            mem = f"{na(g['memory_used_mib'])} / {na(g['memory_total_mib'])} MiB"
            who = ", ".join(h["name"] for h in g["holders"] if h["holds"])
            rows.append(
                [
                    Cell(host, BOLD),
                    Cell(f"[{g['index']}]", CYAN),
                    Cell(g["name"] or NA),
                    Cell(na(g["utilization_gpu"], "%"), right=True),
                    Cell(mem, right=True),
                    _state(g),
                    Cell(idle, f"{BOLD};{RED}" if g.get("idle") else ""),
                    Cell(who),
                ]
            )
    return "\n".join(_lines(rows, color)) + "\n"
