"""`hostagent serve`'s command line: its parser, its help, and the command it runs (gpupin.hostagent.serve.main)."""

from __future__ import annotations

import argparse
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DESCRIPTION = """Run the resident host agent in the foreground (for systemd: contrib/systemd/gpupin-hostagent.service).

It keeps NVML and the Docker Engine client open, follows the daemon's container events and re-reads NVML every
--interval, so that its view of the cards and their holders is current within a second, and serves it:
  /api/ls       exactly what `hostagent ls --json` prints, with idle holders filled in
  /api/events   the same object as server-sent events, at each change
  /api/usage    GPU-hours and energy from the record (`hostagent usage` prints it): on the socket a user's own,
                everyone's for root and the policy's [usage] readers; per user on HTTP only with --http-per-user
  /api/queue    the fair queue of `hostagent run --wait` (`hostagent queue` lists it; joining is a POST on the
                unix socket)
  /api/samples  the last hour of each card's load and memory (10 s a point)
  /metrics      Prometheus text: per card and per holder (docs/serve.md lists every name)
  /             a dashboard that updates in place
on a unix socket for the CLI (mode 0660, root and --group only) and on --http (loopback by default).
`hostagent ls --host unix://SOCKET` or `--host http://HOST:PORT` reads it."""

EPILOG = """A held card with no compute process and 0% utilization for --idle-after is flagged idle; a policy's
[idle] rule warns its holders and may stop them (docs/serve.md, "Idle holders"); without one nothing is stopped.
A restart of the Docker daemon and NVML errors are survived: what cannot be read is shown as unknown.
SIGHUP reads the --policy file again (`hostagent policy check` it first). SIGTERM or Ctrl-C stop it (exit 0).
exit: 0 stopped; 64 bad usage, or a --policy file with mistakes and no good policy saved (one line per mistake);
75 another agent listens on --socket."""

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smh]?)$")


def duration(text: str) -> float:
    """`90s`, `30m`, `2h` or a bare number of minutes, in seconds."""
    m = _DURATION.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r} (e.g. 90s, 30m, 2h; a bare number is minutes)")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, "": 60}[m[2]]


def _interval(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid seconds {text!r}") from None
    if not 0.1 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"seconds must be between 0.1 and 60, not {text}")
    return seconds


def _count(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 1 << 20:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1, not {text!r}")
    return int(text)


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`serve` among hostagent's commands."""
    from gpupin.hostagent.serve.connections import FILES_KEPT, PER_USER, STREAMS, STREAMS_PER_USER, TOTAL
    from gpupin.hostagent.serve.listen import DEFAULT_GROUP, DEFAULT_HTTP, DEFAULT_SOCKET

    s = sub.add_parser(
        "serve",
        help="run the resident agent: live view, metrics, dashboard",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument(
        "--socket",
        default=DEFAULT_SOCKET,
        metavar="PATH",
        help=f"the unix socket for the CLI (default {DEFAULT_SOCKET})",
    )
    s.add_argument(
        "--group",
        metavar="NAME",
        help=f"the socket's group: its members may use the agent (default "
        f"{DEFAULT_GROUP} where that group exists, else root only)",
    )
    s.add_argument(
        "--daemon-group",
        metavar="NAME",
        help="for a Docker daemon that is not a unix socket (tcp, tls, ssh): the group whose members the agent "
        "books for, beside root (default root only; a unix socket's own mode and group say who may use it)",
    )
    s.add_argument(
        "--http",
        default=DEFAULT_HTTP,
        metavar="ADDR",
        help=f"HOST:PORT for HTTP (metrics, dashboard, API), or none (default {DEFAULT_HTTP})",
    )
    s.add_argument(
        "--http-public",
        action="store_true",
        help="allow a non-loopback --http address: it shows the cards, holders, images and users to "
        "anyone who reaches it",
    )
    s.add_argument(
        "--http-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name the HTTP listener answers to, besides localhost and IP addresses (repeatable); a request "
        "naming another Host is refused (421): a web page must not reach the agent through a name of its own",
    )
    s.add_argument(
        "--http-per-user",
        action="store_true",
        help="serve the record's usage per user on HTTP too (/api/usage?by=user, the per-user series of /metrics): "
        "off, HTTP serves the host's totals alone, and each user of the socket sees their own",
    )
    s.add_argument(
        "--max-connections",
        type=_count,
        default=TOTAL,
        metavar="N",
        help=f"connections at once on each listener (the socket, HTTP), every caller together (default {TOTAL}; "
        f"the listeners' together at most the open-file limit less {FILES_KEPT}); beyond it the oldest one still "
        "silent is closed, or the new one is refused (503)",
    )
    s.add_argument(
        "--max-per-user",
        type=_count,
        default=PER_USER,
        metavar="N",
        help=f"connections at once on each listener from one caller: a uid (on HTTP from this host, the uid that "
        f"owns the client's socket), or an address from elsewhere (default {PER_USER})",
    )
    s.add_argument(
        "--max-streams",
        type=_count,
        default=STREAMS,
        metavar="N",
        help=f"long-lived answers at once on each listener (/api/events, places in the queue), counted apart from "
        f"the connections (default {STREAMS}; {STREAMS_PER_USER} from one caller); beyond it, 503",
    )
    s.add_argument(
        "--idle-after",
        type=duration,
        default=1800.0,
        metavar="DURATION",
        help="flag a held card idle after this long at 0%% utilization with no compute process (90s, 30m, 2h; "
        "default 30m; a policy's [idle] after takes its place)",
    )
    s.add_argument(
        "--policy",
        metavar="FILE",
        help="the host's policy: bookings, quotas, idle rules, hooks (default GPUPIN_POLICY, else "
        "/etc/gpupin/policy.toml; no file: nothing enforced). Read again on SIGHUP; a file with mistakes keeps "
        "the last good one (at start, the one saved; with none the agent does not start: docs/policy.md)",
    )
    s.add_argument(
        "--record",
        metavar="PATH",
        help="the record's database: who held which card, when, and its energy (default $GPUPIN_RECORD, else "
        "/var/lib/gpupin/record.db; its folder must be the agent's own; `none`: keep no record)",
    )
    s.add_argument(
        "--hook-user",
        metavar="NAME",
        help="run the policy's notify command as this user and its groups (default: as the agent, root)",
    )
    s.add_argument(
        "--interval",
        type=_interval,
        default=0.5,
        metavar="SECONDS",
        help="re-read NVML every SECONDS (default 0.5); the ledger is re-read at each Docker event",
    )


def command(args: argparse.Namespace) -> int:
    from gpupin.hostagent.policy import policy_path
    from gpupin.hostagent.serve import main
    from gpupin.hostagent.serve.connections import Limits

    return main.run(
        args.socket,
        args.group,
        args.http,
        args.http_public,
        args.idle_after,
        args.interval,
        args.http_host,
        Limits(args.max_connections, args.max_per_user, streams=args.max_streams),
        args.daemon_group,
        args.policy or policy_path(),
        args.record,
        args.hook_user,
        args.http_per_user,
    )
