"""What the daemon says of itself (`GET /info`): its runtimes, and whether it serves NVIDIA cards through CDI; one
place (`daemon_view`) that asks it for a run, with the agent or without, and for a dry run."""

from __future__ import annotations

from gpupin.hostagent.engine import cdi, podman
from gpupin.hostagent.engine.address import endpoint
from gpupin.hostagent.engine.reads import fetch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer

NO_CDI = cdi.Detection(False, f"the daemon's API predates CDI ({cdi.MIN_API})")


def info(api: Any) -> DaemonAnswer:
    """The daemon's `GET /info`, in its own API version (CDISpecDirs, DiscoveredDevices and Runtimes included)."""
    data: DaemonAnswer = fetch(api, "/info", versioned=False)[0]
    return data


def runtimes(data: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str((v or {}).get("path") or "") for k, v in (data.get("Runtimes") or {}).items()}


def cdi_detection(data: Mapping[str, Any]) -> cdi.Detection:
    """Whether the daemon whose /info this is serves nvidia.com/gpu CDI devices (gpupin.hostagent.engine.cdi); its spec
    folders are read only when it runs on this host (a unix socket)."""
    return cdi.detect(data, local=endpoint().unix_path is not None)


def may_serve_cdi(api: Any) -> bool:
    """False for a daemon whose API predates CDI (1.44, Engine 25: CDISpecDirs): its /info (7 ms) need not be
    asked whether it serves CDI devices. True where unknown."""
    server = getattr(api, "gpupin_server_version", None)
    if not server:
        return True
    from gpupin.hostagent.engine.client import version_lt

    return not version_lt(server, cdi.MIN_API)


def daemon_view(
    api: Any, ask: bool = True, info_of: Callable[[Any], DaemonAnswer] = info
) -> tuple[DaemonAnswer | None, cdi.Detection]:
    """One /info (`info_of`: how to get it; the resident agent keeps it a few seconds): whether the daemon serves
    CDI (unless not `ask`ed: --via says how, or its API predates CDI), and its runtimes for the ledger."""
    if podman.version(api):  # its API version (1.41) predates CDI, yet podman resolves CDI names itself
        # Nothing to detect, and podman's /info takes a quarter of a second (4.3, measured): the ledger asks it only
        # if it needs the runtimes or the cgroup driver (gpupin.hostagent.ledger.read).
        return None, podman.DETECTION
    daemon_info = info_of(api) if ask and may_serve_cdi(api) else None
    return daemon_info, cdi_detection(daemon_info) if daemon_info is not None else NO_CDI
