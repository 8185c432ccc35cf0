"""The shipped systemd unit (contrib/systemd/gpupin-hostagent.service) under a real systemd: PID 1 of a container on
the sandbox daemon (tests/sandbox/systemd.sh builds its image: Debian 12's systemd, gpupin's host side in
/usr/local/bin, the unit installed and enabled as its comment says). It starts, writes its record in the state folder
that ProtectSystem=strict leaves writable, reads its policy again on `systemctl reload`, and stops with 0; without
StateDirectory= it refuses to start with one line and 64 (the bug the unit once shipped with)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.host import REPO
from tests.support.sandbox import Sandbox
from tests.support.wait import wait_for

IMAGE = "gpupin-systemd:test"
UNIT = "gpupin-hostagent"
# /api/agent over the agent's socket, from inside the container (its Python, no curl there).
API = (
    "import http.client, socket, sys\n"
    "c = http.client.HTTPConnection('agent'); s = socket.socket(socket.AF_UNIX)\n"
    "s.connect('/run/gpupin/hostagent.sock')\n"
    "c.sock = s; c.request('GET', sys.argv[1]); print(c.getresponse().read().decode())\n"
)


@pytest.fixture(scope="module")
def image(sandbox: Sandbox) -> str:
    if sandbox.podman_cli:
        pytest.skip("systemd as a container's PID 1 is tested on Docker's engines")
    r = subprocess.run(
        [str(REPO / "tests" / "sandbox" / "systemd.sh"), "image"],
        env={**sandbox.env, "DOCKER": sandbox.docker_cli},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr
    return IMAGE


class Machine:
    """A container whose PID 1 is systemd."""

    def __init__(self, sandbox: Sandbox, *dropin: str) -> None:
        self.sandbox = sandbox
        self.name = f"gpupin-systemd-{uuid.uuid4().hex[:8]}"
        # systemd needs the cgroup tree writable (its own hierarchy on a v1 host) and mount namespaces for the
        # unit's ProtectSystem= and PrivateTmp= (CAP_SYS_ADMIN, no seccomp filter), /run on a tmpfs. Not
        # --privileged: it asks for every capability, and a machine that is itself a container may lack some
        # (CAP_SYS_RESOURCE: "unable to apply caps").
        args = ["run", "-d", "--name", self.name, "--cap-add", "SYS_ADMIN", "--cap-add", "SYS_PTRACE"]
        args += ["--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined", "--network", "none"]
        args += ["-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run", "--tmpfs", "/run/lock", IMAGE]
        r = sandbox.docker(*args)
        assert r.returncode == 0, r.stderr
        wait_for(self.booted, 60, "systemd to boot")
        if dropin:
            self.sh(f"mkdir -p /etc/systemd/system/{UNIT}.service.d")
            self.write(f"/etc/systemd/system/{UNIT}.service.d/test.conf", "[Service]\n" + "\n".join(dropin) + "\n")
            # as on a host where it never ran: no state folder yet
            self.sh(f"systemctl stop {UNIT}; rm -rf /var/lib/gpupin; systemctl daemon-reload; systemctl start {UNIT}")

    def sh(self, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return self.sandbox.docker("exec", self.name, "sh", "-c", script, timeout=timeout)

    def write(self, path: str, text: str) -> None:
        r = self.sandbox.docker("exec", "-i", self.name, "sh", "-c", f"cat > {path}", input=text)
        assert r.returncode == 0, r.stderr

    def booted(self) -> bool:
        state = self.sh("systemctl is-system-running").stdout.strip()
        return state in ("running", "degraded")

    def show(self, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {UNIT} " + " ".join(f"-p {p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def api(self, path: str) -> dict[str, object]:
        r = self.sandbox.docker("exec", self.name, "python3", "-c", API, path)
        assert r.returncode == 0, r.stderr
        data: dict[str, object] = json.loads(r.stdout)
        return data

    def journal(self) -> str:
        return self.sh(f"journalctl -u {UNIT} --no-pager -o cat").stdout

    def remove(self) -> None:
        self.sandbox.docker("rm", "-f", self.name)


@pytest.fixture
def machine(sandbox: Sandbox, image: str) -> Iterator[Machine]:
    m = Machine(sandbox)
    yield m
    m.remove()


def test_the_unit_starts_writes_its_record_reloads_and_stops(machine: Machine) -> None:
    wait_for(lambda: machine.show("ActiveState")["ActiveState"] == "active", 30, "the unit to be active")
    wait_for(lambda: machine.sh("test -S /run/gpupin/hostagent.sock").returncode == 0, 30, "the agent's socket")
    # the record: in the state folder systemd made (root's, 0700), written below ProtectSystem=strict
    st = machine.sh("stat -c '%U %a' /var/lib/gpupin /var/lib/gpupin/record.db").stdout.split("\n")
    assert st[:2] == ["root 700", "root 600"], st
    usage = machine.sh("hostagent usage --record /var/lib/gpupin/record.db")
    assert usage.returncode == 0, usage
    # and the rest of the system read-only for it: the unit's own view
    ro = machine.sh(f"nsenter -t $(systemctl show -p MainPID --value {UNIT}) -m sh -c 'touch /var/lib/gpupin-x' 2>&1")
    assert "Read-only file system" in ro.stdout, ro
    # reload: SIGHUP, the policy read again (the file written after the start)
    before = machine.api("/api/agent")["policy"]
    machine.sh("mkdir -p /etc/gpupin")
    machine.write("/etc/gpupin/policy.toml", '[booking]\ndefault = "2h"\nmax = "1d"\n')
    pid = machine.show("MainPID")["MainPID"]
    r = machine.sh(f"systemctl reload {UNIT}")
    assert r.returncode == 0, r.stderr
    wait_for(lambda: machine.api("/api/agent")["policy"] != before, 30, "the policy to be read again")
    after = machine.api("/api/agent")["policy"]
    print("policy before reload:", before, "after:", after)
    assert isinstance(after, dict) and after.get("read") and not after.get("error"), after
    assert machine.show("MainPID")["MainPID"] == pid  # the same process
    # stop: SIGTERM, exit 0, the socket removed
    started = time.monotonic()
    r = machine.sh(f"systemctl stop {UNIT}")
    took = time.monotonic() - started
    props = machine.show("ActiveState", "Result", "ExecMainStatus")
    print(f"stopped in {took:.1f} s: {props}")
    assert r.returncode == 0 and props["ActiveState"] == "inactive" and props["Result"] == "success", props
    assert machine.sh("test -e /run/gpupin/hostagent.sock").returncode != 0
    assert took < 10


def test_without_its_state_folder_the_agent_refuses_in_one_line_with_64(sandbox: Sandbox, image: str) -> None:
    """The unit as it once shipped: ProtectSystem=strict, no StateDirectory=. /var/lib/gpupin cannot be created."""
    m = Machine(sandbox, "StateDirectory=", "Restart=no")
    try:
        wait_for(lambda: m.show("ActiveState")["ActiveState"] in ("failed", "inactive"), 30, "the unit to fail")
        props = m.show("ActiveState", "ExecMainStatus")
        journal = m.journal()
        errors = [line for line in journal.splitlines() if "ERROR:" in line]
        print(props, errors)
        assert props["ExecMainStatus"] == "64", (props, journal)
        assert errors and all("record folder /var/lib/gpupin cannot be created" in e for e in errors), journal
        assert "Traceback" not in journal
    finally:
        m.remove()
