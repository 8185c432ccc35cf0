"""`hostagent ls --host URL ...`: the views of resident agents (`hostagent serve`), read from their /api/ls.

One host: its listing, as `hostagent ls` prints it (the table, or with --json the agent's object exactly). Several:
one table with a row per card and the host in each row (--json: the list of the hosts' objects, in the order
given; a host that cannot be read is `{"url": ..., "error": ...}` there, a warning on stderr, and a row saying so).
"""

from __future__ import annotations

import json
import sys

from gpupin.core.errors import AgentUnavailableError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

TIMEOUT = 5.0
HINT = (
    "start the agent there (`hostagent serve`), or check the URL: http://HOST:PORT or unix:///run/gpupin/hostagent.sock"
)


def _split(url: str) -> tuple[str, str | None, str, int]:
    """(scheme, unix path, host, port) of an agent's address."""
    if url.startswith("unix://"):
        return "unix", url[len("unix://") :], "localhost", 0
    rest = url[len("http://") :] if url.startswith("http://") else url
    if "://" in rest:
        raise UsageError(f"--host {url}: the agent is reached by http:// or unix://", HINT)
    hostport = rest.split("/", 1)[0]
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise UsageError(f"--host {url}: no port (the agent listens on HOST:PORT, 9417 by default)", HINT)
    return "http", None, host.strip("[]") or "127.0.0.1", int(port)


def fetch(url: str) -> dict[str, Any]:
    """The agent's /api/ls object; AgentUnavailableError (69) when it cannot be read."""
    import http.client

    _, path, host, port = _split(url)
    conn: http.client.HTTPConnection
    if path is not None:
        from gpupin.hostagent.agentlink import UnixHTTPConnection

        conn = UnixHTTPConnection(path, TIMEOUT)
        try:
            conn.connect()
        except OSError as err:
            raise AgentUnavailableError(f"no agent answers at {url}: {err.strerror or err}", HINT) from None
    else:
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
    try:
        conn.request("GET", "/api/ls")
        res = conn.getresponse()
        body = res.read()
    except OSError as err:
        raise AgentUnavailableError(
            f"no agent answers at {url}: {getattr(err, 'strerror', None) or err}", HINT
        ) from None
    finally:
        conn.close()
    try:
        data = json.loads(body)
    except ValueError:
        raise AgentUnavailableError(f"{url} answered {res.status} with no agent's JSON", HINT) from None
    if res.status != 200 or not isinstance(data, dict) or "gpus" not in data:
        error = data.get("error") if isinstance(data, dict) else None
        raise AgentUnavailableError(
            f"the agent at {url} answered {res.status}: {error or 'no listing'}",
            "see the agent's log (journalctl -u gpupin-hostagent)",
        )
    return data


def command(urls: Sequence[str], as_json: bool, color: str) -> int:
    from gpupin.hostagent.ls import view

    for url in urls:
        _split(url)  # every address checked before any is read
    if len(urls) == 1:
        data = fetch(urls[0])
        sys.stdout.write(json.dumps(data) + "\n" if as_json else view.render(data, view.use_color(color, sys.stdout)))
        return 0
    results: list[tuple[str, dict[str, Any] | None, str | None]] = []
    for url in urls:
        try:
            results.append((url, fetch(url), None))
        except AgentUnavailableError as err:
            sys.stderr.write(f"hostagent: WARNING: {err.message}\n")
            results.append((url, None, err.message))
    if as_json:
        sys.stdout.write(json.dumps([d if d is not None else {"url": u, "error": e} for u, d, e in results]) + "\n")
    else:
        sys.stdout.write(merged(results, view.use_color(color, sys.stdout)))
    return 0 if any(d is not None for _, d, _ in results) else AgentUnavailableError.exit_code


def merged(results: Sequence[tuple[str, dict[str, Any] | None, str | None]], color: bool = False) -> str:
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
