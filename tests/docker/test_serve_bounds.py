"""`hostagent run` through a resident agent that any local user is flooding (issue 24; docs/serve.md, "Limits"), on
the sandboxed daemon: idle connections beyond the agent's open-file limit, on its TCP port and its socket, leave it
taking runs at once; and an agent out of tasks turns a run away (503) so that the run books by itself and
succeeds, where it used to exit 69. The agent alone under these attacks: tests/unit/test_serve_bounds.py."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.docker.test_run_agent import went_through_the_agent
from tests.support.flood import (
    FILES,
    FLOOD,
    cpu_share,
    has_pids_cgroup,
    idle_tcp,
    idle_unix,
    streams_until_refused,
    task_limit,
)
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent


def run_through(agent: Agent, r: Resident, trace: Path) -> tuple[int, float, str]:
    started = time.monotonic()
    p = agent(
        "run",
        "--rm",
        "--gpu",
        "0",
        TEST_IMAGE,
        "true",
        timeout=60,
        GPUPIN_AGENT_SOCKET=r.socket,
        GPUPIN_TRACE=str(trace),
    )
    return p.returncode, time.monotonic() - started, p.stderr


def test_a_run_through_a_flooded_agent_is_taken_at_once(agent: Agent, tmp_path: Path) -> None:
    r = Resident(agent.env, wrap=("prlimit", f"--nofile={FILES}:{FILES}", "--"))
    held: list[socket.socket] = []
    try:
        held += idle_tcp(r.port, FLOOD)
        held += idle_unix(r.socket, FLOOD)  # the caller's own uid too: root's idle connections give way to a run
        time.sleep(1.0)
        assert cpu_share(r) < 0.3
        code, took, err = run_through(agent, r, tmp_path / "trace")
        assert code == 0 and "Traceback" not in err, err
        assert went_through_the_agent(tmp_path / "trace"), err
        assert took < 20, took  # the run's own time; never the agent's 180 s
    finally:
        for s in held:
            s.close()
        r.close()


@pytest.mark.skipif(not has_pids_cgroup(), reason="no cgroup v1 pids hierarchy here")
def test_an_agent_out_of_tasks_turns_a_run_away_and_the_run_books_by_itself(agent: Agent, tmp_path: Path) -> None:
    limit = 24
    with task_limit(limit) as enter:
        r = Resident(agent.env, wrap=enter)
        streams: list[socket.socket] = []
        try:
            streams, _ = streams_until_refused(r, 2 * limit)
            code, took, err = run_through(agent, r, tmp_path / "trace")
            assert code == 0 and "Traceback" not in err, err
            assert took < 20, took
        finally:
            for s in streams:
                s.close()
            r.close()
    assert "Traceback" not in r.stderr and "can't start new thread" not in r.stderr, r.stderr
