"""`hostagent run` through the resident agent (POST /api/run) against the sandboxed daemon, on both engines: the
container is the one a run without the agent makes, exit codes and output are the same either way, the client
imports neither the docker SDK nor NVML, the container's lease is the client's (an agent killed between create and
start leaves no card held), a held card is the same refusal and --wait waits through the agent, and without an
agent the run takes its own path silently. (Runs through agents and without, on one daemon, never book a card
twice: tests/docker/test_ledger_docker.py's 32 clients.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.ledger import booking, lease, lock
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")


@pytest.fixture
def resident(agent: Agent) -> Iterator[Resident]:
    r = Resident(agent.env)
    yield r
    r.close()


def through(r: Resident, trace: Path | None = None) -> dict[str, str]:
    return {"GPUPIN_AGENT_SOCKET": r.socket, **({"GPUPIN_TRACE": str(trace)} if trace else {})}


def phases(trace: Path) -> list[str]:
    return [line.split()[0] for line in trace.read_text().splitlines()]


def went_through_the_agent(trace: Path) -> bool:
    """The client's marks: it created (the agent did) without reading NVML or loading the SDK itself."""
    marks = phases(trace)
    trace.unlink()
    return "created" in marks and "cards" not in marks and "connected" not in marks


def ha(agent: Agent, extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """hostagent on the simulated host, with `extra` in its environment (the agent's socket)."""
    return subprocess.run(agent.argv(*args), env={**agent.env, **extra}, capture_output=True, text=True, timeout=120)


def inspect(agent: Agent, cid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(agent.sandbox.docker("inspect", cid, check=True).stdout)[0]
    return data


@pytest.mark.per_engine
@pytest.mark.needs("bind-create")  # -v ./data:/data, a folder the daemon creates
def test_the_agent_creates_what_a_run_without_it_creates(agent: Agent, resident: Resident, tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text("FROM_FILE=secret\n")
    env_file.chmod(0o600)
    made = {}
    for way, extra in (("direct", {}), ("agent", through(resident, tmp_path / "trace"))):
        p = agent.popen(
            "run",
            "-d",
            "--name",
            f"{way}-{agent.tag}",
            "--gpu",
            "1",
            "-e",
            "A=1",
            "--env-file",
            str(env_file),
            "-v",
            "./data:/data",
            "--label",
            "team=x",
            "--shm-size",
            "1g",
            "-w",
            "/tmp",
            TEST_IMAGE,
            "sleep",
            "300",
            **extra,
        )
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        made[way] = (out.strip(), p.pid)
        if way == "agent":
            assert went_through_the_agent(tmp_path / "trace")
        agent.sandbox.docker("stop", "-t", "0", out.strip(), check=True)  # card 1 free for the other way
    a, b = (inspect(agent, made[w][0]) for w in ("direct", "agent"))
    for key in ("Env", "Cmd", "Entrypoint", "WorkingDir", "Image"):
        assert a["Config"][key] == b["Config"][key], key
    for key in ("DeviceRequests", "Binds", "ShmSize", "AutoRemove", "Runtime", "Devices"):
        assert a["HostConfig"][key] == b["HostConfig"][key], key
    mine = {lease.OWNER_LABEL, lease.LEASE_LABEL, booking.LABEL}  # whose, and when: each run's own
    a_booked, b_booked = booking.of(a["Config"]["Labels"]), booking.of(b["Config"]["Labels"])
    assert a_booked is not None and b_booked is not None and a_booked.uid == b_booked.uid == 0
    assert {k: v for k, v in a["Config"]["Labels"].items() if k not in mine} == {
        k: v for k, v in b["Config"]["Labels"].items() if k not in mine
    }
    assert "/data" in " ".join(b["HostConfig"]["Binds"]) and "FROM_FILE=secret" in b["Config"]["Env"]
    # The lease is the client's (the process that starts it), never the agent's.
    owner = lease.Owner.parse(b["Config"]["Labels"][lease.OWNER_LABEL])
    assert owner is not None and owner.pid == made["agent"][1] != resident.proc.pid


CASES = {
    "true": (["true"], None, 0, "", ""),
    "false": (["false"], None, 1, "", ""),
    "exit-3": (["sh", "-c", "echo out; echo err >&2; exit 3"], None, 3, "out\n", "err\n"),
    "stdin": (["cat"], "piped in\n", 0, "piped in\n", ""),
    "no-such-command": (["nope"], None, 127, "", "cannot run 'nope'"),
}


@pytest.mark.per_engine
@pytest.mark.parametrize("case", list(CASES))
def test_exit_codes_and_streams_are_the_same_either_way(
    agent: Agent, resident: Resident, tmp_path: Path, case: str
) -> None:
    cmd, stdin, code, out, err = CASES[case]
    seen = []
    for extra in ({}, through(resident, tmp_path / "trace")):
        r = subprocess.run(
            agent.argv("run", "--rm", *(["-i"] if stdin else []), "--gpu", "1", TEST_IMAGE, "--quiet", *cmd),
            env={**agent.env, **extra},
            input=stdin or "",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == code and r.stdout == out and err in r.stderr, r
        seen.append((r.returncode, r.stdout, r.stderr))
    assert seen[0] == seen[1]
    assert went_through_the_agent(tmp_path / "trace")
    assert agent.containers() == []  # --rm: removed, either way


def test_a_start_refused_by_docker_is_the_same_line_either_way(agent: Agent, resident: Resident) -> None:
    lines = []
    for extra in ({}, through(resident)):
        r = ha(agent, extra, "run", "--rm", "--gpu", "1", "--entrypoint", "no-such-entrypoint", TEST_IMAGE)
        errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
        assert r.returncode == 127 and len(errors) == 1 and "Docker could not start" in errors[0], r.stderr
        lines.append(re.sub(r"[0-9a-f]{64}", "ID", errors[0]))
    assert lines[0] == lines[1]
    assert agent.containers() == []  # the failed start removed it


def test_the_client_imports_neither_the_docker_sdk_nor_nvml(agent: Agent, resident: Resident, tmp_path: Path) -> None:
    """Nor what argparse's formatter would load (shutil, and with it zlib, bz2, lzma), nor other commands'."""
    code = (
        "import sys\nfrom gpupin.hostagent.cli import main\n"
        f"rc = main(['run', '--rm', '--label', 'gpupin.test={agent.tag}', '--gpu', '1', '{TEST_IMAGE}', "
        "'--quiet', 'true'])\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in "
        "('docker', 'pynvml', 'requests', 'urllib3', 'http', 'shutil', 'bz2', 'lzma') "
        "or m.startswith(('gpupin.hostagent.queue', 'gpupin.hostagent.compose', 'gpupin.hostagent.serve'))))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**agent.env, **through(resident, tmp_path / "trace")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.strip() == "0 []", r
    assert went_through_the_agent(tmp_path / "trace")


def test_what_reads_the_callers_own_is_parsed_by_the_caller_and_still_goes_through_the_agent(
    agent: Agent, resident: Resident, tmp_path: Path
) -> None:
    """An env file (the caller's, 0600) and `-e KEY` (its environment): the caller reads them with its own rights
    and sends their values, and the agent books and creates."""
    env_file = tmp_path / "env"
    env_file.write_text("FROM_FILE=from-the-file\n")
    env_file.chmod(0o600)
    trace = tmp_path / "trace"
    for words in (["--env-file", str(env_file)], ["-e", "FROM_SHELL"]):
        r = ha(
            agent,
            {**through(resident, trace), "FROM_SHELL": "from-the-shell"},
            "run",
            "--rm",
            "--gpu",
            "1",
            *words,
            TEST_IMAGE,
            "--quiet",
            "sh",
            "-c",
            "echo $FROM_FILE$FROM_SHELL",
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == ("from-the-file" if words[0] == "--env-file" else "from-the-shell")
        assert went_through_the_agent(trace)


@pytest.mark.parametrize(
    "words",
    [
        ["--bogus", "--gpu", "1", TEST_IMAGE],  # argparse's error, with its suggestion
        ["--privileged", "--gpu", "1", TEST_IMAGE],  # refused by name
        ["--memory", "12q", "--gpu", "1", TEST_IMAGE],  # a value's conversion
        [TEST_IMAGE, "--gpu", "1"],  # run's option after the image
        ["-it", "--gpu", "1", TEST_IMAGE],  # -it without a terminal
        ["--help"],
    ],
    ids=["unknown-option", "refused-option", "bad-value", "misplaced", "it-without-tty", "help"],
)
def test_a_usage_error_or_help_is_the_same_through_the_agent(
    agent: Agent, resident: Resident, words: list[str]
) -> None:
    """With an agent or without, the user reads the same: one line and 64, or the help and 0; nothing is
    created."""
    runs = [ha(agent, extra, "run", *words) for extra in ({"GPUPIN_AGENT": "0"}, through(resident))]
    assert runs[0].returncode == runs[1].returncode == (0 if words == ["--help"] else 64), runs
    assert (runs[0].stdout, runs[0].stderr) == (runs[1].stdout, runs[1].stderr)
    assert agent.containers() == []


def test_a_held_card_is_the_same_refusal_and_wait_waits_through_the_agent(agent: Agent, resident: Resident) -> None:
    holder = agent("run", "-d", "--gpu", "1", TEST_IMAGE, "sleep", "300")
    assert holder.returncode == 0, holder.stderr
    refusals = []
    for extra in ({}, through(resident)):
        r = ha(agent, extra, "run", "--rm", "--gpu", "1", TEST_IMAGE)
        errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
        assert r.returncode == 75 and len(errors) == 1 and f"{RTX} is held by" in errors[0], r.stderr
        refusals.append(errors[0])
    assert refusals[0] == refusals[1]
    waiter = agent.popen("run", "--rm", "--gpu", "1", "--wait", "60", TEST_IMAGE, **through(resident))
    assert waiter.stderr is not None
    said = waiter.stderr.readline()  # it waits (said once), asking the agent again: the holder goes now
    assert said.startswith(f"hostagent: waiting: {RTX} is held by"), said
    agent.sandbox.docker("rm", "-f", holder.stdout.strip(), check=True)
    out, err = waiter.communicate(timeout=120)
    assert waiter.returncode == 0 and "waiting:" not in err and "ERROR" not in err, err
    assert f"cuda:0 = {RTX}" in out


def test_an_agent_killed_between_create_and_start_leaves_no_card_held(agent: Agent) -> None:
    r = Resident({**agent.env, "GPUPIN_FAILPOINT": "after-create"})
    try:
        res = ha(agent, through(r), "run", "--rm", "--name", f"orphan-{agent.tag}", "--gpu", "1", TEST_IMAGE)
        errors = [ln for ln in res.stderr.splitlines() if "ERROR:" in ln]
        assert res.returncode == 69 and len(errors) == 1 and "stopped answering" in errors[0], res.stderr
        assert "Traceback" not in res.stderr
        assert r.proc.wait(timeout=10) == -9
        # What it made is the client's, which has ended: it holds nothing ...
        cards = {g["uuid"]: g for g in json.loads(agent("ls", "--json").stdout)["gpus"]}
        assert not cards[RTX]["held"], cards[RTX]
        # ... and with the agent gone, the next run takes its own path, silently, and removes it.
        again = ha(agent, through(r), "run", "--rm", "--name", f"orphan-{agent.tag}", "--gpu", "1", TEST_IMAGE)
        assert again.returncode == 0 and "ERROR" not in again.stderr, again.stderr
        assert f"removed orphan-{agent.tag} " in again.stderr and "never started" in again.stderr
    finally:
        if r.proc.poll() is None:
            r.close()
        shutil.rmtree(r.dir, ignore_errors=True)


def test_an_agent_of_another_daemon_is_passed_by(agent: Agent, tmp_path: Path) -> None:
    r = Resident({**agent.env, "DOCKER_HOST": f"unix://{tmp_path}/elsewhere.sock"})
    try:
        trace = tmp_path / f"trace-{uuid.uuid4().hex[:6]}"
        res = ha(agent, through(r, trace), "run", "--rm", "--gpu", "1", TEST_IMAGE)
        assert res.returncode == 0 and "ERROR" not in res.stderr, res.stderr
        assert "cards" in phases(trace)  # its own path: NVML read here
    finally:
        r.close()


def _lock_containers(agent: Agent) -> list[str]:
    """The names of the ledger lock and of every agent's spares of it, on this daemon."""
    out = agent.sandbox.docker("ps", "-a", "--filter", "label=gpupin.lock", "--format", "{{.Names}}", check=True)
    return sorted(out.stdout.split())


def _created(agent: Agent, name: str) -> float:
    """When the daemon created container `name`, as seconds since the epoch."""
    out = agent.sandbox.docker("inspect", "-f", "{{.Created}}", name, check=True).stdout.strip()
    whole, _, rest = out.rstrip("Z").partition(".")
    fraction = float("0." + (rest or "0"))
    return datetime.fromisoformat(whole).replace(tzinfo=timezone.utc).timestamp() + fraction


def _spare_only(agent: Agent) -> bool:
    """The lock let go and one spare of it made (the agent does both after a run, in the background)."""
    names = _lock_containers(agent)
    return len(names) == 1 and names[0].startswith("gpupin-ledger-spare-")


def _lock_events(agent: Agent, since: str) -> list[str]:
    """`ACTION NAME` of the daemon's container events since `since`, for the lock and its spares."""
    until = str(int(time.time()) + 1)
    out = agent.sandbox.docker(
        "events",
        "--since",
        since,
        "--until",
        until,
        "--filter",
        "type=container",
        "--format",
        '{{.Action}} {{index .Actor.Attributes "name"}}',
        check=True,
    ).stdout
    return [ln for ln in out.splitlines() if " gpupin-ledger-" in ln]


@pytest.mark.per_engine
@pytest.mark.needs("lock-spares")
def test_the_agents_runs_take_the_ledger_lock_by_a_rename(agent: Agent) -> None:
    """After its first run, the agent takes the lock by renaming a spare it made (a fraction of a create and a
    remove on the daemon) from an empty image of its own, so that a run's image is never kept from `docker rmi`;
    it removes its spare when it stops; a spare of an agent killed meanwhile holds nothing and is removed by the
    next look, without a word to its user; a missing image is the same refusal with a spare as without."""
    assert _lock_containers(agent) == []
    r = Resident(agent.env)
    try:
        since = f"{time.time():.6f}"  # this test's events only (an earlier test's lock was made a moment ago)
        for _ in range(3):  # each after the last one's spare is made (in the background, after the run)
            res = ha(agent, through(r), "run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "true")
            assert res.returncode == 0 and "ERROR" not in res.stderr, res.stderr
            wait_for(lambda: _spare_only(agent), 10, "the agent's spare")
        [spare] = _lock_containers(agent)
        assert spare.startswith("gpupin-ledger-spare-")
        events = _lock_events(agent, since)
        assert [e for e in events if e == "create gpupin-ledger-lock"] == ["create gpupin-ledger-lock"], events
        assert events.count("rename gpupin-ledger-lock") >= 2, events  # the second and third runs' lock
        cards = {g["uuid"]: g for g in json.loads(agent("ls", "--json").stdout)["gpus"]}
        assert not cards[RTX]["held"]  # a spare holds nothing
        # The run's image is free to go as soon as the run ends (an image of its own: one tag, one name).
        mine = f"{TEST_IMAGE.split(':')[0]}:rmi-{agent.tag}"
        base = agent.sandbox.docker("create", TEST_IMAGE, check=True).stdout.strip()
        agent.sandbox.docker("commit", "--change", f"LABEL gpupin.test.rmi={agent.tag}", base, mine, check=True)
        agent.sandbox.docker("rm", base, check=True)
        try:
            res = ha(agent, through(r), "run", "--rm", "--gpu", "1", mine, "--quiet", "true")
            assert res.returncode == 0, res.stderr
            gone = agent.sandbox.docker("rmi", mine)
            assert gone.returncode == 0, gone.stderr
        finally:
            agent.sandbox.docker("rmi", "--force", mine)
        # An image that is not there, with a spare to take the lock: what a run without the agent says.
        lines = []
        for extra in (through(r), {"GPUPIN_AGENT": "0"}):
            wait_for(lambda: _spare_only(agent), 10, "the agent's spare")
            res = ha(agent, extra, "run", "--rm", "--gpu", "1", f"gpupin-no-such-image:{agent.tag}")
            assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
            lines.append((res.returncode, [ln for ln in res.stderr.splitlines() if "ERROR" in ln]))
        assert lines[0] == lines[1]
    finally:
        r.close()
    assert _lock_containers(agent) == []  # its spare went with it
    # Killed, it leaves its spare: the next look of anyone removes it, and says nothing of it.
    r = Resident(agent.env)
    try:
        res = ha(agent, through(r), "run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "true")
        assert res.returncode == 0, res.stderr
        wait_for(lambda: _spare_only(agent), 10, "the agent's spare")
        r.proc.kill()
        r.proc.wait(timeout=10)
    finally:
        shutil.rmtree(r.dir, ignore_errors=True)
    res = ha(agent, {"GPUPIN_AGENT": "0"}, "run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "true")
    assert res.returncode == 0 and "spare" not in res.stderr and "removed" not in res.stderr, res.stderr
    assert _lock_containers(agent) == []


@pytest.mark.needs("lock-spares")
def test_a_spare_that_grows_old_is_replaced_while_runs_come_and_an_idle_agent_keeps_none(agent: Agent) -> None:
    """A spare serves runs while it is young (StandbyLocks.FRESH_S); when it grows old it is replaced then, not after a
    run (the daemon's create would fall in that run's start), while runs come; an agent left idle keeps none."""
    assert _lock_containers(agent) == []
    r = Resident(agent.env)
    try:
        for _ in range(2):  # the first run makes the spare, the second takes it and renames it back
            res = ha(agent, through(r), "run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "true")
            assert res.returncode == 0 and "ERROR" not in res.stderr, res.stderr
            wait_for(lambda: _spare_only(agent), 10, "the agent's spare")
        [first] = _lock_containers(agent)
        made = _created(agent, first)  # the daemon's clock: noticing the spare late under load shortens no age
        wait_for(lambda: _lock_containers(agent) not in ([first], []), lock.StandbyLocks.FRESH_S + 10, "a new spare")
        assert time.time() - made > lock.StandbyLocks.FRESH_S - 2  # not before the first grew old
        [second] = _lock_containers(agent)
        assert second.startswith("gpupin-ledger-spare-") and second != first
        # No run since: the new one goes when it grows old, and none replaces it.
        wait_for(lambda: _lock_containers(agent) == [], lock.StandbyLocks.FRESH_S + 10, "the idle agent's spare to go")
        time.sleep(2)
        assert _lock_containers(agent) == []
        res = ha(agent, through(r), "run", "--rm", "--gpu", "1", TEST_IMAGE, "--quiet", "true")
        assert res.returncode == 0 and "ERROR" not in res.stderr, res.stderr  # the lock by a create again
    finally:
        r.close()
