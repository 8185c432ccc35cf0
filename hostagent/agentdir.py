"""Where the resident agent listens and keeps its state: GPUPIN_AGENT_SOCKET, else /run/gpupin/hostagent.sock, and
that socket's folder. Below both the agent's client (gpupin.hostagent.agentlink) and the ledger, which reads the
bookings' extensions kept there without talking to the agent."""

from __future__ import annotations

import os

DEFAULT_SOCKET = "/run/gpupin/hostagent.sock"
SOCKET_ENV = "GPUPIN_AGENT_SOCKET"


def socket_path() -> str:
    return os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def state_folder() -> str:
    """The agent's folder: its socket's."""
    return os.path.dirname(os.path.abspath(socket_path()))
