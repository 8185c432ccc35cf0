"""Processes are holders (issue 17, part 1), on the sandboxed daemons (both engines): real processes, on the host
and in containers, that the fake NVML reports on a card through its processes file: a host process or a process of
a container that was not given the card makes it busy for `hostagent run` (--count skips it, --gpu answers 75
naming the pid and user or the container) and for `ls` (busy, ESCAPE); a container's own process does not; --share
and --count --max-load/--max-memory let a request in beside them. Without a daemon: tests/unit/test_processes.py.
In mixed-4, card 2 (A800 at 86) already carries the topology's pid 4242, whose owner /proc does not show: busy.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.host import saw
from tests.support.processes import ME, Placed, error_line, on_cards
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import topology, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")


def call(agent: Agent, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The hostagent CLI on the simulated host, with these variables (the processes file)."""
    return subprocess.run(agent.argv(*args), env={**agent.env, **env}, capture_output=True, text=True, timeout=120)


def listing(agent: Agent, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    r = call(agent, env, "ls", "--json")
    assert r.returncode == 0, r.stderr
    return {g["uuid"]: g for g in json.loads(r.stdout)["gpus"]}


def container_pid(agent: Agent, cid: str) -> int:
    return int(agent.sandbox.docker("inspect", "-f", "{{.State.Pid}}", cid, check=True).stdout)


# --- on the sandbox, both engines --------------------------------------------------------------------------------


def test_a_host_process_makes_its_card_busy(agent: Agent, tmp_path: Path, sleeper: Callable[[], int]) -> None:
    first, second = sleeper(), sleeper()
    env = on_cards(tmp_path / "p.json", {A800: [first], A800C: [second]})
    # Without processes --count 1 takes an A800 (the most free memory); both have users, and 86 has pid 4242.
    r = call(agent, env, "run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [RTX], r.stderr
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "0", TEST_IMAGE), 75)
    assert f"{A800} is in use by pid {first} of {ME} (sleep), a process of the host" in line, line
    assert "HINT:" in line and "--share" in line
    refused = error_line(call(agent, env, "run", "--rm", "--count", "2", TEST_IMAGE), 75)
    assert f"1 of 4 card(s) are free (in use by other processes: {A800}, {A800B}, {A800C})" in refused, refused
    shared = call(agent, env, "run", "--rm", "--share", "--gpu", "0", TEST_IMAGE)  # sharing on purpose
    assert shared.returncode == 0 and saw(shared.stdout) == [A800], shared.stderr
    cards = listing(agent, env)
    assert (cards[A800]["state"], cards[A800]["held"], cards[A800]["busy"]) == ("busy", True, True)
    assert [(p["pid"], p["owner"], p["user"]) for p in cards[A800]["processes"]] == [(first, "host", ME)]
    assert (cards[RTX]["state"], cards[RTX]["held"]) == ("free", False)


@pytest.mark.per_engine
def test_a_process_of_a_container_not_given_the_card_is_an_escape(agent: Agent, tmp_path: Path) -> None:
    name = f"escape-{agent.tag}"
    cid = agent.sandbox.docker(
        "run",
        "-d",
        "--name",
        name,
        "--label",
        f"gpupin.test={agent.tag}",
        "--entrypoint",
        "sleep",
        TEST_IMAGE,
        "300",
        check=True,
    ).stdout.strip()  # no GPU at all
    env = on_cards(tmp_path / "p.json", {RTX: [container_pid(agent, cid)]})
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "1", TEST_IMAGE), 75)
    assert f"in container {name} ({cid[:12]}), which was not given this card: ESCAPE" in line, line
    r = call(agent, env, "run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) in ([A800], [A800C]), r.stderr
    (p,) = listing(agent, env)[RTX]["processes"]
    assert (p["container"], p["container_id"], p["escape"], p["foreign"]) == (name, cid, True, True)
    table = call(agent, env, "ls").stdout
    assert re.search(r"^\[1\].*  busy$", table, re.M), table
    assert re.search(
        rf"^    process +\d+  C  \S+  256 MiB  sleep  {name}  ESCAPE: not given this card$", table, re.M
    ), table


@pytest.mark.per_engine
def test_a_containers_own_process_is_not_foreign(agent: Agent, tmp_path: Path) -> None:
    cid = agent("run", "-d", "--gpu", "1", TEST_IMAGE, "sleep", "300").stdout.strip()
    env = on_cards(tmp_path / "p.json", {RTX: [container_pid(agent, cid)]})
    card = listing(agent, env)[RTX]
    (p,) = card["processes"]
    assert (p["container_id"], p["foreign"], p["escape"], card["state"], card["busy"]) == (
        cid,
        False,
        False,
        "held",
        False,
    )
    line = error_line(agent("run", "--rm", "--gpu", "1", TEST_IMAGE), 75)
    assert f"{RTX} is held by " in line and "in use by" not in line, line  # its container holds it: no process line


def test_count_limits_take_a_card_others_use_when_it_is_loaded_little(
    agent: Agent, tmp_path: Path, sleeper: Callable[[], int]
) -> None:
    env = on_cards(tmp_path / "p.json", {A800: [sleeper()], RTX: [sleeper()], A800C: [sleeper()]})
    dry = ["run", "--dry-run", "--count"]
    assert "0 of 4 card(s) are free" in error_line(call(agent, env, *dry, "1", TEST_IMAGE), 75)
    r = call(agent, env, *dry, "4", "--max-load", "90", TEST_IMAGE)  # 86 runs at 87%
    assert r.returncode == 0 and all(u in r.stdout for u in (A800, RTX, A800B, A800C)), r.stderr
    over = error_line(call(agent, env, *dry, "4", "--max-load", "80", TEST_IMAGE), 75)
    assert f"over --max-load/--max-memory: {A800B}" in over, over
    assert error_line(call(agent, env, *dry, "4", "--max-memory", "40", TEST_IMAGE), 75)  # 86 uses 50% of its memory
    r = call(agent, env, *dry, "4", "--max-memory", "60", "--max-load", "90", TEST_IMAGE)
    assert r.returncode == 0, r.stderr


def test_a_card_whose_processes_nvml_will_not_list_is_unknown(agent: Agent, tmp_path: Path) -> None:
    env = on_cards(tmp_path / "p.json", {A800C: "no_permission"})
    card = listing(agent, env)[A800C]
    assert (card["held"], card["state"]) == (None, "unknown") and "Insufficient Permissions" in card["unknown"]
    table = call(agent, env, "ls").stdout
    assert re.search(r"^    unknown +NVML would not list its processes: Insufficient Permissions$", table, re.M), table
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "3", TEST_IMAGE), 75)
    assert f"{A800C} is in use by someone NVML would not name (NVML would not list its processes" in line, line
    r = call(agent, env, "run", "--rm", "--count", "2", TEST_IMAGE)
    assert r.returncode == 0 and sorted(saw(r.stdout)) == sorted([A800, RTX]), r.stderr
    shared = call(agent, env, "run", "--rm", "--share", "--gpu", "3", TEST_IMAGE)
    assert shared.returncode == 0 and saw(shared.stdout) == [A800C], shared.stderr


def test_a_held_cards_hint_names_only_cards_a_count_would_take(agent: Agent) -> None:
    """Issue 23, trap 1: the README's two jobs, one card. The refusal's "pick a free card" listed card 2, which the
    topology's pid 4242 uses (a --gpu 2 then answers 75): the hint names only the cards --count would take."""
    agent("run", "-d", "--name", f"train-a-{agent.tag}", "--gpu", "1", TEST_IMAGE, "sleep", "300")
    line = error_line(agent("run", "--rm", "--gpu", "1", TEST_IMAGE), 75)
    assert f"{RTX} is held by train-a-{agent.tag}" in line, line
    assert "pick a free card (0, 3: `hostagent ls`)" in line, line
    taken = agent("run", "--rm", "--count", "2", TEST_IMAGE, "python3", "-m", "gpupin.entrypoint")
    assert taken.returncode == 0 and sorted(saw(taken.stdout)) == sorted([A800, A800C]), taken.stderr


# --- a cgroup named for a container is not that container (issue 24) ---------------------------------------------

HOSTILE = 5001  # a bare uid, in no group


@pytest.fixture
def forged(tmp_path: Path) -> Iterator[Callable[[str], int]]:
    """forged(cid): a process of uid 5001 in a cgroup that it made for itself, named as the container's
    (`.../docker-<cid>.scope`, as `systemd-run --user --scope --unit docker-<cid>` makes one on cgroup v2), but not
    under the daemon's; its pid. The cgroups and processes go at the end."""
    placed = Placed()
    base = f"user.slice/user-{HOSTILE}.slice/user@{HOSTILE}.service/app.slice/gpupin-{tmp_path.name}"
    yield lambda cid: placed.start(HOSTILE, f"{base}/docker-{cid}.scope")
    placed.close()


def test_a_cgroup_named_for_a_container_neither_hides_use_nor_frames_it(
    agent: Agent, tmp_path: Path, forged: Callable[[str], int]
) -> None:
    """Attack: uid 5001 runs on a held card from a cgroup named for the container that holds it (hiding its use),
    and on another card from one named for a container without cards (framing it as an ESCAPE)."""
    holder = agent("run", "-d", "--gpu", "1", TEST_IMAGE, "sleep", "300").stdout.strip()
    name = f"framed-{agent.tag}"
    framed = agent.sandbox.docker(
        "run", "-d", "--name", name, "--label", f"gpupin.test={agent.tag}", "--entrypoint", "sleep", TEST_IMAGE, "300",
        check=True,
    ).stdout.strip()  # fmt: skip
    hiding, framing = forged(holder), forged(framed)
    env = on_cards(tmp_path / "p.json", {RTX: [container_pid(agent, holder), hiding], A800: [framing]})
    cards = listing(agent, env)
    for uuid, pid in ((RTX, hiding), (A800, framing)):
        card = cards[uuid]
        (p,) = [p for p in card["processes"] if p["pid"] == pid]
        assert (card["state"], card["busy"]) == ("busy", True), card
        assert (p["owner"], p["container_id"], p["container"], p["foreign"], p["escape"]) == (
            "unnamed",
            None,
            None,
            True,
            False,
        ), p
    own = [p for p in cards[RTX]["processes"] if p["pid"] != hiding]
    assert [(p["container_id"], p["foreign"]) for p in own] == [(holder, False)]  # the real one is still its own
    table = call(agent, env, "ls").stdout
    assert "ESCAPE" not in table and re.search(r"^\[0\].*  busy$", table, re.M), table
    assert re.search(r"^\[1\].*  busy$", table, re.M), table
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "0", TEST_IMAGE), 75)
    assert f"pid {framing} of " in line and "its owner cannot be named" in line and "ESCAPE" not in line, line


def test_a_card_in_use_that_nvml_names_no_process_for_is_not_taken(agent: Agent, tmp_path: Path) -> None:
    """Card 0 at 95% load with 40 GB used and no process named: --gpu 0 answers 75 in one line, --count skips it,
    --share uses it on purpose (as a card a host process uses)."""
    topo = topology("mixed-4")
    next(g for g in topo["gpus"] if g["uuid"] == A800).update(memory_used_mib=40960, utilization_gpu=95)
    (tmp_path / "unseen.json").write_text(json.dumps(topo))
    env = {"FAKEGPU_TOPOLOGY": str(tmp_path / "unseen.json")}
    line = error_line(call(agent, env, "run", "--rm", "--gpu", "0", TEST_IMAGE), 75)
    assert f"{A800} is in use by an owner NVML does not name (40960 MiB used, 95% load, no process listed)" in line
    refused = error_line(call(agent, env, "run", "--rm", "--count", "4", TEST_IMAGE), 75)
    assert f"in use by an owner NVML does not name: {A800}" in refused, refused
    r = call(agent, env, "run", "--rm", "--count", "1", TEST_IMAGE)
    assert r.returncode == 0 and saw(r.stdout) == [A800C], r.stderr  # card 0 has the most free memory: not taken
    shared = call(agent, env, "run", "--rm", "--share", "--gpu", "0", TEST_IMAGE)
    assert shared.returncode == 0 and saw(shared.stdout) == [A800], shared.stderr
