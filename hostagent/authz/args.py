"""`hostagent authz`'s command line: serve the authorization plugin (gpupin.hostagent.authz.plugin)."""

from __future__ import annotations

import os

from gpupin.core.errors import UsageError
from gpupin.hostagent.authz import SOCKET

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def add(sub: Any) -> None:
    """`hostagent authz`'s parser."""
    p = sub.add_parser(
        "authz",
        help="serve Docker's authorization plugin gpupin (root; see docs/authz.md)",
        description="Serve Docker's authorization plugin `gpupin` on a unix socket the daemon finds by name. With "
        '`authorization-plugins: ["gpupin"]` in the daemon\'s configuration (hostagent setup authz), the daemon asks '
        "it about every request: it denies a create that would take a held or busy card, one that pins no card "
        "(--gpus all, --gpus 2), and under the policy's [enforce] mode \"on\" one without the agent's grant; the "
        "policy's [enforce] table decides (docs/authz.md). While this process is down the daemon refuses EVERY "
        "request: run it under systemd (contrib/systemd/gpupin-authz.service), started before the daemon. While "
        "the agent is down, containers that take cards are refused and others are not affected.",
    )
    p.add_argument("--socket", default=SOCKET, help=f"where the daemon finds the plugin (default {SOCKET})")
    p.add_argument("--agent-socket", help="the agent's socket (default: GPUPIN_AGENT_SOCKET, else the agent's own)")
    p.add_argument("--policy", help="the policy file (default: GPUPIN_POLICY, else /etc/gpupin/policy.toml)")


def command(args: Any) -> int:
    from gpupin.hostagent.agentdir import socket_path
    from gpupin.hostagent.policy import policy_path

    if os.geteuid() != 0:
        raise UsageError("hostagent authz runs as root (the daemon's plugin socket is root's)", "run it with sudo")
    from gpupin.hostagent.authz.plugin import serve

    return serve(args.socket, args.agent_socket or socket_path(), args.policy or policy_path())
