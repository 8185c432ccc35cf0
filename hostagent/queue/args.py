"""`hostagent queue`'s command line, and what it prints: the waiters of the agent's fair queue, read from its
GET /api/queue over the unix socket (gpupin.hostagent.agentlink)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.parse

from gpupin.core.errors import AgentUnavailableError, shown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject

DESCRIPTION = """List the requests waiting in the resident agent's queue (`hostagent run --wait` with the agent up).

Per waiter: its place, the container's name, the user who asked (as the kernel names the caller, not as it says),
the request (--gpu or --count, --share, limits), the image, how long it has waited, and `turn` while it is trying.

The order (docs/run.md, "--wait with the agent"): first come, first served. A turn goes to the earliest waiter whose
cards are usable now, but no one takes a card an earlier waiter waits for. An earlier --count N waits for every card
it could use, so a --count 2 at the head holds every later request back until two cards are free (no starvation by
--count 1s); named requests for different cards never hold each other back. Ctrl-C in a waiting run leaves the
queue at once."""

EPILOG = """Without an agent, `run --wait` polls the ledger without a queue: then there is nothing to list.
exit: 0 listed; 64 bad usage; 69 no agent answers (GPUPIN_AGENT_SOCKET, else /run/gpupin/hostagent.sock), or it
serves another Docker daemon than DOCKER_HOST's."""

COLUMNS = ("#", "NAME", "USER", "REQUEST", "IMAGE", "WAITING", "TURN")


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`queue` among hostagent's commands."""
    q = sub.add_parser(
        "queue",
        help="list the requests waiting for cards in the agent's queue",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument(
        "--json",
        action="store_true",
        help="the agent's object on stdout: per waiter position, name, user, uid, pid, request, gpus, "
        "count, share, image, command, since (seconds since the epoch), turn",
    )


def _waited(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def _cell(value: str | None, limit: int = 60) -> str:
    """Another user's value, by the one rule (gpupin.core.errors.shown): on one line, at most about `limit`."""
    return shown(value or "-", limit)


def table(data: JSONObject, now: float) -> str:
    """The waiters as a table (or one line saying no one waits)."""
    waiters = data["waiters"]
    if not waiters:
        return "no request is waiting\n"
    rows = [COLUMNS] + [
        (
            str(w["position"]),
            _cell(w["name"]),
            _cell(w["user"]),
            _cell(w["request"]),
            _cell(w["image"], 40),
            f"{_waited(now - w['since'])} (since {time.strftime('%H:%M:%S', time.localtime(w['since']))})",
            "yes" if w["turn"] else "-",
        )
        for w in waiters
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "".join("  ".join(c.ljust(n) for c, n in zip(r, widths)).rstrip() + "\n" for r in rows)


def command(args: argparse.Namespace) -> int:
    from gpupin.hostagent import agentlink

    link = agentlink.find()
    if link is None:
        raise AgentUnavailableError(
            f"no resident agent answers at unix://{agentlink.socket_path()}, so there is no queue "
            "(`hostagent run --wait` then polls the ledger without one)",
            "start it (`hostagent serve`, or systemctl start gpupin-hostagent), or point GPUPIN_AGENT_SOCKET at its "
            "socket",
        )
    data = link.call("GET", "/api/queue?" + urllib.parse.urlencode({"daemon": agentlink.daemon_key()}))
    if "direct" in data:  # the agent queues for another daemon's cards (agentlink.other_daemon)
        from gpupin.hostagent import engine

        raise AgentUnavailableError(
            f"the agent at {link} does not queue for the Docker daemon this command uses ({engine.docker_host()}): "
            f"{shown(str(data['direct']))}",
            "point GPUPIN_AGENT_SOCKET at the socket of the agent that serves this daemon (`hostagent serve` with "
            "the same DOCKER_HOST), or DOCKER_HOST at the agent's daemon",
        )
    sys.stdout.write(json.dumps(data, indent=2) + "\n" if args.json else table(data, time.time()))
    return 0
