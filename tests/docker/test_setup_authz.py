"""`hostagent setup authz` against a sandboxed daemon (its daemon.json and pid file): it turns the plugin on with a
reload (no restart), says the daemon asks it, and takes it out again; the stand-in plugin of tests/support/authz.py
answers in gpupin's place (it denies creates and gpupin's probe as gpupin's plugin does)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import authz
from tests.support.host import HOSTAGENT, doctor_on
from tests.support.sandbox import TEST_IMAGE, Sandbox

pytestmark = pytest.mark.needs("authz")


@pytest.fixture
def setup_authz(sandbox: Sandbox, tmp_path: Path) -> Iterator[list[str]]:
    """The command line that points setup at the sandbox, with the stand-in plugin serving; off again after."""
    before = authz.daemon_json(sandbox).read_text()
    argv = [
        HOSTAGENT,
        "setup",
        "authz",
        "--daemon-json",
        str(authz.daemon_json(sandbox)),
        "--pidfile",
        str(sandbox.run_dir / "dockerd.pid"),
        "--socket",
        str(authz.plugin_socket(sandbox)),
    ]
    with authz.stand_in_plugin(authz.plugin_socket(sandbox), tmp_path / "plugin.log"):
        try:
            yield argv
        finally:
            if json.loads(authz.daemon_json(sandbox).read_text()).get("authorization-plugins"):
                authz.turn_off(sandbox)
    assert json.loads(authz.daemon_json(sandbox).read_text()) == json.loads(before)


def test_setup_turns_the_plugin_on_and_off_with_a_reload(
    sandbox: Sandbox, setup_authz: list[str], tmp_path: Path
) -> None:
    import subprocess

    from gpupin.hostagent import doctor

    root = tmp_path / "root"  # doctor's host: the hook, no CDI spec, no docker.io changelog
    for d in ("dev", "etc", "sys", "usr/bin"):
        (root / d).mkdir(parents=True)
    (root / "usr" / "bin" / doctor.HOOK).write_text("")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*setup_authz, *args], env=sandbox.env, capture_output=True, text=True, timeout=60)

    pid = authz.dockerd_pid(sandbox)
    off = run("--check")
    assert off.returncode == 1 and "off: the daemon does not ask gpupin" in off.stdout, off
    on = run()
    assert on.returncode == 0, on
    assert '"authorization-plugins": ["gpupin"]' in json.dumps(json.loads(authz.daemon_json(sandbox).read_text()))
    assert f"dockerd (pid {pid}) told to reload" in on.stdout
    assert on.stdout.rstrip().endswith("on: the daemon asks gpupin about every request"), on.stdout
    denied = sandbox.docker("create", TEST_IMAGE, "true")
    assert denied.returncode != 0 and "authorization denied by plugin gpupin" in denied.stderr, denied
    doc = doctor_on(root, sandbox.host)
    assert doc.stdout.splitlines()[-1].endswith("authz: gpupin on"), doc.stdout
    version = sandbox.docker("version", "--format", "{{.Server.Version}}", check=True).stdout.strip()
    for cve, _ in doctor.authz_advisories(version, doctor.HostFiles(str(root))):
        assert f"docker: Engine {version} has the AuthZ bypass {cve}: " in doc.stdout
    checked = json.loads(run("--check", "--json").stdout)
    assert checked["state"] == "on" and checked["plugin_answers"] and checked["plugins"] == ["gpupin"]
    assert checked["started_with"] == []  # docker info keeps the list the daemon started with
    again = run()
    assert again.returncode == 0 and "(gpupin already there)" in again.stdout, again
    undone = run("--undo", "--json")
    assert undone.returncode == 0, undone
    facts = json.loads(undone.stdout)
    assert facts["state"] == "off" and facts["changed"] and facts["plugins"] == []
    assert "authorization-plugins" not in json.loads(authz.daemon_json(sandbox).read_text())
    created = sandbox.docker("create", "--label", "gpupin.test=setup-authz", TEST_IMAGE, "true")
    assert created.returncode == 0, created
    sandbox.docker("rm", created.stdout.strip())
    assert authz.dockerd_pid(sandbox) == pid  # reloaded, never restarted
    doc = doctor_on(root, sandbox.host)
    assert doc.returncode == 0 and doc.stdout.rstrip().endswith("authz: gpupin off"), doc
