"""`make bench`'s `record` part: what the record costs (gpupin.hostagent.record), on one simulated year of a busy
8-card host (1 million intervals: a job every 4.2 minutes on each card, 20 users, 30 images).

- a booking's cost: what `POST /api/run` does for the record (`RecordWriter.note_owner`: the caller's uid, kept in
  memory for the writer's thread), per call; a GPU-hour quota's read (`Store.finished` over a week, in the
  booking's path where the policy sets such a quota); and the writer's own writes per booking, off the booking's
  path (its interval opened, then closed), on that year's database;
- `hostagent usage --by user` over the year: the query alone, and the whole command (its Python start-up
  included), medians; and one user's own rows over the year, by user and by day (what the agent's socket answers a
  user who is not a reader).

No floor: figures against their targets (1 ms; 200 ms)."""

from __future__ import annotations

import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INTERVALS = 1_000_000
CARDS = 8
YEAR = 365 * 86400


def build_year(path: str, n: int = INTERVALS) -> None:
    """The record of a busy year: n intervals spread evenly over 8 cards, back to back with short gaps."""
    from gpupin.hostagent.record.store import Store, _parts

    store = Store(path)
    rng = random.Random(25)
    start0 = time.time() - YEAR
    per_card = n // CARDS
    step = YEAR / per_card
    users = [(1000 + i, f"user{i:02d}") for i in range(20)]
    rows = []
    for card in range(CARDS):
        for k in range(per_card):
            uid, user = rng.choice(users)
            start = start0 + k * step
            end = start + step * rng.uniform(0.5, 0.95)
            rows.append(
                (
                    f"{rng.getrandbits(64):016x}" * 4,
                    f"job-{k}",
                    f"lab/image{rng.randrange(30)}:latest",
                    f"GPU-{card:08d}-0000-0000-0000-000000000000",
                    card,
                    uid,
                    user,
                    start,
                    end,
                    end,
                    rng.randrange(80000),
                    50.0 * 100,
                    100,
                    (end - start) * 300.0,
                    "exit",
                )
            )
    # The daily sums the keeper keeps as it closes each interval (store.roll), added up here at once: the host's
    # (uid None) and each uid's own.
    daily: dict[tuple[int | None, str, str, str], list[float]] = {}
    for r in rows:
        keys = (("user", r[6]), ("card", r[3]), ("image", r[2]))
        whole = r[8] - r[7]
        for i, (day, part) in enumerate(_parts(r[7], r[8])):
            for kind, key in keys:
                for whose in (None, r[5]):
                    slot = daily.setdefault((whose, kind, day, key), [0.0, 0.0, 0])
                    slot[0] += part
                    slot[1] += r[13] * part / whole
                    slot[2] += int(i == 0)

    def sums(own: bool) -> list[tuple[object, ...]]:
        return [
            (*((uid,) if own else ()), kind, day, key, int(key[4:12]) if kind == "card" else None, *v)
            for (uid, kind, day, key), v in daily.items()
            if (uid is not None) == own
        ]

    with store.lock:
        store.conn.execute("BEGIN")
        store.conn.executemany(
            "INSERT INTO daily (kind, day, key, idx, seconds, joules, n) VALUES (?, ?, ?, ?, ?, ?, ?)", sums(False)
        )
        store.conn.executemany(
            "INSERT INTO daily_own (uid, kind, day, key, idx, seconds, joules, n) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            sums(True),
        )
        store.conn.execute("INSERT INTO meta (name, value) VALUES ('longest', ?)", (step,))
        store.conn.executemany(
            "INSERT INTO intervals (container_id, container_name, image, card_uuid, card_index, uid, user, start, "
            "end, seen, peak_memory_mib, load_sum, load_n, energy_j, ended) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            rows,
        )
        store.conn.execute("COMMIT")
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _line(name: str, ms: float, target_ms: float, results: dict[str, object], note: str = "") -> None:
    met = ms <= target_ms
    print(
        f"{name:<60} {ms:9.3f} ms (target <= {target_ms:g} ms) {'ok' if met else 'MISSED'}"
        + (f"  ({note})" if note else ""),
        flush=True,
    )
    results[f"record: {name}"] = {"ms": round(ms, 4), "target_ms": target_ms, "met": met, "note": note}


def bench_record(results: dict[str, object], hostagent: str, n: int = 5) -> None:
    from gpupin.hostagent.record.store import Figures, IntervalRow, Store, connect, usage
    from gpupin.hostagent.record.writer import RecordWriter

    folder = tempfile.mkdtemp(prefix="gpupin-bench-record-")
    os.chmod(folder, 0o700)
    path = os.path.join(folder, "record.db")
    try:
        took = time.monotonic()
        build_year(path)
        size = os.path.getsize(path) / 2**20
        print(f"record: {INTERVALS} intervals written in {time.monotonic() - took:.1f} s ({size:.0f} MiB)", flush=True)

        store = Store(path)
        keeper = RecordWriter(store, inspect=lambda cid: None)
        calls = []
        for i in range(20000):
            t = time.perf_counter()
            keeper.note_owner(f"c{i}", 1000)
            calls.append(time.perf_counter() - t)
        _line("a booking's cost in its path (note_owner)", _median_ms(calls), 1.0, results)
        writes = []
        for i in range(200):
            now = time.time()
            row = IntervalRow(f"bench{i}", "bench", "img", "GPU-bench", 0, 1000, "user00", now, now)
            t = time.perf_counter()
            rid = store.open_interval(row)
            store.close_interval(rid, row, Figures(now, now, energy_j=1.0), time.time(), "exit")
            writes.append(time.perf_counter() - t)
        looks = []
        for _ in range(50):
            t = time.perf_counter()
            store.finished(1005, time.time() - 7 * 86400)
            looks.append(time.perf_counter() - t)
        _line(
            "a GPU-hour quota's look in its path (finished, a week)",
            _median_ms(looks),
            1.0,
            results,
            "only where the policy sets one",
        )
        _line(
            "the keeper's writes per booking (open, close), off its path",
            _median_ms(writes),
            1.0,
            results,
            "on the year's database",
        )
        store.close()

        conn = connect(path, readonly=True)
        queries = []
        for _ in range(n):
            t = time.perf_counter()
            rows = usage(conn, None, "user")
            queries.append(time.perf_counter() - t)
        assert len(rows) == 20 and sum(r.intervals for r in rows) == INTERVALS + 200
        _line("usage --by user over the year: the query", _median_ms(queries), 200.0, results)
        week = []
        for _ in range(n):
            t = time.perf_counter()
            usage(conn, time.time() - 7 * 86400, "user")
            week.append(time.perf_counter() - t)
        _line("usage --by user --since 7d (the dashboard's chart): the query", _median_ms(week), 200.0, results)
        for by in ("user", "day"):  # what the agent's socket answers a user: their own rows (1/20 of the year)
            own = []
            for _ in range(n):
                t = time.perf_counter()
                mine = usage(conn, None, by, uid=1005)
                own.append(time.perf_counter() - t)
            assert sum(r.intervals for r in mine) > INTERVALS // 40
            _line(f"a user's own usage --by {by} over the year: the query", _median_ms(own), 200.0, results)
        conn.close()
        # The whole command, interleaved with `hostagent --version` (the same start-up, no record): what is left
        # once the interpreter and hostagent's parser are up is the answer's own time.
        whole: list[float] = []
        startup: list[float] = []
        for i in range(2 * n):
            argv = (
                [hostagent, "usage", "--by", "user", "--json", "--record", path]
                if i % 2 == 0
                else [hostagent, "--version"]
            )
            t = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            (whole if i % 2 == 0 else startup).append(time.perf_counter() - t)
        _line(
            "`hostagent usage --by user --json` over the year, less start-up",
            _median_ms(whole) - _median_ms(startup),
            200.0,
            results,
            f"the command {_median_ms(whole):.0f} ms, `hostagent --version` {_median_ms(startup):.0f} ms",
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    out: dict[str, object] = {}
    bench_record(out, str(Path(sys.executable).parent / "hostagent"))
