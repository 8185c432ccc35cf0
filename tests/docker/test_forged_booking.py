"""Ownership the agent can prove (issue 33, finding 2), on the sandboxed daemon, with real uids under setpriv: a
member of the docker group writes any label with a plain `docker run`, so a `gpupin.booking` label on a container
the agent did not create is a claim. It is counted for no one's quota (the victim it names still books), charged
to no one in the record, exempts nothing from the idle rule, is shown `unverified`, and its booking still ends by
the policy for everyone, from the container's own start. A run without the agent writes such a claim too."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupin.hostagent.engine import created_time
from tests.docker.test_policy_agent import ALICE, BOB, Lab
from tests.docker.test_serve_idle import TRAPPED, run_as, serve, state
from tests.support.record import intervals
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.users import as_other, reach_env, setpriv
from tests.support.wait import wait_for

VICTIM = ALICE  # uid 5002: in the agent's group and the daemon's
FORGER = BOB  # uid 5005: the same groups; forges with the docker CLI alone


@pytest.fixture
def lab(agent: Agent, tmp_path: Path) -> Iterator[Lab]:
    os.chmod(tmp_path, 0o755)
    lab = Lab(agent, tmp_path, '[booking]\ndefault = "1h"\nmax = "2h"\n[quota]\ncards = 1\n')
    yield lab
    lab.resident.close()


def forge(lab: Lab, name: str, gpu: str, booking: str, *labels: str) -> None:
    """`docker run -d` as FORGER, with the booking label (and others) written by hand."""
    argv = [*lab.users[FORGER], "docker", "-H", lab.agent.sandbox.host, "run", "-d", "--name", name]
    argv += ["--label", f"gpupin.test={lab.agent.tag}", "--label", f"gpupin.booking={booking}"]
    for label in labels:
        argv += ["--label", label]
    argv += ["--gpus", f"device={gpu}", TEST_IMAGE, *TRAPPED]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def held_by(view: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [h for g in view["gpus"] for h in g["holders"] if h["name"] == name]
    assert found, name
    return found[0]


def ended(agent: Agent, name: str) -> dict[str, Any]:
    """The container's State once it no longer runs (30 s at most)."""

    def stopped() -> dict[str, Any] | None:
        st = state(agent, name)
        return None if st["Running"] else st

    st = wait_for(stopped, 30, f"{name} to stop")
    assert st is not None
    return st


def test_a_forged_booking_counts_for_no_one_and_the_victim_books(lab: Lab) -> None:
    """FORGER labels a container `uid=VICTIM`: VICTIM's run through the agent then books (on the agent of
    0.3.0 it was refused, 75: "quota cards: uid 5002 holds 1 of 1"), `ls` names her as the owner of her own
    container and the forged one `unverified`, she may not extend it, and the record charges it to no one."""
    forged, mine = f"forged-{lab.agent.tag}", f"mine-{lab.agent.tag}"
    now = int(time.time())
    forge(lab, forged, "1", f"uid={VICTIM} since={now} until={now + 3600}")
    h = lab.wait_holder(forged)
    r = lab.as_user(VICTIM, "run", "-d", "--name", mine, "--gpu", "0", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    assert h["booking"]["uid"] == VICTIM  # the label, as it is written
    assert h["owner"] == {"uid": None, "name": None, "verified": False, "claimed_uid": VICTIM}
    own = lab.wait_holder(mine)["owner"]
    assert own["uid"] == VICTIM and own["verified"] is True and own["claimed_uid"] is None
    # her quota of one card is hers alone: a second run of hers is refused, naming only her own container
    again = lab.as_user(VICTIM, "run", "--gpu", "3", TEST_IMAGE, "true")
    assert again.returncode == 75, again.stderr
    assert f"holds 1 of 1 card(s) at once, and asks 1 more; the first frees when {mine} ends" in again.stderr
    # `ls` of hers (without the agent: the owners it keeps, read from its folder) and the agent's page
    ls = lab.as_user(VICTIM, "ls")
    assert ls.returncode == 0, ls.stderr
    mine_line = next(x for x in ls.stdout.splitlines() if mine in x)
    forged_line = next(x for x in ls.stdout.splitlines() if forged in x)
    assert re.search(rf"running  {re.escape(own['name'])}  ", mine_line), mine_line
    assert f"running  unverified (claims uid {VICTIM})" in forged_line, forged_line
    listed = json.loads(lab.as_user(VICTIM, "ls", "--json").stdout)
    assert held_by(listed, mine)["owner"] == own and held_by(listed, forged)["owner"]["verified"] is False
    ext = lab.as_user(VICTIM, "extend", forged, "10m")
    assert ext.returncode == 64, ext.stderr
    assert f"label names uid {VICTIM}, but the agent did not create it: its owner is unverified" in ext.stderr
    assert lab.as_user(VICTIM, "extend", mine, "10m").returncode == 0
    # the record: her interval is hers, the forged one no one's
    db = lab.resident.dir / "record.db"
    rows = wait_for(
        lambda: {r["container_name"]: r for r in intervals(db)} if len(intervals(db)) >= 2 else None, 30, "rows"
    )
    assert rows is not None
    assert rows[mine]["uid"] == VICTIM and rows[forged]["uid"] is None, rows


def test_a_forged_booking_ends_by_the_policy_for_everyone(agent: Agent, tmp_path: Path) -> None:
    """A claim with no end books the policy's default, and one past the maximum (a run without the agent, `--for
    3h` where the run could read no maximum) is cut to it, both from the container's own start; the agent stops
    them as it stops any booking. On the agent of 0.3.0 both ran on."""
    os.chmod(tmp_path, 0o755)
    lab = Lab(agent, tmp_path, '[booking]\ndefault = "4s"\nmax = "8s"\n')
    try:
        endless, direct = f"endless-{agent.tag}", f"direct-{agent.tag}"
        forge(lab, endless, "1", f"uid={VICTIM} since={int(time.time())}")
        docker_gid = os.stat(agent.sandbox.host[len("unix://") :]).st_gid
        env = reach_env({**agent.env, "GPUPIN_AGENT": "0", "GPUPIN_POLICY": str(tmp_path / "none.toml")})
        argv = agent.argv("run", "-d", "--name", direct, "--for", "3h", "--gpu", "3", TEST_IMAGE, *TRAPPED)
        r = subprocess.run(
            as_other(setpriv(VICTIM, docker_gid), argv), env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr

        def started(name: str) -> dict[str, Any] | None:
            h = lab.holder(name)  # a holder seen between its create and its start has no start yet
            return h if h is not None and h.get("started") else None

        seen: dict[str, dict[str, Any]] = {}
        for name in (endless, direct):
            h = wait_for(functools.partial(started, name), 20, f"{name} seen started")
            assert h is not None
            seen[name] = h
        mine = lab.as_user(VICTIM, "ls", "--json")  # `ls` without the agent: the ends the agent gave them
        assert mine.returncode == 0, mine.stderr
        listed = json.loads(mine.stdout)
        for name, length in ((endless, 4), (direct, 8)):
            st = ended(agent, name)
            ran = created_time(st["FinishedAt"]) - created_time(st["StartedAt"])
            assert length <= ran < length + 5 and st["ExitCode"] == 0, (name, st)  # its stop signal, within 5 s
            h = seen[name]
            assert h["owner"]["verified"] is False and h["owner"]["claimed_uid"] == VICTIM
            assert abs(h["booking"]["until"] - (created_time(h["started"]) + length)) <= 1, (name, h["booking"])
            assert held_by(listed, name)["booking"]["until"] == h["booking"]["until"]
        code, _, log = lab.resident.stop()
        assert code == 0, log
        assert f"booking: {endless} (" in log and f"claims uid {VICTIM} (unverified" in log
        assert "asks no duration by its label: booked 4s" in log, log
        assert re.search(r"asks (3h|2h59m) by its label: booked 8s", log), log  # from its start, after its create
    finally:
        lab.resident.close()


def test_a_forged_root_exemption_is_stopped_when_idle(agent: Agent, tmp_path: Path) -> None:
    """FORGER labels an idle container `uid=0` and `gpupin.idle=exempt` (root may exempt): it is warned and
    stopped as any idle holder (on the agent of 0.3.0 it was never warned nor stopped), while root's own exempt
    run through the agent is kept."""
    policy = tmp_path / "policy.toml"
    policy.write_text('[idle]\nafter = "2s"\naction = "stop"\ngrace = "3s"\nexempt = ["root"]\n')
    os.chmod(tmp_path, 0o755)
    r = serve(agent, {**agent.env, "GPUPIN_POLICY": str(policy)})
    try:
        lab_users = {FORGER: setpriv(FORGER, 5100, os.stat(agent.sandbox.host[len("unix://") :]).st_gid)}
        forged, kept = f"forged-exempt-{uuid.uuid4().hex[:8]}", f"root-exempt-{uuid.uuid4().hex[:8]}"
        argv = [*lab_users[FORGER], "docker", "-H", agent.sandbox.host, "run", "-d", "--name", forged, "--label"]
        argv += [f"gpupin.test={agent.tag}", "--label", f"gpupin.booking=uid=0 since={int(time.time())}"]
        argv += ["--label", "gpupin.idle=exempt", "--gpus", "device=1", TEST_IMAGE, *TRAPPED]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        own = run_as(agent, None, kept, "0", "--label", "gpupin.idle=exempt")
        assert own.returncode == 0, own.stderr
        st = ended(agent, forged)
        assert st["ExitCode"] == 0, st  # by its stop signal
        assert state(agent, kept)["Running"]
        code, _, log = r.stop()
        assert code == 0, log
        assert re.search(rf"idle: warned {forged} \(", log) and re.search(rf"idle: stopped {forged} \(", log), log
        assert f"idle: warned {kept}" not in log
    finally:
        r.close()
        agent.env.pop("GPUPIN_AGENT_SOCKET", None)


def test_the_owners_survive_a_restart_and_are_the_agents_alone(lab: Lab) -> None:
    """The owners are kept in the agent's folder (root's, written by the agent alone): a restarted agent still
    proves them, and a file of owners that another user could have written proves nothing."""
    mine = f"kept-{lab.agent.tag}"
    r = lab.as_user(VICTIM, "run", "-d", "--name", mine, "--gpu", "0", TEST_IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    assert lab.wait_holder(mine)["owner"]["verified"] is True
    file = lab.resident.dir / "owners.json"
    st = file.stat()
    assert st.st_uid == 0 and not st.st_mode & 0o022, oct(st.st_mode)
    lab.resident.kill()  # a crash: nothing saved at stop
    lab.resident.restart()
    h = wait_for(lambda: (lab.holder(mine) or {}).get("owner"), 30, "the restarted agent's view")
    assert h is not None and h["uid"] == VICTIM and h["verified"] is True
    # a copy of the file where another user may write it is believed by no one's `ls`
    elsewhere = Path(lab.file.parent / "forged-folder")
    elsewhere.mkdir()
    os.chmod(elsewhere, 0o777)
    (elsewhere / "owners.json").write_text(file.read_text())
    env = reach_env({**lab.agent.env, "GPUPIN_AGENT_SOCKET": str(elsewhere / "hostagent.sock")})
    out = subprocess.run(
        as_other(lab.users[VICTIM], lab.agent.argv("ls", "--json")), env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert held_by(json.loads(out.stdout), mine)["owner"]["verified"] is False
