"""`hostagent serve`: the resident host agent. It keeps NVML and the Engine client open, follows the daemon's events,
and serves the live `ls` view (with idle holders) as JSON, Prometheus metrics and a dashboard, over a unix socket for
the CLI and over loopback HTTP (docs/serve.md; its place: docs/design.md, "The resident agent")."""

from __future__ import annotations

from gpupin import hostagent


def say(text: str) -> None:
    """One line of the agent's log, on stderr as every hostagent line (journald keeps it under the unit)."""
    hostagent.say(f"serve: {text}")
