"""Whom the resident agent books for (gpupin.hostagent.serve.rights, runs): only a caller who could use the daemon
itself, judged from the identity the kernel gave at accept (uid, gid, supplementary groups: never read again from a
pid), and with the caller's own lease, which that identity must confirm."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupin.core.errors import UsageError
from gpupin.hostagent.engine import address
from gpupin.hostagent.ledger import lease
from gpupin.hostagent.serve import rights
from gpupin.hostagent.serve.api import Peer
from gpupin.hostagent.serve.runs import owner_labels


@pytest.fixture
def docker_sock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The daemon's socket (a file with the socket's owner, group and mode is enough for the rule)."""
    sock = tmp_path / "docker.sock"
    sock.touch()
    os.chown(sock, 0, 4242)
    sock.chmod(0o660)
    monkeypatch.setattr(address, "_ENDPOINT", address.Endpoint(f"unix://{sock}", None, "DOCKER_HOST"))
    return sock


@pytest.fixture
def tcp_daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(address, "_ENDPOINT", address.Endpoint("tcp://127.0.0.1:2376", None, "DOCKER_HOST"))
    yield
    rights.set_daemon_group(None)


def test_the_agent_books_only_for_callers_who_could_use_the_daemon(docker_sock: Path) -> None:
    me = os.getpid()
    assert rights.refusal(Peer(me, 0, 0)) is None  # root
    assert rights.refusal(Peer(me, 1000, 4242)) is None  # the socket's group (the `docker` group's role)
    assert rights.refusal(Peer(me, 1000, 1000, [27, 4242])) is None  # ... as a supplementary group
    refused = rights.refusal(Peer(me, 1000, 1000, [27]))  # anyone else, whatever group the agent's socket gave
    assert refused is not None and "uid 1000 may not use the Docker daemon" in refused
    docker_sock.chmod(0o666)
    assert rights.refusal(Peer(me, 1000, 1000)) is None  # a socket open to all
    docker_sock.chmod(0o060)
    assert rights.refusal(Peer(me, 0 + 4343, 4242)) is None
    os.chown(docker_sock, 4343, 4242)
    assert rights.refusal(Peer(me, 4343, 4242)) is not None  # its owner is judged by the owner's bits, as the kernel
    docker_sock.unlink()
    assert rights.refusal(Peer(me, 1000, 4242)) is not None  # no daemon there


def test_a_daemon_that_is_not_a_unix_socket_is_root_s_unless_a_group_is_named(tcp_daemon: None) -> None:
    me = os.getpid()
    assert rights.refusal(Peer(me, 0, 0)) is None
    refused = rights.refusal(Peer(me, 1000, 1000, [0, 27]))  # group root is not root: the uid is
    assert refused is not None and "not a unix socket" in refused
    rights.set_daemon_group("root")  # --daemon-group root: gid 0's members
    assert rights.refusal(Peer(me, 1000, 1000, [0])) is None
    with pytest.raises(UsageError, match="no such group"):
        rights.set_daemon_group("no-such-group-here")


def test_the_identity_is_the_kernel_s_at_accept() -> None:
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with near, far:
        peer = Peer.at_accept(near)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert peer.groups == frozenset(os.getgroups())
    assert peer.start == lease.start_time(os.getpid()) and peer.pidns == lease.this_process().pidns


def test_the_lease_is_the_callers_as_the_kernel_names_it() -> None:
    me = lease.this_process()
    labels = owner_labels(str(me), Peer(me.pid, 0, 0, start=me.start, pidns=me.pidns))
    assert labels == {lease.OWNER_LABEL: str(me), lease.LEASE_LABEL: str(lease.LEASE_S)}
    other = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(UsageError, match="the caller is pid"):  # a lease in another process's name
            owner_labels(str(lease.Owner.of(other.pid)), Peer(me.pid, 0, 0, start=me.start, pidns=me.pidns))
        # The pid the caller had at accept, now another process's (a pid reused): its start time tells.
        with pytest.raises(UsageError, match="the caller is pid"):
            owner_labels(str(lease.Owner.of(other.pid)), Peer(other.pid, 0, 0, start="1", pidns=me.pidns))
    finally:
        other.kill()
        other.wait()
    with pytest.raises(UsageError, match="names no owner"):
        owner_labels(None, Peer(me.pid, 0, 0))
    far = "host=far pid=1 start=1 boot=elsewhere pidns=1"  # a caller in a pid namespace of its own names itself
    assert owner_labels(far, Peer(77, 0, 0, start="5", pidns="4026531999"))[lease.OWNER_LABEL] == far
    with pytest.raises(UsageError, match="the caller is pid"):  # ... but a caller in the agent's may not
        owner_labels(far, Peer(me.pid, 0, 0, start=me.start, pidns=me.pidns))
