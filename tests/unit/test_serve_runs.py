"""Whom the resident agent books for (gpupin.hostagent.serve.runs): only a caller who could use the daemon's socket
itself, and with the caller's own lease, which the kernel's word on the caller (SO_PEERCRED) must confirm."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpupin.core.errors import UsageError
from gpupin.hostagent.engine import address
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.serve.api import Peer
from gpupin.hostagent.serve.runs import may_use_docker, owner_labels


@pytest.fixture
def docker_sock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The daemon's socket (a file with the socket's owner, group and mode is enough for the rule)."""
    sock = tmp_path / "docker.sock"
    sock.touch()
    os.chown(sock, 0, 4242)
    sock.chmod(0o660)
    monkeypatch.setattr(address, "_ENDPOINT", address.Endpoint(f"unix://{sock}", None, "DOCKER_HOST"))
    return sock


def test_the_agent_books_only_for_callers_who_could_use_the_daemon(docker_sock: Path) -> None:
    me = os.getpid()
    assert may_use_docker(Peer(me, 0, 0))  # root
    assert may_use_docker(Peer(me, 1000, 4242))  # the socket's group (the `docker` group's role)
    assert not may_use_docker(Peer(me, 1000, 1000))  # anyone else, whatever group the agent's socket gave
    docker_sock.chmod(0o666)
    assert may_use_docker(Peer(me, 1000, 1000))  # a socket open to all
    docker_sock.unlink()
    assert not may_use_docker(Peer(me, 1000, 4242))  # no daemon there


def test_the_lease_is_the_callers_as_the_kernel_names_it() -> None:
    me = lease.me()
    labels = owner_labels(str(me), Peer(me.pid, 0, 0))
    assert labels == {lease.OWNER_LABEL: str(me), lease.LEASE_LABEL: str(lease.LEASE_S)}
    other = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(UsageError, match="the caller is pid"):  # a lease in another process's name
            owner_labels(str(lease.Owner.of(other.pid)), Peer(me.pid, 0, 0))
    finally:
        other.kill()
        other.wait()
    with pytest.raises(UsageError, match="names no owner"):
        owner_labels(None, Peer(me.pid, 0, 0))
    far = "host=far pid=1 start=1 boot=elsewhere pidns=1"  # a pid namespace this agent cannot see into
    assert owner_labels(far, Peer(0, 0, 0))[lease.OWNER_LABEL] == far
