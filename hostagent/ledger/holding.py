"""When a container holds the cards it was given (the ledger's rule, gpupin.hostagent.ledger.holders).

The rule is docs/ledger.md, "When a container holds"; `holding` applies it to one container's inspect data. The
restart policies that hold a stopped container follow moby's restore rule (daemon/daemon.go and restartmanager);
a created container holds while its hostagent's lease lives (gpupin.hostagent.ledger.lease).
"""

from __future__ import annotations

from gpupin.hostagent.ledger import lease

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

LIVE_STATES = frozenset({"running", "paused", "restarting"})
_NEVER_STARTED = "0001-01-01T00:00:00Z"
STARTING = "being started by hostagent"  # why a created container holds while its hostagent's lease lives


def holding(inspect: Mapping[str, Any], lease_state: str | None = None) -> str | None:
    """Why the container holds its cards now, or None when it does not."""
    st = inspect.get("State") or {}
    status = str(st.get("Status") or "")
    if status in LIVE_STATES:
        return status
    if status == "created":
        return STARTING if lease_state == lease.LIVE else None
    if status != "exited" or str(st.get("StartedAt") or _NEVER_STARTED).startswith("0001-"):
        return None  # dead, removing, or never started: the daemon's restore starts none of them
    policy = (inspect.get("HostConfig") or {}).get("RestartPolicy") or {}
    name = policy.get("Name") or "no"
    if name in ("always", "unless-stopped"):
        # unless-stopped: whether it was stopped by hand (then it stays down) is not in the Engine API; counted.
        return f"stopped, restart={name}"
    if name == "on-failure" and int(st.get("ExitCode") or 0) != 0:
        retries = int(policy.get("MaximumRetryCount") or 0)
        if retries == 0 or int(inspect.get("RestartCount") or 0) < retries:
            return "stopped, restart=on-failure"
    return None


def worth_inspecting(state: str, lease_state: str | None) -> bool:
    """Whether a container of this list state may hold cards, so that its full inspect data must be read."""
    return state in LIVE_STATES or state == "exited" or (state == "created" and lease_state == lease.LIVE)
