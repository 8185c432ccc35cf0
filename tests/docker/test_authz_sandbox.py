"""The sandbox's plumbing for Docker's authorization plugins (tests/support/authz.py, docs/authz.md): each sandboxed
daemon finds its plugins in a folder of its own, takes a plugin on and off at run time (daemon.json and SIGHUP),
and the user's docker CLI prints the plugin's message. A stand-in plugin answers here; gpupin's own rules are
tested with `hostagent authz`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import authz
from tests.support.sandbox import TEST_IMAGE, Sandbox

pytestmark = [pytest.mark.per_engine, pytest.mark.needs("authz")]


def test_the_daemon_finds_plugins_in_the_sandboxes_own_folder(sandbox: Sandbox) -> None:
    pid = authz.dockerd_pid(sandbox)
    mounts = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    bound = [m.split() for m in mounts if m.split()[4] == "/run/docker/plugins"]
    assert bound, f"Engine {sandbox.engine}'s dockerd sees the host's /run/docker/plugins"
    # The mount's root is the sandbox's folder on the same file system (mountinfo's 4th field).
    assert bound[-1][3] == str(authz.plugin_socket(sandbox).parent)
    assert Path(f"/proc/{pid}/ns/mnt").readlink() != Path("/proc/self/ns/mnt").readlink()


def test_a_plugin_turned_on_at_run_time_denies_with_its_message(sandbox: Sandbox, tmp_path: Path) -> None:
    log = tmp_path / "plugin.log"
    with authz.stand_in_plugin(authz.plugin_socket(sandbox), log), authz.plugin_on(sandbox):
        denied = sandbox.docker("run", "--rm", TEST_IMAGE, "true")
        listed = sandbox.docker("ps", "-q")
    assert denied.returncode == 125, denied
    assert f"Error response from daemon: authorization denied by plugin gpupin: {authz.DENIED_MSG}" in denied.stderr
    assert listed.returncode == 0, listed
    asked = log.read_text().splitlines()
    assert any(line.startswith("POST ") and "/containers/create" in line for line in asked), asked
    # Off again: the same create goes through, and the plugin (gone) is asked nothing.
    created = sandbox.docker("create", "--label", "gpupin.test=authz", TEST_IMAGE, "true")
    assert created.returncode == 0, created
    sandbox.docker("rm", created.stdout.strip())
