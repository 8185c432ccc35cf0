"""Who the agent acts for: a caller that could use the Docker daemon itself, judged from the identity the kernel
gave when its connection was accepted (gpupin.hostagent.serve.api.Peer), never from a pid read later. The agent
lends its speed, not its rights: on a unix socket, the daemon socket's mode against the caller; on any other
daemon, root or `--daemon-group` (docs/serve.md, "Who can reach it").
"""

from __future__ import annotations

import os

from gpupin.core.errors import UsageError
from gpupin.hostagent import engine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.hostagent.serve.interfaces import Peer


_daemon_gid: int | None = None  # --daemon-group: who may use a daemon that is not a unix socket, beside root


def set_daemon_group(name: str | None) -> None:
    """`hostagent serve --daemon-group NAME` (None: root only); an unknown group is refused at start (64)."""
    global _daemon_gid
    if name is None:
        _daemon_gid = None
        return
    import grp

    try:
        _daemon_gid = grp.getgrnam(name).gr_gid
    except KeyError:
        raise UsageError(
            f"--daemon-group {name}: no such group on this host",
            "name the group whose members may use the Docker daemon the agent serves",
        ) from None


def _in(peer: Peer, gid: int) -> bool:
    return peer.gid == gid or gid in peer.groups


def refusal(peer: Peer) -> str | None:
    """Why this caller may not use the daemon the agent serves, or None when it may."""
    if peer.uid == 0:
        return None
    path = engine.endpoint().unix_path
    if path is None:
        if _daemon_gid is not None and _in(peer, _daemon_gid):
            return None
        return (
            f"uid {peer.uid} may not use the Docker daemon at {engine.docker_host()} through the agent "
            "(not a unix socket: root only, or the members of hostagent serve --daemon-group)"
        )
    try:
        st = os.stat(path)
    except OSError:
        return f"the Docker socket {path} is not there"
    if st.st_uid == peer.uid:
        allowed = bool(st.st_mode & 0o200)
    elif _in(peer, st.st_gid):
        allowed = bool(st.st_mode & 0o020)
    else:
        allowed = bool(st.st_mode & 0o002)
    return None if allowed else f"uid {peer.uid} may not use the Docker daemon at {engine.docker_host()}"
