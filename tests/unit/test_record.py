"""The record without a daemon: its file (created private, a planted link refused, older schemas migrated, a newer
one refused), the usage sums, the keeper's intervals from views (start and end as the daemon says, taken up after a
restart, kept in memory while the disk is full), and `hostagent usage`'s output and refusals."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.ls.model import Health, Listing
from gpupin.hostagent.record import store as record_store
from gpupin.hostagent.record.report import since
from gpupin.hostagent.record.store import (
    MIGRATIONS,
    VERSION,
    Figures,
    IntervalRow,
    RecordRefused,
    Store,
    finished,
    usage,
)
from gpupin.hostagent.record.writer import RecordWriter
from tests.support.host import HOSTAGENT
from tests.support.users import as_other, reach_env, setpriv

T0 = 1_700_000_000.0  # a fixed epoch for the sums, in the past (`usage` counts up to now)


def rfc3339(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def private(tmp_path: Path) -> Path:
    d = tmp_path / "lib"
    d.mkdir(mode=0o700)
    return d / "record.db"


# --- the file ---


def test_created_private_and_versioned(tmp_path: Path) -> None:
    path = tmp_path / "new" / "gpupin" / "record.db"
    s = Store(str(path))
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert record_store.version_of(s.conn) == VERSION
    assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    s.close()


def test_planted_link_refused(tmp_path: Path) -> None:
    """A link where the database goes is not followed: root would write through it."""
    path = private(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    path.symlink_to(victim)
    with pytest.raises(RecordRefused, match="not a regular file"):
        Store(str(path))
    assert victim.read_text() == "keep"


def test_folder_of_others_refused(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    with pytest.raises(RecordRefused, match="another user"):
        Store(str(d / "record.db"))
    assert not (d / "record.db").exists()
    link = tmp_path / "linked"
    link.symlink_to(private(tmp_path).parent)
    with pytest.raises(RecordRefused, match="not a directory"):
        Store(str(link / "record.db"))


def test_migrates_v0_and_v1(tmp_path: Path) -> None:
    """An empty file (v0) and a v1 file (no energy) are brought to the current version; v1's rows are kept."""
    v0 = private(tmp_path)
    sqlite3.connect(v0).close()
    os.chmod(v0, 0o600)
    s = Store(str(v0))
    assert s.migrated_from == 0 and record_store.version_of(s.conn) == VERSION
    s.close()
    v1 = tmp_path / "lib" / "v1.db"
    conn = sqlite3.connect(v1)
    conn.executescript(MIGRATIONS[0] + "UPDATE schema SET version = 1;")
    conn.execute(
        "INSERT INTO intervals (container_id, card_uuid, user, start, end, seen, ended) "
        "VALUES ('c1', 'GPU-a', 'alice', ?, ?, ?, 'exit')",
        (T0, T0 + 60, T0 + 60),
    )
    conn.commit()
    conn.close()
    os.chmod(v1, 0o600)
    s = Store(str(v1))
    assert s.migrated_from == 1
    rows = shares(s, None, "user", T0 + 100)
    assert rows == [{"user": "alice", "gpu_seconds": 60.0, "gpu_hours": 0.0167, "energy_j": None, "intervals": 1}]
    s.close()


def test_v3_read_as_it_is_and_migrated_with_each_users_sums(tmp_path: Path) -> None:
    """A v3 file (daily sums for the host only): root's `usage` reads it as it is, before an agent migrates it; the
    migration to v4 fills each uid's daily sums from the closed intervals, so a user's own rows are what they were
    (a v2 file, with no daily sums at all, is refused)."""
    path = private(tmp_path)
    s = Store(str(path))
    _row(s, "a", "alice", 1000, T0, T0 + 7200, joules=7.2e6)
    _row(s, "b", "bob", 1001, T0 + 60, T0 + 660)
    _row(s, "c", "who", None, T0, T0 + 60)  # no known uid: no one's own
    own = {uid: [r.to_json("image") for r in s.usage(None, "image", T0 + 86400, uid)] for uid in (1000, 1001)}
    s.conn.executescript("DROP TABLE daily_own; UPDATE schema SET version = 3;")
    s.close()
    out = subprocess.run([HOSTAGENT, "usage", "--record", str(path), "--csv"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.splitlines()[1:] == [
        "alice,7200.0,2.0,7200000.0,1",
        "bob,600.0,0.1667,,1",
        "who,60.0,0.0167,,1",
    ], out
    s = Store(str(path))
    assert s.migrated_from == 3 and record_store.version_of(s.conn) == VERSION
    assert {uid: [r.to_json("image") for r in s.usage(None, "image", T0 + 86400, uid)] for uid in own} == own
    assert own[1000] == [{"image": "img", "gpu_seconds": 7200.0, "gpu_hours": 2.0, "energy_j": 7.2e6, "intervals": 1}]
    s.conn.execute("UPDATE schema SET version = 2")
    s.close()
    out = subprocess.run([HOSTAGENT, "usage", "--record", str(path)], capture_output=True, text=True)
    assert out.returncode == 64 and "schema version 2" in out.stderr, out


def test_newer_schema_refused(tmp_path: Path) -> None:
    path = private(tmp_path)
    Store(str(path)).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema SET version = ?", (VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(RecordRefused, match="newer than"):
        Store(str(path))


# --- the sums ---


def shares(s: Store, since: float | None, by: str, now: float) -> list[dict[str, Any]]:
    """`usage`'s rows as /api/usage writes them."""
    return [r.to_json(by) for r in s.usage(since, by, now)]


def _row(
    s: Store, cid: str, user: str, uid: int | None, start: float, end: float | None, joules: float | None = None
) -> None:
    row = IntervalRow(cid, cid, "img", "GPU-a", 0, uid, user, start, start)
    rid = s.open_interval(row)
    if end is not None:
        s.close_interval(rid, row, Figures(start, start, energy_j=joules), end, "exit")


def test_sums_since_and_open(tmp_path: Path) -> None:
    """An interval counts its part after `since`; an open one counts up to now; energy in proportion."""
    s = Store(str(private(tmp_path)))
    _row(s, "a", "alice", 1000, T0, T0 + 3600, joules=3600.0)
    _row(s, "b", "bob", 1001, T0 + 1800, None)
    now = T0 + 7200
    by_user = {r["user"]: r for r in shares(s, T0 + 1800, "user", now)}
    assert by_user["alice"]["gpu_seconds"] == 1800 and by_user["alice"]["energy_j"] == 1800.0
    assert by_user["bob"]["gpu_seconds"] == 5400 and by_user["bob"]["energy_j"] is None
    # the quotas' past: the closed intervals that ended after `since`, whole (the quota clips them); an open one is
    # the ledger's to count, not the record's
    assert s.finished(1000, T0) == [(T0, T0 + 3600)] and s.finished(1001, T0) == []
    assert finished(s.conn, 1000, T0 + 3600) == []
    assert [r["card"] for r in shares(s, None, "card", now)] == ["GPU-a"]
    with pytest.raises(ValueError):
        usage(s.conn, None, "nope")
    s.close()


def test_daily_sums_agree_with_the_intervals(tmp_path: Path) -> None:
    """The daily sums plus the first day's edge give what summing every interval's part since `since` gives,
    for intervals across midnights, open ones, and any `since`."""
    import random

    rng = random.Random(7)
    s = Store(str(private(tmp_path)))
    truth = []
    for i in range(300):
        start = T0 + rng.uniform(0, 20 * 86400)
        end = None if i % 50 == 0 else start + rng.choice([60, 3600, 30 * 3600, 3 * 86400]) * rng.random()
        user = f"u{rng.randrange(5)}"
        _row(s, f"c{i}", user, 1000, start, end, joules=None if end is None else (end - start) * 100)
        truth.append((user, start, end))
    now = T0 + 25 * 86400
    for cut in [None, *(T0 + rng.uniform(-86400, 22 * 86400) for _ in range(20))]:
        lo = float("-inf") if cut is None else cut
        want: dict[str, float] = {}
        for user, start, end in truth:
            part = min(end if end is not None else now, now) - max(start, lo)
            if part > 0:
                want[user] = want.get(user, 0.0) + part
        got = {r["user"]: r["gpu_seconds"] for r in shares(s, cut, "user", now)}
        assert got.keys() == want.keys() and all(abs(got[u] - want[u]) < 0.01 for u in want), cut
        days = shares(s, cut, "day", now)
        assert abs(sum(d["gpu_seconds"] for d in days) - sum(want.values())) < 0.1
    s.close()


def test_own_rows_are_the_users_intervals_alone(tmp_path: Path) -> None:
    """A user's own usage (what the agent shows a user of its socket), by user, card, image and day: what the whole
    record gives where only that user's intervals were kept, for any `since`; another user's intervals, and those
    of no known uid, count for no one else."""
    import random

    rng = random.Random(11)
    both = Store(str(private(tmp_path)))
    (tmp_path / "alone").mkdir(mode=0o700)
    alone = Store(str(tmp_path / "alone" / "record.db"))
    for i in range(200):
        uid = rng.choice([1000, 1001, None])
        start = T0 + rng.uniform(0, 10 * 86400)
        end = None if i % 40 == 0 else start + rng.choice([60, 3600, 30 * 3600]) * rng.random()
        card = rng.randrange(3)
        row = IntervalRow(f"c{i}", f"c{i}", f"img{rng.randrange(4)}", f"GPU-{card}", card, uid, f"u{uid}", start, start)
        joules = None if rng.random() < 0.3 else rng.uniform(0, 1e6)
        for s in [both] + ([alone] if uid == 1000 else []):
            rid = s.open_interval(row)
            if end is not None:
                s.close_interval(rid, row, Figures(start, start, energy_j=joules), end, "exit")
    now = T0 + 12 * 86400
    for cut in [None, *(T0 + rng.uniform(-86400, 11 * 86400) for _ in range(8))]:
        for by in ("user", "card", "image", "day"):
            own = [r.to_json(by) for r in both.usage(cut, by, now, uid=1000)]
            want = shares(alone, cut, by, now)
            assert [r[by] for r in own] == [r[by] for r in want], (cut, by)
            for a, b in zip(own, want, strict=True):
                assert a["intervals"] == b["intervals"] and abs(a["gpu_seconds"] - b["gpu_seconds"]) < 0.01, (a, b)
                assert (a["energy_j"] is None) == (b["energy_j"] is None), (a, b)
                assert a["energy_j"] is None or abs(a["energy_j"] - b["energy_j"]) < 1, (a, b)
                assert a.get("index") == b.get("index")
    assert [r.key for r in both.usage(None, "user", now, uid=1000)] == ["u1000"]
    assert both.usage(None, "image", now, uid=4242) == []
    both.close()
    alone.close()


def test_by_day_splits_at_midnight(tmp_path: Path) -> None:
    import datetime

    s = Store(str(private(tmp_path)))
    midnight = datetime.datetime(2023, 3, 2).timestamp()
    _row(s, "a", "alice", 1000, midnight - 3600, midnight + 7200)
    days = shares(s, None, "day", midnight + 10 * 3600)
    assert [(d["day"], d["gpu_seconds"]) for d in days] == [("2023-03-01", 3600), ("2023-03-02", 7200)]
    s.close()


# --- the keeper ---


def view(holders: dict[str, list[str]], docker: bool = True, mem: int = 100, util: int = 50) -> Listing:
    return Listing.from_json(
        {
            "docker": {"available": docker},
            "gpus": [
                {
                    "uuid": uuid,
                    "index": i,
                    "name": "Fake",
                    "error": None,
                    "health": {"healthy": True, "reasons": []},
                    "memory_used_mib": mem,
                    "utilization_gpu": util,
                    "holders": [{"id": c, "name": f"n-{c}", "image": "img:1", "holds": True} for c in cids],
                }
                for i, (uuid, cids) in enumerate(holders.items())
            ],
        }
    )


class Daemon:
    """What inspect answers, per container."""

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, Any]] = {}

    def run(self, cid: str, started: float) -> None:
        self.containers[cid] = {
            "State": {"Running": True, "StartedAt": rfc3339(started), "FinishedAt": "0001-01-01T00:00:00Z"},
            "Config": {"Labels": {}, "Image": "img:1"},
        }

    def end(self, cid: str, finished: float) -> None:
        st = self.containers[cid]["State"]
        st["Running"] = False
        st["FinishedAt"] = rfc3339(finished)

    def inspect(self, cid: str) -> dict[str, Any] | None:
        return self.containers.get(cid)


def rows(s: Store) -> list[dict[str, Any]]:
    cur = s.conn.execute("SELECT * FROM intervals ORDER BY id")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def test_keeper_opens_and_closes_at_the_daemons_times(tmp_path: Path) -> None:
    s = Store(str(private(tmp_path)))
    d = Daemon()
    k = RecordWriter(s, d.inspect)
    d.run("c1", T0)
    k.note_owner("c1", 0)
    k.observe(view({"GPU-a": ["c1"], "GPU-b": []}), None)
    k.step(now=T0 + 1.3)
    k.observe(view({"GPU-a": ["c1"], "GPU-b": []}, mem=300, util=100), None)
    k.step(now=T0 + 2)
    d.end("c1", T0 + 42.5)
    k.end_reason("c1", "expiry")
    k.event({"Action": "kill", "id": "c1"})  # the stop that follows an expiry leaves the expiry
    k.observe(view({"GPU-a": [], "GPU-b": []}), None)
    k.step(now=T0 + 43)
    (r,) = rows(s)
    assert (r["start"], r["end"], r["ended"], r["uid"], r["user"]) == (T0, T0 + 42.5, "expiry", 0, "root")
    assert (r["peak_memory_mib"], r["load_sum"] / r["load_n"]) == (300, 75)
    assert shares(s, None, "image", T0 + 50)[0]["gpu_seconds"] == 42.5


def opened_without_owner(tmp_path: Path) -> tuple[Store, Daemon, RecordWriter]:
    """c1 on GPU-a since T0, its interval opened by a view taken before its owner was noted."""
    s = Store(str(private(tmp_path)))
    d = Daemon()
    k = RecordWriter(s, d.inspect)
    d.run("c1", T0)
    k.observe(view({"GPU-a": ["c1"]}), None)
    k.step(now=T0 + 1)
    return s, d, k


def test_an_owner_noted_after_the_interval_opened_is_its_owner(tmp_path: Path) -> None:
    """The agent notes a run's owner once the daemon's create has returned; a view taken in between opens the
    interval with no owner. The owner noted then is the interval's, open (in the store and the hooks' payload)
    and closed (the row and the uid's own daily sums)."""
    s, d, k = opened_without_owner(tmp_path)
    assert rows(s)[0]["uid"] is None
    k.note_owner("c1", 0)
    k.observe(view({"GPU-a": ["c1"]}), None)
    k.step(now=T0 + 2)
    assert (rows(s)[0]["uid"], rows(s)[0]["user"]) == (0, "root")
    assert k.open["c1", "GPU-a"].payload()["user"] == {"uid": 0, "name": "root"}
    d.end("c1", T0 + 10)
    k.observe(view({"GPU-a": []}), None)
    k.step(now=T0 + 11)
    (r,) = rows(s)
    assert (r["uid"], r["user"], r["end"]) == (0, "root", T0 + 10)
    assert finished(s.conn, 0, T0) == [(T0, T0 + 10)]


def test_an_owner_noted_before_the_close_step_is_written_with_the_close(tmp_path: Path) -> None:
    """Opened without an owner, noted, and gone by the next view: the close carries the owner."""
    s, d, k = opened_without_owner(tmp_path)
    k.note_owner("c1", 0)
    d.end("c1", T0 + 5)
    k.observe(view({"GPU-a": []}), None)
    k.step(now=T0 + 6)
    (r,) = rows(s)
    assert (r["uid"], r["user"], r["end"]) == (0, "root", T0 + 5)


def test_unknown_holders_close_nothing(tmp_path: Path) -> None:
    s = Store(str(private(tmp_path)))
    d = Daemon()
    d.run("c1", T0)
    k = RecordWriter(s, d.inspect)
    k.observe(view({"GPU-a": ["c1"]}), None)
    k.step(now=T0 + 1)
    k.observe(view({"GPU-a": []}, docker=False), None)  # the daemon does not answer: holders unknown
    k.step(now=T0 + 2)
    assert rows(s)[0]["end"] is None and len(k.open) == 1


def test_restart_takes_up_and_closes_at_finished(tmp_path: Path) -> None:
    """An agent killed mid-interval: the next one goes on with a container still running (one row, not two) and
    closes one that ended meanwhile at its own FinishedAt."""
    path = str(private(tmp_path))
    s = Store(path)
    d = Daemon()
    d.run("c1", T0)
    d.run("c2", T0 + 5)
    k = RecordWriter(s, d.inspect)
    k.observe(view({"GPU-a": ["c1"], "GPU-b": ["c2"]}), None)
    k.step(now=T0 + 6)
    # SIGKILL: nothing more from this keeper. c2 ends while no agent runs.
    d.end("c2", T0 + 30.25)
    s2 = Store(path)
    k2 = RecordWriter(s2, d.inspect)
    k2.start()
    k2.stopping.set()  # its thread stops; the test steps it
    k2.observe(view({"GPU-a": ["c1"], "GPU-b": []}), None)
    k2.step(now=T0 + 60)
    by_cid = {r["container_id"]: r for r in rows(s2)}
    assert len(rows(s2)) == 2
    assert by_cid["c1"]["end"] is None and by_cid["c1"]["start"] == T0
    assert (by_cid["c2"]["start"], by_cid["c2"]["end"], by_cid["c2"]["ended"]) == (T0 + 5, T0 + 30.25, "exit")


class FullStore(Store):
    """Writes fail as on a full disk, until `full` is cleared."""

    full = True

    def open_interval(self, row: IntervalRow) -> int:
        if self.full:
            raise sqlite3.OperationalError("database or disk is full")
        return super().open_interval(row)

    def update(self, rows: list[tuple[int, Figures]]) -> None:
        if self.full:
            raise sqlite3.OperationalError("database or disk is full")
        super().update(rows)

    def close_interval(self, rid: int, row: IntervalRow, figures: Figures, end: float, ended: str) -> None:
        if self.full:
            raise sqlite3.OperationalError("database or disk is full")
        super().close_interval(rid, row, figures, end, ended)


def test_full_disk_degrades_then_writes_all(tmp_path: Path) -> None:
    s = FullStore(str(private(tmp_path)))
    d = Daemon()
    d.run("c1", T0)
    k = RecordWriter(s, d.inspect)
    k.observe(view({"GPU-a": ["c1"]}), None)
    k.step(now=T0 + 1)
    d.end("c1", T0 + 20)
    k.observe(view({"GPU-a": []}), None)
    k.step(now=T0 + 21)
    assert k.status().degraded == "database or disk is full"
    s.full = False
    k.step(now=T0 + 40)
    assert k.status().degraded is None
    (r,) = rows(s)
    assert (r["start"], r["end"]) == (T0, T0 + 20)


def test_energy_shared_among_holders(tmp_path: Path) -> None:
    from gpupin.core.nvml import Card

    s = Store(str(private(tmp_path)))
    d = Daemon()
    d.run("c1", T0)
    d.run("c2", T0)
    k = RecordWriter(s, d.inspect)
    card = Card(0, "GPU-a")
    for mj in (1_000_000, 3_000_000):  # 2000 J between two views, two holders
        card.energy = mj
        k.observe(view({"GPU-a": ["c1", "c2"]}), [card])
    k.step(now=T0 + 1)
    k._checkpoint(now=T0 + 100, force=True)
    assert [r["energy_j"] for r in rows(s)] == [1000.0, 1000.0]


def test_unhealthy_card_notifies_its_holder(tmp_path: Path) -> None:
    s = Store(str(private(tmp_path)))
    d = Daemon()
    d.run("c1", T0)
    got: list[tuple[str, dict[str, Any]]] = []
    k = RecordWriter(s, d.inspect, emit=lambda e, p: got.append((e, p)))
    k.observe(view({"GPU-a": ["c1"]}), None)
    k.step(now=T0 + 1)
    sick = view({"GPU-a": ["c1"]})
    sick.gpus[0].health = Health(False, ["XID 79"])
    k.observe(sick, None)
    k.step(now=T0 + 2)
    ((event, payload),) = got
    assert event == "card.unhealthy" and payload["container"]["id"] == "c1" and payload["reasons"] == ["XID 79"]
    assert payload["card"] == {"uuid": "GPU-a", "index": 0, "name": "Fake"}


# --- hostagent usage ---


def test_usage_command(tmp_path: Path) -> None:
    path = private(tmp_path)
    s = Store(str(path))
    _row(s, "a", "alice", 1000, T0, T0 + 7200, joules=7.2e6)
    s.close()
    run = [HOSTAGENT, "usage", "--record", str(path)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[1].split() == ["alice", "2.00", "2.000", "1"]
    data = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert data["rows"][0]["gpu_seconds"] == 7200
    csv = subprocess.run([*run, "--csv", "--by", "image"], capture_output=True, text=True, timeout=60).stdout
    assert csv.splitlines() == ["image,gpu_seconds,gpu_hours,energy_j,intervals", "img,7200.0,2.0,7200000.0,1"]


def test_usage_says_which_record_it_read(tmp_path: Path) -> None:
    """Root reads the record file itself: it says which (the default, GPUPIN_RECORD or --record), on stderr, so that
    the table is still the table; --json carries the path already and says nothing more."""
    path = private(tmp_path)
    Store(str(path)).close()
    env = {**os.environ, "GPUPIN_RECORD": str(path)}
    out = subprocess.run([HOSTAGENT, "usage"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and out.stdout == "no interval recorded\n", out
    assert out.stderr == (
        f"hostagent: usage: from the record {path}, read directly (GPUPIN_RECORD); --record PATH reads another\n"
    ), out.stderr
    out = subprocess.run([HOSTAGENT, "usage", "--record", str(path), "--csv"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == f"hostagent: usage: from the record {path}, read directly (--record)\n"
    env.pop("GPUPIN_RECORD")
    env["GPUPIN_AGENT_SOCKET"] = str(tmp_path / "no-agent.sock")
    out = subprocess.run([HOSTAGENT, "usage"], capture_output=True, text=True, timeout=60, env=env)
    default = "/var/lib/gpupin/record.db"
    if os.path.exists(default):  # a host that keeps one: it is named (on this machine, none: no agent answers)
        assert f"from the record {default}, read directly (the default)" in out.stderr, out.stderr
    else:
        assert out.returncode == 69 and default in out.stderr, out.stderr
    quiet = subprocess.run([HOSTAGENT, "usage", "--record", str(path), "--json"], capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == "" and json.loads(quiet.stdout)["record"]["path"] == str(path)


def test_usage_refusals(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for extra, says in (
        (["--since", "yesterday"], "invalid time"),
        (["--since", "inf"], "invalid time 'inf': since must be seconds since the epoch, 0 to 4294967295, not inf"),
        (["--since=-1e12"], "invalid time '-1e12': since must be seconds since the epoch"),
        (["--since", "1e20"], "invalid time '1e20': since must be seconds since the epoch"),
        (["--since", "nan"], "invalid time 'nan': since must be seconds since the epoch"),
        (["--since", "99999999999d"], "invalid time '99999999999d': since must be seconds since the epoch"),
        (["--record", str(fifo)], "not a regular file"),
        (["--record", str(tmp_path / "none.db")], "No such file"),
    ):
        out = subprocess.run([HOSTAGENT, "usage", *extra], capture_output=True, text=True, timeout=60)
        assert out.returncode == 64 and says in out.stderr and "Traceback" not in out.stderr, out
        assert out.stderr.count("\n") == 1, out.stderr


def test_since_forms() -> None:
    assert since("7d", now=T0) == T0 - 7 * 86400
    assert since("90m", now=T0) == T0 - 5400
    assert since(str(T0)) == T0
    import datetime

    assert since("2026-11-01") == datetime.datetime(2026, 11, 1).timestamp()


# --- as another user would ---


def test_api_usage_takes_only_its_words(tmp_path: Path) -> None:
    """GET /api/usage (both listeners, anyone who reaches them): `by` from its list, `since` a number, else 400 and
    the agent goes on; no record: 404."""
    from tests.support.host import simhost_env
    from tests.support.resident import Resident

    agent = Resident(simhost_env(DOCKER_HOST="unix:///nonexistent/docker.sock"), "--interval", "0.2")
    try:
        status, body, _ = agent.get("/api/usage?by=card&since=0")
        assert status == 200 and json.loads(body)["rows"] == [] and json.loads(body)["record"]["degraded"] is None
        for query in ("by=user;DROP%20TABLE%20intervals", "by=card&since=nan", "since=yesterday", "by=%00"):
            status, body, _ = agent.get(f"/api/usage?{query}", unix=True)
            assert status == 400 and json.loads(body)["exit"] == 64, (query, body)
        assert agent.get("/api/usage", unix=True)[0] == 200
        assert agent.get("/api/usage")[0] == 403  # by user, on HTTP: not served unless turned on (test_usage_private)
    finally:
        agent.close()
    none = Resident(simhost_env(DOCKER_HOST="unix:///nonexistent/docker.sock"), "--record", "none")
    try:
        assert none.get("/api/usage")[0] == 404
    finally:
        none.close()


def test_usage_as_another_user(tmp_path: Path) -> None:
    """The record is root's (0600): another user neither reads it nor gets a traceback; with no agent to ask, one
    line and 69."""
    path = private(tmp_path)
    Store(str(path)).close()
    out = subprocess.run(
        as_other(setpriv(65534), [HOSTAGENT, "usage"]),
        env=reach_env({**os.environ, "GPUPIN_RECORD": str(path), "GPUPIN_AGENT_SOCKET": str(tmp_path / "no.sock")}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 69 and out.stderr.count("ERROR:") == 1 and "Traceback" not in out.stderr, out
