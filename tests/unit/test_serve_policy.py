"""The agent's policy fails closed (docs/policy.md, "Reloading"): at start a file with mistakes keeps the last good
policy the agent saved, or with none saved the agent does not start (64, one line per mistake, nothing made); a user
the host no longer has is a warning; SIGHUP with mistakes keeps the policy in force; the start line says the idle
time in force. Without a daemon: the policy is the agent's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.support.host import HOSTAGENT, simhost_env
from tests.support.resident import Resident
from tests.support.wait import wait_for

NO_DOCKER = "unix:///nonexistent/docker.sock"
GOOD = '[quota]\ncards = 1\n[booking]\nmax = "1h"\n[idle]\nafter = "30s"\n'
BAD = '[quota]\ncards = -1\n[booking]\nmax = "2 days"\n'


def policy_of(agent: Resident) -> dict[str, Any]:
    status, body, _ = agent.get("/api/agent", unix=True)
    assert status == 200, body
    got: dict[str, Any] = json.loads(body)["policy"]
    return got


def test_a_start_on_mistakes_with_no_good_policy_saved_is_refused(tmp_path: Path) -> None:
    """The host has a policy, with mistakes, and the agent never read a good one: it does not start and enforce
    nothing. One line per mistake, 64, no socket, no record."""
    (tmp_path / "policy.toml").write_text(BAD)
    folder = tmp_path / "agent"
    folder.mkdir(mode=0o700)
    where = ["--socket", str(folder / "s.sock"), "--record", str(folder / "record.db")]
    r = subprocess.run(
        [HOSTAGENT, "serve", *where, "--http", "none", "--policy", str(tmp_path / "policy.toml")],
        env=simhost_env(DOCKER_HOST=NO_DOCKER),
        capture_output=True,
        text=True,
        timeout=30,
    )
    lines = r.stderr.splitlines()
    assert r.returncode == 64 and len(lines) == 2, r.stderr
    assert ":2: quota.cards:" in lines[0] and ":4: booking.max:" in lines[1], r.stderr
    assert all(line.startswith("hostagent serve: ERROR: ") for line in lines), r.stderr
    assert "HINT:" in lines[1] and "policy check" in lines[1] and "Traceback" not in r.stderr
    assert os.listdir(folder) == []  # nothing made: no socket, no record


def test_a_start_on_mistakes_keeps_the_last_good_policy_saved(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(GOOD)
    env = simhost_env(DOCKER_HOST=NO_DOCKER)
    first = Resident(env, "--policy", str(path))
    good = policy_of(first)
    assert good["error"] is None and "quota cards 1" in good["summary"] and good["saved"] is None
    first.kill(signal.SIGTERM)  # its folder stays, with the saved copy (the record's folder)
    assert (first.dir / "policy.last-good.toml").exists()
    path.write_text(BAD)  # the next boot finds a file with mistakes
    again = Resident(env, "--policy", str(path), directory=first.dir)
    try:
        kept = policy_of(again)
        assert kept["summary"] == good["summary"], kept
        assert kept["read"] and kept["saved"] == str(first.dir / "policy.last-good.toml")
        assert [m.split(": ")[0].rsplit(":", 1)[1] for m in kept["error"]] == ["2", "4"], kept
    finally:
        again.close()
    assert "the agent keeps the last good policy it saved" in again.stderr, again.stderr
    assert "idle after 30s, the policy's [idle]" in again.stderr, again.stderr


def test_a_saved_copy_of_another_file_or_of_another_user_is_not_kept(tmp_path: Path) -> None:
    """The copy is this file's, and the agent's own: a copy saved from another --policy, or one another user may
    write, is not a good policy of this host; the start is refused as with none."""
    path = tmp_path / "policy.toml"
    path.write_text(BAD)
    folder = tmp_path / "agent"
    folder.mkdir(mode=0o700)
    saved = folder / "policy.last-good.toml"
    where = ["--socket", str(folder / "s.sock"), "--record", str(folder / "record.db"), "--http", "none"]
    for text, mode in (
        (
            f"# The last good policy the agent read, from {tmp_path}/other.toml (docs/policy.md, Reloading).\n" + GOOD,
            0o644,
        ),
        (f"# The last good policy the agent read, from {path} (docs/policy.md, Reloading).\n" + GOOD, 0o666),
    ):
        saved.write_text(text)
        saved.chmod(mode)
        r = subprocess.run(
            [HOSTAGENT, "serve", *where, "--policy", str(path)],
            env=simhost_env(DOCKER_HOST=NO_DOCKER), capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        refused = [line for line in r.stderr.splitlines() if "ERROR:" in line]
        assert r.returncode == 64 and len(refused) == 2, r.stderr
        assert "is not used" in r.stderr, r.stderr
        assert sorted(os.listdir(folder)) == ["policy.last-good.toml"]  # nothing made


def test_a_user_the_host_no_longer_has_is_a_warning_and_the_rest_is_enforced(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(GOOD + "[quota.user.a-student-who-left]\ncards = 4\n")
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), "--policy", str(path))
    try:
        p = policy_of(agent)
        assert p["error"] is None and "quota cards 1" in p["summary"], p
        assert len(p["warnings"]) == 1 and "quota.user.a-student-who-left: no such user" in p["warnings"][0], p
    finally:
        agent.close()
    assert "policy: warning: " in agent.stderr and "nothing is enforced" not in agent.stderr, agent.stderr


def test_a_reload_with_mistakes_keeps_the_policy_in_force(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(GOOD)
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), "--policy", str(path))
    try:
        before = policy_of(agent)
        path.write_text(BAD)
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: policy_of(agent)["error"] is not None, 10, "the reload")
        after = policy_of(agent)
        assert after["summary"] == before["summary"] and after["loaded_at"] == before["loaded_at"], after
        saved = (agent.dir / "policy.last-good.toml").read_text()
        assert saved.endswith(GOOD)  # the copy kept is the good file, never the one with mistakes
    finally:
        agent.close()


def test_the_start_line_says_the_idle_time_in_force() -> None:
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), "--idle-after", "90s")
    agent.close()
    assert "idle after 90s)" in agent.stderr, agent.stderr
    with tempfile.TemporaryDirectory() as d:
        policy = Path(d) / "policy.toml"
        policy.write_text('[idle]\nafter = "30m"\naction = "stop"\n')
        agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER), "--idle-after", "90s", "--policy", str(policy))
        agent.close()
    assert "idle after 30m, the policy's [idle])" in agent.stderr, agent.stderr
