"""gpupin as Docker's authorization plugin on every sandbox engine (docs/authz.md): `hostagent authz` in front of
the sandbox's daemon, a real agent behind it with `[enforce] mode = "on"`, and two users of the docker group who
type plain docker commands. What the plugin alone decides (a non-GPU container), what it asks the agent (every way
of taking a card), the grants, and the plugin and the agent killed."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright

from tests.docker.test_hostile_agent import post
from tests.docker.test_policy_agent import ALICE, BOB, Lab
from tests.docker.test_serve_dashboard import Browser
from tests.support import authz
from tests.support.host import HOSTAGENT
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

pytestmark = [pytest.mark.per_engine, pytest.mark.needs("authz")]

A800, RTX, A800B, A800C = uuids("mixed-4")
ON = '[enforce]\nmode = "on"\n'
DENIED = "authorization denied by plugin gpupin: gpupin: "


class Door(Lab):
    """The lab of test_policy_agent (an agent with a policy, ALICE and BOB in the docker and agent groups) and the
    plugin in front of the sandbox's daemon."""

    def __init__(self, agent: Agent, tmp: Path, text: str = ON) -> None:
        super().__init__(agent, tmp, text)
        self.sandbox = agent.sandbox
        self.socket = authz.plugin_socket(self.sandbox)
        self.plugin_log = tmp / "plugin.log"
        self.cli_dir = tempfile.mkdtemp(prefix="gpupin-docker-cli-")  # under /tmp: every user reaches it
        os.chmod(self.cli_dir, 0o755)
        self.cli = shutil.copy(self.sandbox.docker_cli, self.cli_dir)
        os.chmod(self.cli, 0o755)
        self.plugin = self._start_plugin()
        try:
            authz.turn_on(self.sandbox)
        except BaseException:
            self.plugin.kill()
            self.resident.close()
            raise

    def _start_plugin(self) -> subprocess.Popen[str]:
        argv = [HOSTAGENT, "authz", "--socket", str(self.socket), "--agent-socket", self.resident.socket]
        with self.plugin_log.open("a") as log:
            proc = subprocess.Popen(
                [*argv, "--policy", str(self.file)], env=self.agent.env, stdout=log, stderr=log, text=True
            )
        wait_for(lambda: authz.activates(self.socket), 20, "hostagent authz to answer")
        return proc

    def restart_plugin(self) -> None:
        self.plugin = self._start_plugin()

    def docker_as(self, uid: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`docker ARGS` as a docker-group user, with the engine's own CLI (a copy the user can reach: the checkout
        may be in root's 0700 home)."""
        return subprocess.run(
            [*self.users[uid], self.cli, *args],
            env={**self.sandbox.env, "HOME": "/nonexistent"},  # not root's ~/.docker
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def close(self) -> None:
        authz.turn_off(self.sandbox)
        if self.plugin.poll() is None:
            self.plugin.terminate()
            self.plugin.wait(10)
        shutil.rmtree(self.cli_dir, ignore_errors=True)
        self.resident.close()


@pytest.fixture
def door(agent: Agent, tmp_path: Path) -> Iterator[Door]:
    os.chmod(tmp_path, 0o755)
    d = Door(agent, tmp_path)
    try:
        yield d
    finally:
        d.close()


def user_name(uid: int) -> str:
    """How the agent names an owner: the uid's name, or the uid where it has none (this machine's uids may have)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def denied(r: subprocess.CompletedProcess[str]) -> str:
    """The plugin's line of a denied docker command (its rc is 125 for run and create)."""
    assert r.returncode != 0 and DENIED in r.stderr, (r.returncode, r.stdout, r.stderr)
    return r.stderr.split(DENIED, 1)[1].splitlines()[0].rstrip(".")


def test_every_way_to_a_card_is_judged_at_the_door(door: Door) -> None:
    name = f"held-{door.agent.tag}"
    # Alice books card 1 through the agent: its create carries the agent's grant.
    r = door.as_user(ALICE, "run", "-d", "--name", name, "--gpu", "1", TEST_IMAGE, "sleep", "300")
    assert r.returncode == 0, r.stderr
    door.wait_holder(name)
    label = json.loads(door.sandbox.docker("inspect", name, check=True).stdout)[0]["Config"]["Labels"]
    assert label["gpupin.grant"].startswith("1.") and label["gpupin.grant"].split(".")[3] == str(ALICE)
    held = f"card 1 ({RTX}) is held by {name} ({user_name(ALICE)})"
    # Bob, a docker-group user, tries card 1 every way the ledger knows, with the plain docker CLI.
    forms = [
        ["--gpus", "device=1"],
        ["--gpus", f"device={RTX}"],
        ["--gpus", '"device=1,2"'],
        ["--runtime", "nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1"],
        ["-e", f"DOCKER_RESOURCE_GPU={RTX}"],
        ["--device", "/dev/nvidia1"],
        ["-v", "/dev/nvidia1:/dev/nvidia1", "--device-cgroup-rule", "c 195:1 rw"],
    ]
    if door.sandbox.engine != "20.10":  # its CLI refuses a CDI name before asking the daemon (no CDI there)
        forms.append(["--device", "nvidia.com/gpu=1"])
    for form in forms:
        line = denied(door.docker_as(BOB, "run", "--rm", *form, TEST_IMAGE, "true"))
        assert line.startswith(held) and "hostagent run --wait waits for it" in line, (form, line)
    # A request that pins nothing is told the run that would pin it.
    assert denied(door.docker_as(BOB, "run", "--rm", "--gpus", "all", TEST_IMAGE, "true")) == (
        "--gpus all pins no card: refused; hostagent run --count 4 IMAGE picks free cards and pins them"
    )
    assert "--gpus 2 pins no card" in denied(door.docker_as(BOB, "run", "--rm", "--gpus", "2", TEST_IMAGE, "true"))
    assert "pins no card" in denied(door.docker_as(BOB, "create", "--device-cgroup-rule", "c 195:* rwm", TEST_IMAGE))
    # The escape baseline: privileged, the host's root, its pid namespace.
    for form in (["--privileged"], ["-v", "/:/host"], ["--pid", "host"], ["--cap-add", "SYS_ADMIN"]):
        assert "refused on this host" in denied(door.docker_as(BOB, "run", "--rm", *form, TEST_IMAGE, "true"))
    # A free card without the agent's grant is refused, while the agent's run on it goes through.
    line = denied(door.docker_as(BOB, "run", "--rm", "--gpus", "device=3", TEST_IMAGE, "true"))
    assert line.startswith("only the agent's containers may take cards on this host (--gpus device=3)"), line
    r = door.as_user(BOB, "run", "--rm", "--gpu", "3", TEST_IMAGE, "--quiet", "true")
    assert r.returncode == 0, r.stderr
    # The agent sees card 3 free again once the daemon has removed Bob's container (--rm, after the exit).
    wait_for(lambda: door.resident.card(A800C)["state"] == "free", 20, "card 3 free again")
    # A forged grant, and Alice's own copied onto another create, are refused.
    forged = f"1.{'0' * 16}.{int(time.time()) + 60}.{BOB}.{'0' * 32}"
    for grant in (forged, label["gpupin.grant"]):
        line = denied(
            door.docker_as(BOB, "run", "--rm", "--label", f"gpupin.grant={grant}", "--gpus", "device=3", TEST_IMAGE)
        )
        assert "was not signed by this agent for this name and these cards" in line, line
    # Containers that reach no card are not the plugin's business: it answers them without the agent.
    r = door.docker_as(BOB, "run", "--rm", "--entrypoint", "true", TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    # What it refused, the agent says (/api/agent) and its log keeps.
    judged = json.loads(door.resident.get("/api/agent")[1])["authz"]
    assert judged["mode"] == "on" and any(held in j["msg"] for j in judged["judged"])
    # The agent's judging route is root's: a user cannot ask it (nor use up a grant).
    status, answer = post(door.users[BOB], door.resident.socket, "/api/authz", {"request": {}})
    assert status == 409 and "POST /api/authz is the authorization plugin's (root's)" in answer["error"]


def test_a_stale_compose_file_is_refused_and_a_rendered_one_granted(door: Door) -> None:
    name = f"held-{door.agent.tag}"
    r = door.as_user(ALICE, "run", "-d", "--name", name, "--gpu", "1", TEST_IMAGE, "sleep", "300")
    assert r.returncode == 0, r.stderr
    door.wait_holder(name)
    # A file rendered when card 1 was free (what `hostagent compose render` writes: the card by UUID).
    project = Path(tempfile.mkdtemp(prefix="gpupin-authz-compose-", dir=door.cli_dir))  # Bob writes there
    os.chmod(project, 0o777)
    devices = f"[{{driver: nvidia, device_ids: ['{RTX}'], capabilities: [gpu]}}]"
    (project / "compose.yml").write_text(
        f"services:\n  train:\n    image: {TEST_IMAGE}\n    command: ['true']\n"
        f"    deploy: {{resources: {{reservations: {{devices: {devices}}}}}}}\n"
    )
    up = door.sandbox.compose("-p", f"stale{door.agent.tag}", "-f", str(project / "compose.yml"), "up", "--no-start")
    try:
        assert up.returncode != 0 and f"card 1 ({RTX}) is held by {name}" in up.stdout + up.stderr, up
    finally:
        door.sandbox.compose("-p", f"stale{door.agent.tag}", "-f", str(project / "compose.yml"), "down")
    # Rendered through the agent now: a free card, and the agent's grant for Bob in the file; compose goes through.
    (project / "compose.yml").write_text(
        f"services:\n  train:\n    image: {TEST_IMAGE}\n    command: ['true']\n"
        "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}\n"
    )
    rendered = project / "rendered.yml"
    r = door.as_user(BOB, "compose", "render", str(project / "compose.yml"), "-o", str(rendered))
    assert r.returncode == 0 and "the agent's grants are in the file" in r.stderr, r.stderr
    assert "gpupin.grant: 1." in rendered.read_text() and RTX not in rendered.read_text()
    assert rendered.stat().st_mode & 0o777 == 0o600  # a grant admits whoever presents it: Bob's eyes only
    up = door.sandbox.compose("-p", f"fresh{door.agent.tag}", "-f", str(rendered), "up", "--no-start")
    try:
        assert up.returncode == 0, up
    finally:
        door.sandbox.compose("-p", f"fresh{door.agent.tag}", "-f", str(rendered), "down")


def test_the_agent_and_the_plugin_killed(door: Door) -> None:
    # The agent away: what reaches a card is refused, everything else served.
    door.resident.kill()
    line = denied(door.docker_as(BOB, "run", "--rm", "--gpus", "device=0", TEST_IMAGE, "true"))
    assert "the agent does not answer" in line and "other containers are not affected" in line, line
    r = door.docker_as(BOB, "run", "--rm", "--entrypoint", "true", TEST_IMAGE)
    assert r.returncode == 0, r.stderr
    # The plugin away: the daemon refuses every request until it is back; one sent meanwhile waits on the daemon's
    # retries and goes through once it is.
    door.plugin.send_signal(signal.SIGKILL)
    door.plugin.wait(10)
    started = time.monotonic()
    waiting = subprocess.Popen(
        [door.sandbox.docker_cli, "ps", "-q"], env=door.sandbox.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    time.sleep(2)
    assert waiting.poll() is None, "the daemon answered without its plugin"
    door.restart_plugin()
    back = time.monotonic()
    assert waiting.wait(60) == 0, waiting.stderr.read() if waiting.stderr else ""
    done = time.monotonic()
    print(f"plugin away {back - started:.1f}s; the waiting request served {done - back:.1f}s after it was back")
    door.resident.restart()


def holder_named(door: Door, part: str) -> dict[str, Any] | None:
    """The holder whose name has `part` (compose names its containers PROJECT-SERVICE-1, or with _ on v1)."""
    for g in door.resident.ls()["gpus"]:
        for h in g["holders"]:
            if part in h["name"] and h["holds"]:
                found: dict[str, Any] = h
                return found
    return None


def test_a_granted_compose_service_is_its_users_and_counts_against_her_quota(agent: Agent, tmp_path: Path) -> None:
    """Under on with a quota of one card and bookings of 1h by default: a file asking more than the quota is
    refused at render (64); the rendered file books the default (a label), and a copy without it is refused at the
    create; a granted service's container is Bob's, proven (the plugin tells the agent its id when the daemon
    answers the create), booked, and counts against his quota: his `hostagent run` and a second render are refused
    (75) while it runs."""
    os.chmod(tmp_path, 0o755)
    door = Door(agent, tmp_path, ON + '[quota]\ncards = 1\n[booking]\ndefault = "1h"\n')
    project = Path(tempfile.mkdtemp(prefix="gpupin-authz-quota-", dir=door.cli_dir))
    os.chmod(project, 0o777)
    service = (
        f"    image: {TEST_IMAGE}\n    command: ['sleep', '300']\n"
        "    deploy: {resources: {reservations: {devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]}}}\n"
    )
    p = f"quota{door.agent.tag}"
    try:
        (project / "two.yml").write_text(f"services:\n  a:\n{service}  b:\n{service}")
        r = door.as_user(BOB, "compose", "render", str(project / "two.yml"), "-o", str(project / "two.out.yml"))
        assert r.returncode == 64 and "2 card(s) asked, but the policy's quota lets" in r.stderr, r.stderr
        assert not (project / "two.out.yml").exists()
        (project / "one.yml").write_text(f"services:\n  train:\n{service}")
        rendered = project / "one.out.yml"
        r = door.as_user(BOB, "compose", "render", str(project / "one.yml"), "-o", str(rendered))
        assert r.returncode == 0, r.stderr
        assert "gpupin.booking.for: 3600s" in rendered.read_text(), rendered.read_text()
        unbooked = project / "unbooked.yml"
        unbooked.write_text(rendered.read_text().replace("gpupin.booking.for: 3600s", "x: y"))
        up = door.sandbox.compose("-p", f"{p}x", "-f", str(unbooked), "up", "--no-start")
        door.sandbox.compose("-p", f"{p}x", "-f", str(unbooked), "down")
        assert up.returncode != 0 and "is gone: render the file again" in up.stdout + up.stderr, up
        r = door.as_user(BOB, "compose", "render", str(project / "one.yml"), "-o", str(rendered))
        assert r.returncode == 0, r.stderr
        up = door.sandbox.compose("-p", p, "-f", str(rendered), "up", "-d")
        assert up.returncode == 0, up
        h = wait_for(lambda: holder_named(door, f"{p}"), 20, "the agent to see the service's container")
        assert h is not None and h["owner"]["verified"] and h["owner"]["uid"] == BOB, h
        assert 3500 < h["booking"]["left_s"] <= 3600, h["booking"]
        r = door.as_user(BOB, "run", "--rm", "--gpu", "3", TEST_IMAGE, "true")
        assert r.returncode == 75 and "quota cards" in r.stderr and "holds 1 of 1" in r.stderr, r.stderr
        r = door.as_user(BOB, "compose", "render", str(project / "one.yml"), "-o", str(project / "again.yml"))
        assert r.returncode == 75 and "holds 1 of 1" in r.stderr, r.stderr
        r = door.as_user(ALICE, "run", "--rm", "--gpu", "3", TEST_IMAGE, "true")  # her quota is her own
        assert r.returncode == 0, r.stderr
    finally:
        door.sandbox.compose("-p", p, "-f", str(project / "one.out.yml"), "down", "-t", "0")
        door.close()


def test_warn_lets_in_and_ls_says_what_on_would_have_refused(agent: Agent, tmp_path: Path) -> None:
    """Mode warn: Bob's plain create on a free card without a grant goes through, and `ls` (the agent's view, the
    text table and a user's own `ls` from the agent's files) says it was let in under warn, and why on would not."""
    os.chmod(tmp_path, 0o755)
    door = Door(agent, tmp_path, '[enforce]\nmode = "warn"\n')
    name = f"warned-{door.agent.tag}"
    try:
        r = door.docker_as(BOB, "run", "-d", "--name", name, "--gpus", "device=3", TEST_IMAGE, "sleep", "300")
        assert r.returncode == 0, r.stderr
        h = door.wait_holder(name)
        assert h["warned"].startswith("gpupin: only the agent's containers may take cards on this host"), h
        mine = door.as_user(BOB, "ls", "--json")
        assert mine.returncode == 0, mine.stderr
        held = [x for g in json.loads(mine.stdout)["gpus"] for x in g["holders"] if x["name"] == name]
        assert held and held[0]["warned"] == h["warned"], held
        text = door.as_user(BOB, "ls")
        assert "let in under warn: gpupin: only the agent's containers" in text.stdout, text.stdout
        with sync_playwright() as p:  # and on the agent's page, under the holder's name
            browser = Browser(p)
            try:
                tab = browser.tab(door.resident.url)
                page = tab.wait_for_selector(f".holder[data-name='{name}'] .warned", timeout=10_000)
                assert page is not None and page.text_content() == f"let in under warn: {h['warned']}"
            finally:
                browser.browser.close()
        clean = door.docker_as(BOB, "run", "-d", "--name", f"plain-{name}", "--entrypoint", "sleep", TEST_IMAGE, "5")
        assert clean.returncode == 0, clean.stderr  # a container that takes no card is not marked (nor listed)
    finally:
        subprocess.run([door.sandbox.docker_cli, "rm", "-f", name, f"plain-{name}"], env=door.sandbox.env,
                       capture_output=True)  # fmt: skip
        door.close()
