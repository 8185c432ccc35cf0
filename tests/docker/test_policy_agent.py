"""The host's policy in a real agent (docs/policy.md), on the sandboxed daemon, with real uids under setpriv: the
policy read at start and on SIGHUP (a corrupt file keeps the last good one, and says so), bookings that end as
`docker stop` ends them, `hostagent extend` by the owner alone, and quotas charged to the uid the kernel names."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.engine import created_time
from tests.docker.test_compose import ComposeRun
from tests.docker.test_hostile_agent import AGENT_GID, post, run_body, sandbox_daemon, serve
from tests.support.host import hostagent
from tests.support.record import intervals
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.users import as_other, reach_env, setpriv
from tests.support.wait import wait_for

ALICE, BOB = 5002, 5005  # both in the agent's group and the daemon's

POLICY = """
[booking]
default = "1h"
max = "2h"
[quota]
cards = 1
"""


class Lab:
    """A policy file, an agent that reads it, and two users who may use both the agent and the daemon."""

    def __init__(self, agent: Agent, tmp: Path, text: str = POLICY) -> None:
        self.agent = agent
        self.file = tmp / "policy.toml"
        self.file.write_text(text)
        self.resident: Resident = serve(agent, "--policy", str(self.file))
        docker_gid = os.stat(agent.sandbox.host[len("unix://") :]).st_gid
        self.users = {uid: setpriv(uid, AGENT_GID, docker_gid) for uid in (ALICE, BOB)}

    def as_user(self, uid: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        env = reach_env({**self.agent.env, "GPUPIN_AGENT_SOCKET": self.resident.socket})
        return subprocess.run(
            as_other(self.users[uid], self.agent.argv(*args)), env=env, capture_output=True, text=True, timeout=timeout
        )

    def holder(self, name: str) -> dict[str, Any] | None:
        for g in self.resident.ls()["gpus"]:
            for h in g["holders"]:
                if h["name"] == name and h["holds"]:
                    found: dict[str, Any] = h
                    return found
        return None

    def wait_holder(self, name: str, what: str = "the agent to see the container") -> dict[str, Any]:
        h = wait_for(lambda: self.holder(name), 20, what)
        assert h is not None
        return h

    def policy(self) -> dict[str, Any]:
        status, body, _ = self.resident.get("/api/agent")
        assert status == 200
        got: dict[str, Any] = json.loads(body)["policy"]
        return got


@pytest.fixture
def lab(agent: Agent, tmp_path: Path) -> Iterator[Lab]:
    os.chmod(tmp_path, 0o755)
    lab = Lab(agent, tmp_path)
    yield lab
    lab.resident.close()


def test_the_policy_is_read_at_start_and_on_sighup_and_a_bad_one_is_not_taken(lab: Lab) -> None:
    assert lab.policy()["error"] is None
    assert lab.policy()["summary"] == "bookings default 1h, max 2h; quota cards 1"
    lab.file.write_text("[quota]\ncards = 'two'\n[booking]\nmax = '2 days'\n")
    lab.resident.proc.send_signal(signal.SIGHUP)
    got = wait_for(lambda: lab.policy()["error"], 10, "the agent to read the bad file")
    assert got == [
        f"{lab.file}:2: quota.cards: must be a whole number, 0 or more, not 'two'",
        f"{lab.file}:4: booking.max: '2 days' is not a duration (e.g. 45s, 90m, 4h, 2d, 1w, 1h30m)",
    ]
    assert lab.policy()["summary"] == "bookings default 1h, max 2h; quota cards 1"  # the last good one, kept
    # and still enforced: a --for past the kept maximum is refused
    r = lab.as_user(ALICE, "run", "--for", "3h", "--gpu", "1", TEST_IMAGE, "true")
    assert r.returncode == 64 and "longer than the longest booking the policy gives uid 5002, 2h" in r.stderr
    lab.file.write_text("[quota]\ncards = 2\n")
    lab.resident.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: lab.policy()["error"] is None, 10, "the agent to read the good file")
    assert lab.policy()["summary"] == "quota cards 2"
    lab.file.unlink()
    lab.resident.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: lab.policy()["summary"] == "nothing enforced", 10, "the agent to see the file gone")
    code, _, log = lab.resident.stop()
    assert code == 0
    assert f"policy: {lab.file}:2: quota.cards: must be a whole number" in log
    assert re.search(r"has 2 mistake\(s\): the agent keeps the policy it read at [0-9:]{8}", log), log
    assert f"policy: {lab.file} is gone: nothing is enforced" in log


def test_a_booking_ends_as_docker_stop_ends_it(lab: Lab) -> None:
    """--for 4s: the agent sends the container's own stop signal (USR1 here) within 5 s of the end, and the card
    is free again; the lateness is measured."""
    name = f"booked-{lab.agent.tag}"
    script = 'trap "echo stopped by USR1; exit 7" USR1; while :; do sleep 0.1; done'
    r = lab.as_user(
        ALICE,
        "run", "-d", "--name", name, "--for", "4s", "--stop-signal", "USR1", "--stop-timeout", "3",
        "--gpu", "1", TEST_IMAGE, "sh", "-c", script,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    h = lab.wait_holder(name)
    b = h["booking"]
    assert b["uid"] == ALICE and b["until"] - b["since"] == 4 and 0 <= b["left_s"] <= 4
    wait_for(lambda: lab.holder(name) is None, 30, "the booking to end")
    state = json.loads(lab.agent.sandbox.docker("inspect", name, check=True).stdout)[0]["State"]
    assert state["ExitCode"] == 7  # its own stop signal, within its grace: docker stop's way
    logs = lab.agent.sandbox.docker("logs", name, check=True).stdout
    assert "stopped by USR1" in logs
    code, _, log = lab.resident.stop()
    assert code == 0, log
    late = [float(x) for x in re.findall(r"booking ended: stopping .*, ([0-9.]+)s after its end", log)]
    assert len(late) == 1 and late[0] < 5, log
    print(f"expiry lateness: {late[0]:.2f}s")  # the report's figure (-s)


def test_only_the_owner_or_root_extends_within_the_maximum_and_a_restart_keeps_it(lab: Lab) -> None:
    name = f"ext-{lab.agent.tag}"
    r = lab.as_user(ALICE, "run", "-d", "--name", name, "--gpu", "1", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    h = lab.wait_holder(name)
    until = h["booking"]["until"]
    assert until - h["booking"]["since"] == 3600  # the policy's default
    ls = lab.agent("ls", GPUPIN_AGENT_SOCKET=lab.resident.socket)
    assert re.search(rf"{name} .*ends in (59m|1h)$", ls.stdout, re.M), ls.stdout
    # another uid, with every right on the socket and the daemon, may not extend it
    other = lab.as_user(BOB, "extend", name, "30m")
    assert other.returncode == 64
    assert other.stderr.strip() == (
        f"hostagent: ERROR: {name} is booked by uid {ALICE}: only its owner or root extends it. "
        "HINT: extend your own bookings"
    )
    # a raw request naming another uid changes nothing: the socket names the caller
    status, answer = post(
        lab.users[BOB], lab.resident.socket, "/api/extend", {"container": name, "seconds": 60, "uid": ALICE}
    )
    assert status == 400 and "only its owner or root" in answer["error"]
    # the owner, within the maximum (2h from the start)
    mine = lab.as_user(ALICE, "extend", name, "30m", "--json")
    assert mine.returncode == 0, mine.stderr
    assert json.loads(mine.stdout)["until"] == until + 1800
    past = lab.as_user(ALICE, "extend", name, "1h")
    assert past.returncode == 64 and "past the longest the policy gives uid 5002, 2h (booking.max)" in past.stderr
    assert "extend by at most 30m" in past.stderr
    # root has no maximum
    root = lab.agent("extend", name, "1d", GPUPIN_AGENT_SOCKET=lab.resident.socket)
    assert root.returncode == 0, root.stderr
    extended = until + 1800 + 86400
    # the extension survives a crash of the agent
    lab.resident.kill()
    lab.resident.restart()
    h = lab.wait_holder(name, "the restarted agent to see the container")
    assert h["booking"]["until"] == extended
    # and `hostagent ls` without the agent reads it too
    direct = lab.agent("ls", "--json", GPUPIN_AGENT_SOCKET=lab.resident.socket)
    held = [x for g in json.loads(direct.stdout)["gpus"] for x in g["holders"] if x["name"] == name]
    assert held and held[0]["booking"]["until"] == extended


def test_quotas_charge_the_caller_the_kernel_names(lab: Lab) -> None:
    first = f"q1-{lab.agent.tag}"
    r = lab.as_user(ALICE, "run", "-d", "--name", first, "--for", "90m", "--gpu", "1", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    lab.wait_holder(first)
    over = lab.as_user(ALICE, "run", "--gpu", "0", TEST_IMAGE, "true")  # card 0 is free (card 2 runs a process)
    assert over.returncode == 75, over.stderr
    assert over.stderr.startswith(
        f"hostagent: ERROR: quota cards: uid {ALICE} holds 1 of 1 card(s) at once, and asks 1 more; the first frees "
        f"when {first} ends, in 1h29m"
    ), over.stderr
    never = lab.as_user(ALICE, "run", "--count", "2", TEST_IMAGE, "true")
    assert never.returncode == 64 and "at most 1 at once (quota.cards)" in never.stderr
    # a forged owner in the request is refused; the booking label cannot be set by hand
    body = run_body(lab.agent, sandbox_daemon(lab.agent))
    body["request"]["options"]["labels"].append(f"gpupin.booking=uid={BOB} since=0")
    status, answer = post(lab.users[ALICE], lab.resident.socket, "/api/run", body)
    assert status == 400 and answer["exit"] == 64 and "hostagent writes gpupin.booking itself" in answer["error"]
    # a name in the request is not who asks: alice's quota is charged, whatever it says
    body = run_body(lab.agent, sandbox_daemon(lab.agent))
    body.update(user="bob", uid=BOB)
    body["request"]["gpus"] = ["0"]
    status, answer = post(lab.users[ALICE], lab.resident.socket, "/api/run", body)
    assert status == 409 and answer["exit"] == 75 and f"uid {ALICE} holds 1 of 1" in answer["error"]
    # bob's quota is his own
    second = f"q2-{lab.agent.tag}"
    r = lab.as_user(BOB, "run", "-d", "--name", second, "--gpu", "3", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    assert len(lab.agent.containers("running")) == 2


def test_the_gpu_hours_of_a_finished_run_are_counted_from_the_record(agent: Agent, tmp_path: Path) -> None:
    """A user who used her GPU-hours and stopped holds nothing, yet is refused (75): the agent's record has her
    finished interval, and the line says when that use leaves the 24-hour window."""
    os.chmod(tmp_path, 0o755)
    lab = Lab(agent, tmp_path, "[quota]\ngpu_hours_per_day = 0.002\n")  # 7.2 GPU-seconds
    try:
        first = lab.as_user(ALICE, "run", "--gpu", "1", TEST_IMAGE, "sleep", "8")
        assert first.returncode == 0, first.stderr
        db = lab.resident.dir / "record.db"
        rows = wait_for(lambda: [r for r in intervals(db) if r["end"] is not None], 30, "the interval closed")
        assert rows[0]["uid"] == ALICE and rows[0]["end"] - rows[0]["start"] > 7.2
        assert not agent.containers("running")  # nothing held now
        again = lab.as_user(ALICE, "run", "--gpu", "0", TEST_IMAGE, "true")
        assert again.returncode == 75, again.stderr
        assert re.fullmatch(
            rf"hostagent: ERROR: quota gpu_hours_per_day: uid {ALICE}(?: \([^)]*\))? used 0\.0 of 0\.002 GPU-hours "
            r"in the last 24 hours; it frees in 23h59m, at [0-9-]{10} [0-9:]{8}\. HINT: wait for it \(--wait\), "
            r"or ask the host's owner\n",
            again.stderr,
        ), again.stderr
        assert len(agent.containers()) == 1  # nothing created for the refused run
        bob = lab.as_user(BOB, "run", "--gpu", "0", TEST_IMAGE, "true")  # her use is not his
        assert bob.returncode == 0, bob.stderr
    finally:
        lab.resident.close()


@pytest.mark.per_engine
@pytest.mark.needs("compose")
def test_a_compose_services_booking_ends_from_its_own_start(agent: Agent, tmp_path: Path) -> None:
    """x-gpupin: {for: 4s}, rendered as a label that each engine's compose (1.29, v2) passes on: the agent books
    the container from its own start and stops it as `docker stop` does; past the policy's maximum render refuses."""
    os.chmod(tmp_path, 0o755)
    lab = Lab(agent, tmp_path, '[booking]\nmax = "20s"\n')
    src = tmp_path / "train.yml"
    service = (
        "services:\n  train:\n    image: %s\n    command: [sleep, '600']\n    stop_grace_period: 1s\n"
        "    x-gpupin: {gpus: ['1'], for: %s}\n"
    )
    out = tmp_path / "train.pinned.yml"
    try:
        src.write_text(service % (TEST_IMAGE, "30s"))
        host, policy = agent.sandbox.host, str(lab.file)
        over = hostagent("compose", "render", str(src), "-o", str(out), DOCKER_HOST=host, GPUPIN_POLICY=policy)
        assert over.returncode == 64 and not out.exists(), over.stderr
        assert "x-gpupin.for 30s is longer than the longest booking the policy gives everyone" in over.stderr
        src.write_text(service % (TEST_IMAGE, "4s"))
        r = hostagent("compose", "render", str(src), "-o", str(out), DOCKER_HOST=host, GPUPIN_POLICY=policy)
        assert r.returncode == 0, r.stderr
        run = ComposeRun(agent.sandbox, out)
        try:
            up = run.compose("up", "-d")
            assert up.returncode == 0, up.stdout + up.stderr
            cid = run.compose("ps", "-a", "-q", "train").stdout.strip()
            h = lab.wait_holder(json.loads(agent.sandbox.docker("inspect", cid, check=True).stdout)[0]["Name"][1:])
            b = h["booking"]
            assert b["uid"] is None and b["until"] - b["since"] == 4 and 0 <= b["left_s"] <= 4

            def ended() -> dict[str, Any] | None:
                state: dict[str, Any] = json.loads(agent.sandbox.docker("inspect", cid).stdout)[0]["State"]
                return None if state["Running"] else state

            state = wait_for(ended, 30, "the booking to end")
            assert state is not None
            started, finished = (created_time(state[k]) for k in ("StartedAt", "FinishedAt"))
            assert 4 <= finished - started < 4 + 5 + 2, state  # its end, then its 1 s grace (sleep ignores SIGTERM)
        finally:
            run.down()
        code, _, log = lab.resident.stop()
        assert code == 0, log
        late = [float(x) for x in re.findall(r"booking ended: stopping .*, ([0-9.]+)s after its end", log)]
        assert len(late) == 1 and late[0] < 5, log
    finally:
        lab.resident.close()


def test_a_label_booking_is_cut_to_the_maximum_and_no_user_owns_it(lab: Lab) -> None:
    """A user with the daemon's socket labels a container gpupin.booking.for=30d (or names a uid in it): the agent
    books it the policy's maximum for everyone, no user's quota counts it, and only root extends it."""
    lab.file.write_text('[booking]\nmax = "6s"\n[quota]\ncards = 1\n')  # no default
    lab.resident.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "max 6s" in lab.policy()["summary"], 10, "the agent to read the policy")
    name = f"label-{lab.agent.tag}"
    docker = [*lab.users[ALICE], "docker", "-H", lab.agent.sandbox.host]
    r = subprocess.run(
        [*docker, "run", "-d", "--name", name, "--label", f"gpupin.test={lab.agent.tag}",
         "--label", "gpupin.booking.for=30d uid=0", "--gpus", "device=1", TEST_IMAGE, "sleep", "600"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    h = lab.wait_holder(name)
    assert (
        h["booking"]["uid"] is None and h["booking"]["until"] - h["booking"]["since"] == 6
    )  # no duration, no default: the max
    # no one's: alice's quota of one card is not used by it, and she may not extend it
    mine = lab.as_user(ALICE, "run", "-d", "--gpu", "0", TEST_IMAGE, "sleep", "600")
    assert mine.returncode == 0, mine.stderr
    ext = lab.as_user(ALICE, "extend", name, "1m")
    assert ext.returncode == 64 and "which names no owner: only root extends it" in ext.stderr
    wait_for(lambda: lab.holder(name) is None, 30, "the cut booking to end")
    code, _, log = lab.resident.stop()
    assert code == 0, log
    assert f"booking: {name} (" in log and "asks no duration by its label: booked 6s" in log


def test_the_queue_gives_no_turn_to_a_waiter_over_its_quota(lab: Lab) -> None:
    first = f"w1-{lab.agent.tag}"
    r = lab.as_user(ALICE, "run", "-d", "--name", first, "--gpu", "1", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    lab.wait_holder(first)
    env = reach_env({**lab.agent.env, "GPUPIN_AGENT_SOCKET": lab.resident.socket})
    waiter = subprocess.Popen(
        as_other(lab.users[ALICE], lab.agent.argv("run", "--wait", "--gpu", "0", TEST_IMAGE, "true")),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: lab.resident.get("/api/queue")[1].count(b'"uid"') == 1, 20, "the waiter to queue")
        time.sleep(3)  # card 0 is free all along: only the quota holds it back
        assert waiter.poll() is None
        queue = json.loads(lab.resident.get("/api/queue")[1])
        assert [w["turn"] for w in queue["waiters"]] == [False]
        lab.agent.sandbox.docker("stop", "-t", "0", first, check=True)
        _, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()


def test_a_run_without_the_agent_keeps_the_maximum(agent: Agent, tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpupin-policy-"))  # where another user can read it (tmp_path is root's)
    os.chmod(folder, 0o755)
    f = folder / "policy.toml"
    f.write_text(POLICY)
    r = agent(
        "run", "--for", "3h", "--gpu", "1", TEST_IMAGE, "true", GPUPIN_AGENT="0", GPUPIN_POLICY=str(f)
    )  # root: no maximum
    assert r.returncode == 0, r.stderr
    docker_gid = os.stat(agent.sandbox.host[len("unix://") :]).st_gid
    r = subprocess.run(
        as_other(setpriv(ALICE, docker_gid), agent.argv("run", "--for", "3h", "--gpu", "1", TEST_IMAGE, "true")),
        env=reach_env({**agent.env, "GPUPIN_AGENT": "0", "GPUPIN_POLICY": str(f)}),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 64, r.stderr
    assert "--for 3h is longer than the longest booking the policy gives uid 5002, 2h (booking.max)" in r.stderr
    assert agent.containers() != [] and all("Exited" in c["Status"] for c in agent.containers())
    # the past is the agent's record: a run of its own counts only what is held now, and says so
    f.write_text("[quota]\ngpu_hours_per_day = 1\n")
    r = subprocess.run(
        as_other(setpriv(ALICE, docker_gid), agent.argv("run", "--gpu", "1", TEST_IMAGE, "true")),
        env=reach_env({**agent.env, "GPUPIN_AGENT": "0", "GPUPIN_POLICY": str(f)}),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "warning: the GPU-hour quotas count only what you hold now: past use is counted through the agent" in (
        r.stderr
    )
    shutil.rmtree(folder)


def test_cards_past_the_quota_are_64_however_many_cards_are_free(lab: Lab) -> None:
    """More cards than the quota ever allows is 64 whether the cards are free or held (it was 75, "wait with
    --wait", while too few were free), through the agent and without it."""
    for card in ("0", "1"):  # root holds two cards (no quota binds root); card 2 runs a process: card 3 alone is free
        r = lab.agent("run", "-d", "--name", f"root{card}-{lab.agent.tag}", "--gpu", card, TEST_IMAGE, "sleep", "600")
        assert r.returncode == 0, r.stderr
    lab.wait_holder(f"root1-{lab.agent.tag}")
    folder = Path(tempfile.mkdtemp(prefix="gpupin-policy-"))  # where alice can read it (tmp_path is root's)
    os.chmod(folder, 0o755)
    (folder / "policy.toml").write_text(POLICY)
    alone = reach_env({**lab.agent.env, "GPUPIN_AGENT": "0", "GPUPIN_POLICY": str(folder / "policy.toml")})
    for words in (["--count", "2"], ["--gpu", "0", "--gpu", "3"], ["--wait", "5m", "--count", "2"]):
        through = lab.as_user(ALICE, "run", *words, TEST_IMAGE, "true")
        without = subprocess.run(
            as_other(lab.users[ALICE], lab.agent.argv("run", *words, TEST_IMAGE, "true")),
            env=alone, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        for r in (through, without):
            assert r.returncode == 64 and r.stderr.count("\n") == 1, (words, r.stderr)
            assert f"2 card(s) asked, but the policy's quota lets uid {ALICE} hold at most 1 at once" in r.stderr
    assert len(lab.agent.containers()) == 2  # nothing made for alice
    shutil.rmtree(folder)


def test_a_waiter_over_its_quota_is_told_so(lab: Lab) -> None:
    """Behind another waiter, a waiter that its own quota holds back is told that, not only its position."""
    first = f"h1-{lab.agent.tag}"
    r = lab.as_user(ALICE, "run", "-d", "--name", first, "--gpu", "1", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    lab.wait_holder(first)
    env = reach_env({**lab.agent.env, "GPUPIN_AGENT_SOCKET": lab.resident.socket})
    waiters = []
    try:
        for uid, words in ((BOB, ["--gpu", "1"]), (ALICE, ["--count", "1"])):  # bob first: alice is not clear
            waiters.append(
                subprocess.Popen(
                    as_other(lab.users[uid], lab.agent.argv("run", "--wait", *words, TEST_IMAGE, "true")),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            queued = len(waiters)
            wait_for(lambda: lab.resident.get("/api/queue")[1].count(b'"uid"') == queued, 20, "the waiter to queue")  # noqa: B023
        time.sleep(2)
        lab.agent.sandbox.docker("stop", "-t", "0", first, check=True)
        outs = [w.communicate(timeout=60) for w in waiters]
        assert [w.returncode for w in waiters] == [0, 0], outs
        alice = outs[1][1]
        assert (
            "waiting in the queue of the agent at" in alice
            and "position 2 of 2, over your quota: quota cards: " in (alice)
        ), alice
        assert f"uid {ALICE} holds 1 of 1 card(s) at once" in alice, alice
    finally:
        for w in waiters:
            if w.poll() is None:
                w.kill()
                w.communicate()
