"""The record on a real daemon: an agent killed with SIGKILL in the middle of intervals and started again counts each
container's run once, from its own StartedAt to its own FinishedAt (within 1 s); a full disk under the database
books runs as before, says the record is degraded in /api/ls and `ls`, and writes what it kept once there is room.
The record's file and sums without a daemon: tests/unit/test_record.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.record import intervals, run_time
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.wait import wait_for


def started(agent: Agent, name: str, gpu: str, seconds: int, env: dict[str, str]) -> str:
    r = agent("run", "-d", "--name", name, "--gpu", gpu, TEST_IMAGE, "sleep", str(seconds), timeout=120, **env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


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
        metrics = resident.get("/metrics")[1].decode()
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
