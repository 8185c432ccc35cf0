"""What the daemon says of itself (`GET /info`): its runtimes, and whether it serves NVIDIA cards through CDI."""

from __future__ import annotations

from gpupin.hostagent.engine import cdi
from gpupin.hostagent.engine.address import endpoint
from gpupin.hostagent.engine.reader import fetch

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def info(api: Any) -> dict[str, Any]:
    """The daemon's `GET /info`, in its own API version (CDISpecDirs, DiscoveredDevices and Runtimes included)."""
    data: dict[str, Any] = fetch(api, "/info", versioned=False)[0]
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
    from docker.utils import version_lt

    return not version_lt(server, cdi.MIN_API)
