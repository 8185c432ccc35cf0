"""The record's database: an SQLite file (WAL) that the agent alone writes, its schema, its migrations
(MIGRATIONS[v] takes version v to v+1; a newer file is refused) and its queries. The file is root's and private,
created so that no one can plant a link for root to write through. docs/serve.md, "The record", says what is kept
and what survives what.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import time
from typing import NamedTuple

from gpupin.core.errors import UsageError, printable
from gpupin.hostagent.record import BY

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpupin.core import JSONObject

DEFAULT_PATH = "/var/lib/gpupin/record.db"
PATH_ENV = "GPUPIN_RECORD"

# MIGRATIONS[v]: from version v to v+1. Version 0 is a file with no schema (new, or empty).
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE schema (version INTEGER NOT NULL);
    INSERT INTO schema (version) VALUES (0);
    CREATE TABLE intervals (
        id INTEGER PRIMARY KEY,
        container_id TEXT NOT NULL,
        container_name TEXT,
        image TEXT,
        card_uuid TEXT NOT NULL,
        card_index INTEGER,
        uid INTEGER,
        user TEXT NOT NULL,
        start REAL NOT NULL,
        end REAL,
        seen REAL NOT NULL,
        peak_memory_mib INTEGER,
        load_sum REAL NOT NULL DEFAULT 0,
        load_n INTEGER NOT NULL DEFAULT 0,
        ended TEXT
    );
    CREATE TABLE owners (container_id TEXT PRIMARY KEY, uid INTEGER NOT NULL, at REAL NOT NULL);
    """,
    # v2: energy, and the indexes `usage` and the quotas read through (an open interval has end NULL).
    """
    ALTER TABLE intervals ADD COLUMN energy_j REAL;
    CREATE INDEX intervals_end ON intervals (end);
    CREATE INDEX intervals_uid ON intervals (uid, end);
    CREATE INDEX intervals_user ON intervals (user, end, start, energy_j);
    """,
    # v3: the closed intervals summed per local calendar day and per user, card and image (`daily`, filled from
    # the intervals already there), so that `usage` over a year reads thousands of rows, not a million; the quotas'
    # index covers what they sum (a week of a user's intervals read from the index alone).
    """
    DROP INDEX intervals_user;
    DROP INDEX intervals_uid;
    CREATE INDEX intervals_uid ON intervals (uid, end, start);
    CREATE INDEX intervals_start ON intervals (start);
    CREATE TABLE daily (
        kind TEXT NOT NULL,
        day TEXT NOT NULL,
        key TEXT NOT NULL,
        idx INTEGER,
        seconds REAL NOT NULL DEFAULT 0,
        joules REAL,
        n INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (kind, day, key)
    ) WITHOUT ROWID;
    CREATE TABLE meta (name TEXT PRIMARY KEY, value REAL NOT NULL);
    """,
    # v4: the same daily sums per uid (`daily_own`, filled from the closed intervals that name one), so that the
    # agent answers a user's own usage (what its socket shows a user: serve.md, "Who can reach it") from as few rows
    # as the host's.
    """
    CREATE TABLE daily_own (
        uid INTEGER NOT NULL,
        kind TEXT NOT NULL,
        day TEXT NOT NULL,
        key TEXT NOT NULL,
        idx INTEGER,
        seconds REAL NOT NULL DEFAULT 0,
        joules REAL,
        n INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (uid, kind, day, key)
    ) WITHOUT ROWID;
    """,
)
# Run in the migration's transaction after MIGRATIONS[v], by version reached: what SQL alone cannot do.
AFTER: dict[int, Callable[[sqlite3.Connection], None]] = {}
VERSION = len(MIGRATIONS)
# The oldest schema `usage` reads everyone's rows from, read-only (root's `hostagent usage`): v4 added only what a
# user's own rows need, so a file the agent has not migrated yet is still read.
READABLE_FROM = 3


class IntervalRow(NamedTuple):
    """What an interval's row says of whom and what, written at open."""

    container_id: str
    container_name: str | None
    image: str | None
    card_uuid: str
    card_index: int | None
    uid: int | None
    user: str
    start: float
    seen: float


class Figures(NamedTuple):
    """An interval's figures, written at each checkpoint and at its close."""

    start: float
    seen: float
    peak_memory_mib: int | None = None
    load_sum: float = 0.0
    load_n: int = 0
    energy_j: float | None = None


class LeftOpen(NamedTuple):
    """An interval an earlier agent left open: its row id, row and figures."""

    rid: int
    row: IntervalRow
    figures: Figures


class Closed(NamedTuple):
    """A closed interval as the daily sums count it."""

    user: str
    card_uuid: str
    card_index: int | None
    image: str | None
    start: float
    end: float
    energy_j: float | None
    uid: int | None = None  # also summed in `daily_own` where it names one


class Share:
    """One line of `usage`: a user's (card's, image's, day's) GPU-seconds, energy and intervals."""

    __slots__ = ("energy_j", "gpu_hours", "gpu_seconds", "index", "intervals", "key")

    def __init__(self, key: str | None, index: int | None, seconds: float | None, joules: float | None, n: int):
        s = max(0.0, float(seconds or 0.0))
        self.key = key
        self.index = index
        self.gpu_seconds = round(s, 3)
        self.gpu_hours = round(s / 3600, 4)
        self.energy_j = None if joules is None else round(float(joules), 3)
        self.intervals = int(n)

    def to_json(self, by: str) -> JSONObject:
        """The row of /api/usage and `usage --json` (`index` for a card only)."""
        out: JSONObject = {by: self.key}
        if by == "card":
            out["index"] = self.index
        out.update(
            gpu_seconds=self.gpu_seconds, gpu_hours=self.gpu_hours, energy_j=self.energy_j, intervals=self.intervals
        )
        return out

    @classmethod
    def from_json(cls, by: str, row: JSONObject) -> Share:
        """A row of the agent's answer (its figures already rounded)."""
        share = cls(row.get(by), row.get("index"), 0.0, None, 0)
        share.gpu_seconds, share.gpu_hours = row["gpu_seconds"], row["gpu_hours"]
        share.energy_j, share.intervals = row.get("energy_j"), row["intervals"]
        return share


def default_path() -> str:
    """GPUPIN_RECORD (tests, a second agent), else DEFAULT_PATH."""
    return os.environ.get(PATH_ENV) or DEFAULT_PATH


WRITABLE_HINT = (
    "give --record a path in a folder the agent may write (under systemd: StateDirectory=gpupin, as "
    "contrib/systemd/gpupin-hostagent.service has it), or --record none"
)


class RecordRefused(UsageError):
    """A record file or folder the agent will not use (exit 64)."""


def _own_dir(path: str, create: bool) -> None:
    """`path` is a directory the agent alone may write: made 0700 when missing (`create`), else checked (not a
    link, owned by this user, written by no one else)."""
    if create:
        try:
            os.makedirs(path, mode=0o700)
        except FileExistsError:
            pass
        except OSError as err:  # a read-only file system (systemd's ProtectSystem=strict), a parent not ours
            raise RecordRefused(
                f"record folder {printable(path)} cannot be created: {err.strerror or err}", WRITABLE_HINT
            ) from None
    try:
        st = os.lstat(path)
    except OSError as err:
        raise RecordRefused(
            f"record folder {printable(path)}: {err.strerror or err}", "give --record a path in an existing folder"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise RecordRefused(
            f"record folder {printable(path)} is not a directory (a link is not followed)",
            "give --record a path in a folder of the agent's own",
        )
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RecordRefused(
            f"record folder {printable(path)} may be written by another user than the agent's",
            "give --record a path in a folder the agent's user owns and alone may write (e.g. /var/lib/gpupin)",
        )
    # Owned and 0700 yet not writable: a read-only mount (ProtectSystem=strict without StateDirectory=gpupin).
    # access() asks the kernel, so the mount's flag counts too; refused here, not as SQLite's error at first write.
    if create and not os.access(path, os.W_OK | os.X_OK):
        raise RecordRefused(f"record folder {printable(path)} cannot be written (a read-only mount?)", WRITABLE_HINT)


def _own_file(path: str) -> None:
    """Create the database file 0600 when missing; refuse a link or anything but a regular file of our own."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.close(fd)
        return
    except FileExistsError:
        pass
    except OSError as err:
        raise RecordRefused(f"record {printable(path)}: {err.strerror or err}", "give --record another path") from None
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise RecordRefused(
            f"record {printable(path)} is not a regular file of the agent's user (a link is not followed)",
            "remove it, or give --record another path",
        )


def connect(path: str, readonly: bool = False) -> sqlite3.Connection:
    """A connection to the record: read-only (`hostagent usage`) or the agent's own, in WAL mode."""
    from urllib.parse import quote

    uri = f"file:{quote(os.path.abspath(path))}?mode={'ro' if readonly else 'rw'}"
    conn = sqlite3.connect(uri, uri=True, timeout=5.0, check_same_thread=False, isolation_level=None)
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: a power cut may lose the last commits, never the file
    return conn


def version_of(conn: sqlite3.Connection) -> int:
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema'").fetchone():
        return 0
    row = conn.execute("SELECT version FROM schema").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: sqlite3.Connection, path: str = "the record") -> int:
    """Bring the schema to VERSION, in one transaction; the version it had."""
    was = version_of(conn)
    if was > VERSION:
        raise RecordRefused(
            f"record {printable(path)} has schema version {was}, newer than this hostagent's {VERSION}",
            "run the hostagent that wrote it, or give --record another path",
        )
    if was < VERSION:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for v, step in enumerate(MIGRATIONS[was:], was + 1):
                for statement in step.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                if v in AFTER:
                    AFTER[v](conn)
            conn.execute("UPDATE schema SET version = ?", (VERSION,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return was


class Store:
    """The agent's connection (one writer; its calls serialised by a lock: the writer's thread writes, the API's
    threads read)."""

    def __init__(self, path: str) -> None:
        self.path = path
        _own_dir(os.path.dirname(os.path.abspath(path)), create=True)
        _own_file(path)
        try:
            self.conn = connect(path)
            was = migrate(self.conn, path)
        except sqlite3.Error as err:
            raise RecordRefused(
                f"record {printable(path)} cannot be opened: {err}", "move the file aside, or give --record another"
            ) from None
        self.migrated_from = was
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # --- writes (the writer) ---

    def open_interval(self, row: IntervalRow) -> int:
        with self.lock:
            cur = self.conn.execute(
                f"INSERT INTO intervals ({', '.join(IntervalRow._fields)}) VALUES ({', '.join('?' * len(row))})", row
            )
            return int(cur.lastrowid or 0)

    def update(self, rows: list[tuple[int, Figures]]) -> None:
        """Several intervals' new figures at once (one transaction: the checkpoint)."""
        with self.lock:
            self.conn.execute("BEGIN")
            try:
                for rid, figures in rows:
                    self.conn.execute(f"UPDATE intervals SET {_SET_FIGURES} WHERE id = ?", [*figures, rid])
                self.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise

    def close_interval(self, rid: int, row: IntervalRow, figures: Figures, end: float, ended: str) -> None:
        """Close interval `rid` with its last figures, end and reason, and add it to the daily sums, at once."""
        closed = Closed(
            row.user, row.card_uuid, row.card_index, row.image, figures.start, end, figures.energy_j, row.uid
        )
        with self.lock:
            self.conn.execute("BEGIN")
            try:
                self.conn.execute(  # with its owner: one noted after the interval opened is written here too
                    f"UPDATE intervals SET {_SET_FIGURES}, uid = ?, user = ?, end = ?, ended = ? WHERE id = ?",
                    [*figures, row.uid, row.user, end, ended, rid],
                )
                roll(self.conn, closed)
                self.conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
                raise

    def owned(self, rid: int, uid: int, user: str) -> None:
        """Interval `rid`'s owner, learnt after it opened."""
        with self.lock:
            self.conn.execute("UPDATE intervals SET uid = ?, user = ? WHERE id = ?", (uid, user, rid))

    def note_owner(self, container_id: str, uid: int) -> None:
        with self.lock:
            self.conn.execute(
                "INSERT OR REPLACE INTO owners (container_id, uid, at) VALUES (?, ?, ?)",
                (container_id, uid, time.time()),
            )

    def owner(self, container_id: str) -> int | None:
        with self.lock:
            row = self.conn.execute("SELECT uid FROM owners WHERE container_id = ?", (container_id,)).fetchone()
        return None if row is None else int(row[0])

    def open_rows(self) -> list[LeftOpen]:
        """The intervals an earlier agent left open (to reconcile at start)."""
        cols = ", ".join((*IntervalRow._fields, *Figures._fields[2:]))
        with self.lock:
            rows = self.conn.execute(f"SELECT id, {cols} FROM intervals WHERE end IS NULL").fetchall()
        out = []
        for rid, *r in rows:
            row = IntervalRow(*r[:9])
            out.append(LeftOpen(rid, row, Figures(row.start, row.seen, *r[9:])))
        return out

    # --- reads ---

    def finished(self, uid: int, since: float) -> list[tuple[float, float]]:
        with self.lock:
            return finished(self.conn, uid, since)

    def usage(self, since: float | None, by: str, now: float | None = None, uid: int | None = None) -> list[Share]:
        with self.lock:
            return usage(self.conn, since, by, now, uid)


def finished(conn: sqlite3.Connection, uid: int, since: float) -> list[tuple[float, float]]:
    """(start, end) of `uid`'s closed intervals that ended after `since`, one per card: the GPU-hour quotas' past
    (gpupin.hostagent.policy.admit), read from the (uid, end, start) index alone."""
    rows = conn.execute(
        "SELECT start, end FROM intervals WHERE uid = ? AND end > ? ORDER BY end", (uid, since)
    ).fetchall()
    return [(float(a), float(b)) for a, b in rows]


_SET_FIGURES = ", ".join(f"{k} = ?" for k in Figures._fields)
_KEYS = {"user": "user", "card": "card_uuid", "image": "image"}


def _day(t: float) -> tuple[str, float]:
    """The local calendar day of `t` and the next midnight (seconds since the epoch)."""
    import datetime

    day = datetime.datetime.fromtimestamp(t).date()
    return day.isoformat(), datetime.datetime.combine(day + datetime.timedelta(days=1), datetime.time()).timestamp()


def _parts(a: float, b: float) -> list[tuple[str, float]]:
    """[a, b) cut at each local midnight: (day, seconds)."""
    out = []
    t = a
    while t < b:
        day, midnight = _day(t)
        out.append((day, min(b, midnight) - t))
        t = min(b, midnight)
    return out


def roll(conn: sqlite3.Connection, row: Closed, tables: tuple[str, ...] = ("daily", "daily_own")) -> None:
    """Add a closed interval to the daily sums: each day's part of its seconds and energy (in proportion), per
    user, card and image, for the host (`daily`) and for its uid (`daily_own`, where it names one); it counts once,
    on the day it began."""
    start, end, joules = float(row.start), float(row.end), row.energy_j
    whole = max(end - start, 1e-9)
    keys = (("user", row.user, None), ("card", row.card_uuid, row.card_index), ("image", row.image))
    into = [t for t in tables if t == "daily" or row.uid is not None]
    for i, (day, part) in enumerate(_parts(start, end) or [(_day(start)[0], 0.0)]):
        j = None if joules is None else joules * part / whole
        for kind, key, *idx in keys:
            values = (kind, day, key or "", idx[0] if idx else None, part, j, int(i == 0))
            for table in into:
                own = table == "daily_own"
                conn.execute(
                    f"INSERT INTO {table} ({'uid, ' if own else ''}kind, day, key, idx, seconds, joules, n) "
                    f"VALUES ({'?, ' if own else ''}?, ?, ?, ?, ?, ?, ?) "
                    f"ON CONFLICT ({'uid, ' if own else ''}kind, day, key) DO UPDATE SET "
                    "seconds = seconds + excluded.seconds, joules = CASE WHEN excluded.joules IS NULL THEN joules "
                    "ELSE COALESCE(joules, 0) + excluded.joules END, n = n + excluded.n, "
                    "idx = COALESCE(excluded.idx, idx)",
                    (row.uid, *values) if own else values,
                )
    if "daily" in into:
        conn.execute(
            "INSERT INTO meta (name, value) VALUES ('longest', ?) "
            "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
            (end - start,),
        )


_CLOSED = "SELECT user, card_uuid, card_index, image, start, end, energy_j, uid FROM intervals WHERE end IS NOT NULL"


def _backfill(conn: sqlite3.Connection) -> None:
    for r in conn.execute(_CLOSED).fetchall():
        roll(conn, Closed(*r), ("daily",))


def _backfill_own(conn: sqlite3.Connection) -> None:
    for r in conn.execute(_CLOSED + " AND uid IS NOT NULL").fetchall():
        roll(conn, Closed(*r), ("daily_own",))


AFTER[3] = _backfill
AFTER[4] = _backfill_own


def usage(
    conn: sqlite3.Connection, since: float | None, by: str, now: float | None = None, uid: int | None = None
) -> list[Share]:
    """GPU-seconds, energy (joules, in proportion to the part of an interval since `since`) and intervals per `by`
    (user, card, image or day: the host's local calendar day), largest first (days in order). An open interval
    counts up to now. `uid`: that user's intervals alone (what the agent shows a user of its socket).

    Whole days come from the daily sums; the first day's part after `since` from the intervals that overlap it
    (found by their start: none is longer than the longest closed yet), and the open intervals from theirs. An
    interval counts in `intervals` once, where it began, or on the first day when it began before `since`."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    now = time.time() if now is None else now
    # A user's own: the same sums from `daily_own` and from that uid's intervals (its index: (uid, end, start)).
    table, mine = ("daily", "") if uid is None else ("daily_own", " AND uid = :uid")
    kind = "card" if by == "day" else by
    sums: dict[str | None, list[Any]] = {}  # key -> [seconds, joules, n, index]

    def add(key: str | None, seconds: float, joules: float | None, n: int, idx: int | None = None) -> None:
        slot = sums.setdefault(key, [0.0, None, 0, None])
        slot[0] += seconds
        if joules is not None:
            slot[1] = (slot[1] or 0.0) + joules
        slot[2] += n
        if idx is not None:
            slot[3] = idx

    first_day, midnight = _day(since) if since is not None else ("", float("-inf"))
    group = "day" if by == "day" else "key"
    daily = conn.execute(
        f"SELECT {group}, MAX(idx), SUM(seconds), SUM(joules), SUM(n) FROM {table} WHERE kind = :kind "
        f"AND day > :first{mine} GROUP BY {group}",
        {"kind": kind, "first": first_day, "uid": uid},
    )
    for key, idx, seconds, joules, n in daily:
        add(key if by == "day" else key or None, seconds, joules, n, idx)
    col = _KEYS.get(by, "card_uuid")
    if since is not None:
        longest = conn.execute("SELECT value FROM meta WHERE name = 'longest'").fetchone()
        edge = conn.execute(
            f"SELECT {col}, card_index, MIN(end, :m) - MAX(start, :s), energy_j, end - start FROM intervals "
            f"WHERE end IS NOT NULL AND start >= :lo AND start < :m AND end > :s{mine}",
            {"s": since, "m": midnight, "lo": since - (longest[0] if longest else 0.0) - 1.0, "uid": uid},
        )
        for key, idx, part, joules, whole in edge:
            j = None if joules is None else joules * part / max(whole, 1e-9)
            add(first_day if by == "day" else key, part, j, 1, idx)
    lo = float("-inf") if since is None else since
    running = conn.execute(
        f"SELECT {col}, card_index, MAX(start, :lo), energy_j, start FROM intervals WHERE end IS NULL "
        f"AND start < :now{mine}",
        {"lo": lo, "now": now, "uid": uid},
    )
    for key, idx, a, joules, start in running:
        whole = max(now - start, 1e-9)
        if by == "day":
            for i, (day, part) in enumerate(_parts(a, now)):
                add(day, part, None if joules is None else joules * part / whole, int(i == 0))
        else:
            add(key, now - a, None if joules is None else joules * (now - a) / whole, 1, idx)
    out = [
        Share(key, idx if by == "card" else None, seconds, joules, n) for key, (seconds, joules, n, idx) in sums.items()
    ]
    return _ranked(out, by)


def _ranked(rows: list[Share], by: str) -> list[Share]:
    """Largest first; days in order."""
    if by == "day":
        return sorted(rows, key=lambda r: str(r.key))
    return sorted(rows, key=lambda r: (-r.gpu_seconds, str(r.key)))
