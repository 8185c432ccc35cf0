"""The record on a real daemon: an agent killed with SIGKILL in the middle of intervals and started again counts each
container's run once, from its own StartedAt to its own FinishedAt (within 1 s); a full disk under the database
books runs as before, says the record is degraded in /api/ls and `ls`, and writes what it kept once there is room;
a real user's booking is charged to her uid, ends as `expiry`, and calls the policy's hooks; a hook that hangs
stalls nothing and dies with the agent. The record's file and
sums without a daemon: tests/unit/test_record.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.record import intervals, run_time
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.wait import wait_for


def started(agent: Agent, name: str, gpu: str, seconds: int, env: dict[str, str]) -> str:
    r = agent("run", "-d", "--name", name, "--gpu", gpu, TEST_IMAGE, "sleep", str(seconds), timeout=120, **env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


@pytest.mark.needs("stop-reason")
@pytest.mark.per_engine  # the run times and the events are each engine's own
def test_sigkill_mid_interval_counts_each_run_once(agent: Agent) -> None:
    resident = Resident(agent.env, "--interval", "0.2")
    db = resident.dir / "record.db"
    try:
        short = started(agent, f"rec-short-{agent.tag}", "0", 8, {"GPUPIN_AGENT_SOCKET": resident.socket})
        long = started(agent, f"rec-long-{agent.tag}", "1", 300, {"GPUPIN_AGENT": "0"})
        wait_for(lambda: len(intervals(db)) == 2, 20, "both intervals open in the record")
        time.sleep(2)
        resident.kill()  # SIGKILL: nothing is closed, nothing flushed
        wait_for(lambda: run_time(agent, short)[1] > 0, 30, "the short run to end while no agent runs")
        resident.restart()
        agent.sandbox.docker("stop", "-t", "1", long, check=True)
        wait_for(lambda: all(r["end"] is not None for r in intervals(db)), 30, "both intervals closed")
        rows = {r["container_id"]: r for r in intervals(db)}
        assert sorted(rows) == sorted([short, long]), rows  # one row each: nothing counted twice
        for cid in (short, long):
            begin, end = run_time(agent, cid)
            r = rows[cid]
            assert abs((r["end"] - r["start"]) - (end - begin)) < 1.0, (cid, r, begin, end)
            assert abs(r["start"] - begin) < 1.0 and abs(r["end"] - end) < 1.0, (cid, r, begin, end)
        assert rows[short]["ended"] == "exit" and rows[long]["ended"] == "stop"
        assert rows[short]["uid"] == os.getuid() and rows[short]["user"] == "root"  # the caller at accept
        assert rows[long]["energy_j"] and rows[long]["peak_memory_mib"] is not None
        status, body, _ = resident.get("/api/usage?by=card")
        assert status == 200 and {r["card"] for r in json.loads(body)["rows"]} == {
            rows[short]["card_uuid"],
            rows[long]["card_uuid"],
        }
        metrics = resident.get("/metrics", unix=True)[1].decode()  # root on the socket: every user's series
        assert 'gpupin_gpu_seconds_total{user="root"}' in metrics and "gpupin_energy_joules_total" in metrics
    finally:
        resident.close()


def test_full_disk_under_the_record(agent: Agent) -> None:
    where = Path(tempfile.mkdtemp(prefix="gpupin-record-full-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", str(where)], check=True)
    resident = None
    try:
        resident = Resident(agent.env, "--interval", "0.2", "--record", str(where / "record.db"))
        filler = where / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        cid = started(agent, f"rec-full-{agent.tag}", "0", 300, {"GPUPIN_AGENT_SOCKET": resident.socket})
        degraded = wait_for(lambda: resident.ls()["record"]["degraded"], 20, "the record to say it is degraded")
        assert "full" in degraded
        shown = subprocess.run(
            [*agent.argv("ls", "--host", f"unix://{resident.socket}")],
            env=agent.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0 and "record degraded" in shown.stdout, shown
        assert resident.proc.poll() is None
        filler.unlink()
        wait_for(lambda: resident.ls()["record"]["degraded"] is None, 30, "the record to be written again")
        assert [r["container_id"] for r in intervals(where / "record.db")] == [cid]
    finally:
        if resident is not None:
            resident.close()
        subprocess.run(["umount", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def test_a_users_booking_is_hers_in_the_record_and_the_hooks(agent: Agent, tmp_path: Path) -> None:
    """A real user (alice, under setpriv) books through the agent with --for: her interval is charged to the uid the
    kernel named at accept, ends as `expiry` when the booking runs out, the policy's notify command gets
    booking.ending and booking.ended on its stdin, and `hostagent usage` as her (the record is root's: through
    the agent) shows her GPU-seconds."""
    from tests.docker.test_policy_agent import ALICE, Lab

    os.chmod(tmp_path, 0o755)
    got = tmp_path / "got"
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\ncat >> "{got}"; echo >> "{got}"\n')
    hook.chmod(0o755)
    lab = Lab(agent, tmp_path, f'[notify]\ncommand = ["{hook}"]\nbefore_end = "3s"\n')
    try:
        name = f"rec-alice-{agent.tag}"
        r = lab.as_user(ALICE, "run", "-d", "--name", name, "--for", "5s", "--gpu", "1", TEST_IMAGE, "sleep", "300")
        assert r.returncode == 0, r.stderr
        db = lab.resident.dir / "record.db"
        rows = wait_for(lambda: [x for x in intervals(db) if x["end"] is not None], 30, "the interval closed")
        assert len(rows) == 1 and rows[0]["container_name"] == name, rows
        assert (rows[0]["uid"], rows[0]["ended"]) == (ALICE, "expiry"), rows
        begin, end = run_time(agent, name)
        assert abs((rows[0]["end"] - rows[0]["start"]) - (end - begin)) < 1.0

        def told() -> list[dict[str, Any]]:
            lines = got.read_text().splitlines() if got.exists() else []
            return [json.loads(ln) for ln in lines if ln]

        wait_for(lambda: len(told()) >= 2, 20, "booking.ending and booking.ended on the hook's stdin")
        events = told()
        assert [e["event"] for e in events] == ["booking.ending", "booking.ended"]
        assert all(e["user"]["uid"] == ALICE and e["container"]["name"] == name for e in events)
        usage = lab.as_user(ALICE, "usage", "--json")
        assert usage.returncode == 0, usage.stderr
        (row,) = json.loads(usage.stdout)["rows"]
        assert row["user"] == rows[0]["user"] and abs(row["gpu_seconds"] - (end - begin)) < 1.0
    finally:
        lab.resident.close()


def test_a_hanging_hook_stalls_nothing(agent: Agent, tmp_path: Path) -> None:
    """The policy's notify command hangs on the first event: the agent's view still answers at once, a run still
    books, and the agent's stop (SIGTERM, within 5 s) kills the hook rather than leave it behind."""
    from tests.docker.test_policy_agent import ALICE, Lab

    os.chmod(tmp_path, 0o755)
    pids = tmp_path / "pids"
    hook = tmp_path / "hook.sh"
    hook.write_text(f'#!/bin/sh\necho $$ >> "{pids}"\nexec sleep 600\n')
    hook.chmod(0o755)
    lab = Lab(agent, tmp_path, f'[notify]\ncommand = ["{hook}"]\nbefore_end = "10m"\n')
    try:
        booked = lab.as_user(ALICE, "run", "-d", "--for", "5m", "--gpu", "1", TEST_IMAGE, "sleep", "300")
        assert booked.returncode == 0, booked.stderr
        wait_for(pids.exists, 20, "the hook called (booking.ending) and hanging")
        started = time.monotonic()
        lab.resident.ls()
        assert time.monotonic() - started < 10  # not held by the hook, which hangs for 600 s
        other = agent("run", "-d", "--gpu", "0", TEST_IMAGE, "sleep", "300", GPUPIN_AGENT_SOCKET=lab.resident.socket)
        assert other.returncode == 0, other.stderr
        db = lab.resident.dir / "record.db"
        wait_for(lambda: len(intervals(db)) == 2, 20, "both runs in the record")
    finally:
        lab.resident.close()  # exit 0 within 5 s
    pid = int(pids.read_text().split()[0])

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, 5, "the hanging hook killed with the agent")
