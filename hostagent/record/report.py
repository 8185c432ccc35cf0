"""`hostagent usage`: GPU-hours and energy per user, card, image or day, from the record.

It reads the database itself, read-only, where this user may (root, or `--record PATH`); anyone else asks the
resident agent (GET /api/usage on its socket), which answers from the same queries
(gpupin.hostagent.record.store.usage), with that user's own intervals alone unless the policy names them a reader
(docs/serve.md, "Who can reach it")."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time

from gpupin.core.errors import AgentUnavailableError, UsageError, shown
from gpupin.hostagent.record import BY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.record.store import Share

DESCRIPTION = """Print how much each user (or card, image, day) used the host's cards, from the agent's record.

GPU-seconds are the time a container held a card (from its start to its end, as the daemon says: a container on 2
cards for an hour counts 2 GPU-hours); energy is what the card drew meanwhile (NVML's energy counter, shared
equally among a card's holders at each of the agent's samples; absent where the card has no counter). An
interval still open counts up to now; one that began before --since counts from --since."""

EPILOG = """The record: /var/lib/gpupin/record.db (serve --record; docs/serve.md, "The record"). Read directly where
this user may read it, else through the agent's socket (GPUPIN_AGENT_SOCKET, else /run/gpupin/hostagent.sock),
which shows a user their own intervals alone (root and the policy's [usage] readers: everyone's); stderr says
which record it read, and how.
exit: 0 printed; 64 bad usage; 69 neither the record nor an agent that keeps one can be read."""

_AGO = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


LATEST = 2**32 - 1  # the latest `since` taken (2106): a day's end past it is no calendar's


def checked_since(value: float) -> float:
    """`value` as a `since`: seconds since the epoch, 0 to LATEST (inf, nan, 1e20 or -1e12 is a ValueError that
    says so: the record's days could not be cut at it)."""
    if not 0 <= value <= LATEST:  # NaN compares false both ways
        raise ValueError(f"since must be seconds since the epoch, 0 to {LATEST}, not {value!r}")
    return value


def since(text: str, now: float | None = None) -> float:
    """`7d`, `24h`, `90m` (that long ago), a date `2026-11-01` (local midnight), a time `2026-11-01T08:00`, or
    seconds since the epoch."""
    import datetime

    now = time.time() if now is None else now
    value = text.strip()
    m = _AGO.match(value)
    try:
        if m:
            when = now - float(m[1]) * _UNITS[m[2]]
        else:
            try:
                when = float(value)
            except ValueError:
                when = datetime.datetime.fromisoformat(value).timestamp()
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r} (e.g. 7d, 24h, 2026-11-01, 2026-11-01T08:00, or seconds since the epoch)"
        ) from None
    try:
        return checked_since(when)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid time {text!r}: {err}") from None


def add(sub: argparse._SubParsersAction[Any]) -> None:
    """`usage` among hostagent's commands."""
    u = sub.add_parser(
        "usage",
        help="GPU-hours and energy per user, card, image or day, from the agent's record",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    u.add_argument("--since", type=since, metavar="WHEN", help="from WHEN: 7d, 24h, 2026-11-01... (default: all)")
    u.add_argument("--by", choices=BY, default="user", help="one line per user (default), card, image or day")
    out = u.add_mutually_exclusive_group()
    out.add_argument(
        "--json",
        action="store_true",
        help="{since, by, rows: [{KEY, gpu_seconds, gpu_hours, energy_j, intervals}], record} on stdout",
    )
    out.add_argument("--csv", action="store_true", help="the rows as CSV with a header line")
    u.add_argument("--record", metavar="PATH", help="read this database (default $GPUPIN_RECORD, else the agent's)")


class Usage:
    """What `usage` prints: the rows, what they cover, and the record they were read from."""

    __slots__ = ("by", "degraded", "only", "path", "rows", "since", "source")

    def __init__(
        self,
        since: float | None,
        by: str,
        rows: list[Share],
        path: str | None,
        degraded: str | None = None,
        only: JSONObject | None = None,
    ) -> None:
        self.since, self.by, self.rows, self.path, self.degraded = since, by, rows, path, degraded
        self.only = only  # {uid, user}: the agent showed this caller's own intervals alone (None: everyone's)
        self.source = ""  # how the record was reached, as `usage` says it (read directly, or the agent's)

    def to_json(self) -> JSONObject:
        """`usage --json`, as /api/usage answers."""
        return {
            "since": self.since,
            "by": self.by,
            "rows": [r.to_json(self.by) for r in self.rows],
            "only": self.only,
            "record": {"path": self.path, "degraded": self.degraded},
        }

    @classmethod
    def from_json(cls, answer: JSONObject) -> Usage:
        """The agent's answer to /api/usage."""
        from gpupin.hostagent.record.store import Share

        by = answer["by"]
        record = answer.get("record") or {}
        rows = [Share.from_json(by, r) for r in answer["rows"]]
        only = answer.get("only")
        return cls(answer.get("since"), by, rows, record.get("path"), record.get("degraded"), only or None)


def read(path: str | None, since_: float | None, by: str) -> Usage:
    """The usage: from the database when this user may read it, else from the agent."""
    import os
    import sqlite3

    from gpupin.hostagent.record import store

    where = path or store.default_path()
    if path is not None or os.access(where, os.R_OK):
        import stat

        try:
            mode = os.stat(where).st_mode
        except OSError as err:
            raise UsageError(f"record {shown(where)}: {err.strerror or err}", "check the path (--record)") from None
        if not stat.S_ISREG(mode):  # SQLite would wait on a FIFO's writer
            raise UsageError(f"record {shown(where)} is not a regular file", "give the path of a record database")
        try:
            conn = store.connect(where, readonly=True)
            try:
                version = store.version_of(conn)
                if not store.READABLE_FROM <= version <= store.VERSION:
                    raise UsageError(
                        f"record {shown(where)} has schema version {version}, not {store.VERSION}",
                        "let the agent open it first (it migrates it), or read it with the matching hostagent",
                    )
                rows = store.usage(conn, since_, by)
            finally:
                conn.close()
        except sqlite3.Error as err:
            raise UsageError(f"record {shown(where)} cannot be read: {err}", "check the path (--record)") from None
        direct = Usage(since_, by, rows, where)
        origin = "--record" if path is not None else store.PATH_ENV if os.environ.get(store.PATH_ENV) else "the default"
        direct.source = f"read directly ({origin})" + ("" if path is not None else "; --record PATH reads another")
        return direct
    from urllib.parse import urlencode

    from gpupin.hostagent import agentlink

    link = agentlink.find()
    if link is None:
        raise AgentUnavailableError(
            f"the record {shown(where)} cannot be read by this user, and no resident agent answers at "
            f"unix://{agentlink.socket_path()}",
            "run as root, start the agent (`hostagent serve`), or point GPUPIN_AGENT_SOCKET at its socket",
        )
    query = {"by": by, **({"since": repr(since_)} if since_ is not None else {})}
    answer: JSONObject = link.call("GET", "/api/usage?" + urlencode(query))
    kept = Usage.from_json(answer)
    kept.source = f"the agent's, at {link}"
    return kept


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def table(data: Usage) -> str:
    by = data.by
    rows = data.rows
    if not rows:
        return "no interval recorded" + (" since then" if data.since is not None else "") + "\n"
    head = (by.upper(), *(("INDEX",) if by == "card" else ()), "GPU-HOURS", "ENERGY-KWH", "INTERVALS")
    lines = [head] + [
        (
            shown(str(r.key) if r.key is not None else "-", 60),
            *((str(r.index) if r.index is not None else "-",) if by == "card" else ()),
            _hours(r.gpu_seconds),
            f"{r.energy_j / 3.6e6:.3f}" if r.energy_j is not None else "-",
            str(r.intervals),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = "".join("  ".join(c.ljust(n) for c, n in zip(line, widths, strict=True)).rstrip() + "\n" for line in lines)
    degraded = data.degraded
    if degraded:
        text += f"record degraded: {shown(degraded, 200)} (the agent keeps the latest intervals in memory)\n"
    return text


def csv_text(data: Usage) -> str:
    import csv
    import io

    by = data.by
    keys = [by, *(["index"] if by == "card" else []), "gpu_seconds", "gpu_hours", "energy_j", "intervals"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(keys)
    for r in (r.to_json(by) for r in data.rows):
        w.writerow(["" if r.get(k) is None else r[k] for k in keys])
    return buf.getvalue()


def command(args: argparse.Namespace) -> int:
    data = read(args.record, args.since, args.by)
    if not args.json:  # which record the rows are from (root reads the default file unless told another)
        from gpupin.hostagent import say

        say(f"usage: from the record {shown(data.path or 'unknown')}, {data.source}")
        if data.only is not None:  # the agent shows a user their own intervals (docs/serve.md, "Who can reach it")
            uid, name = str(data.only.get("uid")), str(data.only.get("user"))
            who = f"uid {uid}" + (f" ({shown(name, 40)})" if name != uid else "")  # a uid with no name: once
            say(f"usage: your own intervals alone, {who}: root and the policy's usage.readers see everyone's")
    out = json.dumps(data.to_json(), indent=2) + "\n" if args.json else csv_text(data) if args.csv else table(data)
    sys.stdout.write(out)
    return 0
