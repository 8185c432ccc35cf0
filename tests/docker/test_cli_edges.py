"""Edges of the CLI a new user meets on a real daemon (issue 33): a user outside the docker group is told so in one
line, with no Python tuple and no advice to start a daemon that runs."""

from __future__ import annotations

import subprocess

from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.users import as_other, reach_env, setpriv

GROUPLESS = 5009  # in no group: neither the daemon's nor the agent's


def test_a_user_outside_the_docker_group_gets_one_clear_line(agent: Agent) -> None:
    env = reach_env({**agent.env, "GPUPIN_AGENT_SOCKET": "/nonexistent/agent.sock"})  # no agent: the daemon itself
    for args in (["run", "--gpu", "0", TEST_IMAGE, "true"], ["run", "--count", "1", "-d", TEST_IMAGE, "true"]):
        r = subprocess.run(
            as_other(setpriv(GROUPLESS), agent.argv(*args)), env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 69 and r.stderr.count("\n") == 1, r.stderr
        assert f"the Docker daemon at {agent.sandbox.host} refused this user" in r.stderr, r.stderr
        assert "permission denied on its socket" in r.stderr and "docker group" in r.stderr, r.stderr
        assert "start dockerd" not in r.stderr and "Errno" not in r.stderr and "Traceback" not in r.stderr
    assert agent.containers() == []
