"""The pin: what ties a container to its cards, built once here for `run`, `--dry-run` and compose rendering.

A pinned container gets
- the device request that makes the runtime expose exactly these cards (the nvidia driver's request by UUID, as
  `docker run --gpus '"device=UUID,..."'` sends it),
- NVIDIA_VISIBLE_DEVICES (the same UUIDs: what the runtime and an older toolkit read), GPUPIN_EXPECT (UUID@BUSID in
  local-rank order: what the entrypoint proves) and, when asked, GPUPIN_VERIFY,
- the ledger's labels: gpupin.devices (the UUIDs) and gpupin.shared when the cards may be shared.
A request that sets any of these by hand would defeat the pin, so they are owned here (OWNED_VARS, OWNED_LABELS).

A Swarm service gets its part of the pin from `Reservation`: Swarm picks each task's cards as it places it, so
no card is named here; the task's own DOCKER_RESOURCE_<KIND> is the expectation.
"""

from __future__ import annotations

from gpupin.entrypoint.expectation import EXPECT_VAR
from gpupin.entrypoint.sources import NVD_VAR

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.entrypoint.resolve import Target

LABEL = "gpupin.devices"
SHARED_LABEL = "gpupin.shared"
VERIFY_VAR = "GPUPIN_VERIFY"
REQUIRE_VAR = "GPUPIN_REQUIRE"
VERIFY_LEVELS = ("nvml", "cuda", "torch")
OWNED_VARS = (EXPECT_VAR, NVD_VAR)
OWNED_LABELS = (LABEL, SHARED_LABEL)


class Pin:
    """The pin of one container (or compose service) to its cards, in local-rank order."""

    __slots__ = ("capabilities", "share", "targets", "verify")

    def __init__(self, targets: Sequence[Target], share: bool = False, verify: str | None = None,
                 capabilities: Sequence[str] = ()) -> None:
        self.targets = list(targets)
        self.share = share
        self.verify = verify
        # NVIDIA driver capabilities (compute, utility, ...): the daemon turns them into NVIDIA_DRIVER_CAPABILITIES.
        self.capabilities = list(capabilities)

    @property
    def uuids(self) -> list[str]:
        return [t.uuid for t in self.targets]

    def env(self) -> dict[str, str]:
        out = {NVD_VAR: ",".join(self.uuids), EXPECT_VAR: ",".join(t.expect_entry() for t in self.targets)}
        if self.verify:
            out[VERIFY_VAR] = self.verify
        return out

    def labels(self) -> dict[str, str]:
        out = {LABEL: ",".join(self.uuids)}
        if self.share:
            out[SHARED_LABEL] = "true"
        return out

    def device_request(self) -> dict[str, Any]:
        """The Engine API's DeviceRequest (HostConfig.DeviceRequests[0])."""
        return {"Driver": "nvidia", "Count": 0, "DeviceIDs": self.uuids, "Capabilities": [["gpu", *self.capabilities]],
                "Options": {}}

    def sdk_device_request(self) -> Any:
        """The same request as the docker SDK's own type, which validates itself."""
        from docker.types import DeviceRequest

        return DeviceRequest(driver="nvidia", device_ids=self.uuids, capabilities=[["gpu", *self.capabilities]])

    def compose_device(self) -> dict[str, Any]:
        """The same request as a compose file writes it (deploy.resources.reservations.devices[]), by UUID."""
        return {"driver": "nvidia", "device_ids": self.uuids, "capabilities": ["gpu", *self.capabilities]}

    def docker_run_args(self) -> list[str]:
        """The same request as `docker run` options: --gpus reads CSV, so a list of ids is quoted inside."""
        value = '"device=' + ",".join(self.uuids) + '"'
        if self.capabilities:
            value += ',"capabilities=' + ",".join(self.capabilities) + '"'
        return ["--gpus", value]

    def __repr__(self) -> str:
        return f"Pin({', '.join(self.uuids)}{', shared' if self.share else ''})"


class Reservation:
    """The pin of a Docker Swarm service (`hostagent compose render --swarm`): each task reserves `count` generic
    resources of `kind`, and Swarm, which never gives one to two tasks, picks them when it places the task. No card
    is known here, so the pin names none: Swarm hands the task DOCKER_RESOURCE_<KIND>=<its cards>, which
    gpupin-entrypoint takes as the expectation, proves, and refuses when the task sees more cards than that.
    GPUPIN_REQUIRE=1 refuses a task that got no reservation at all (the file run where reservations are ignored)
    instead of letting it run on whatever cards it sees."""

    __slots__ = ("count", "kind", "verify")

    def __init__(self, count: int, kind: str, verify: str | None = None) -> None:
        self.count = count
        self.kind = kind
        self.verify = verify

    def env(self) -> dict[str, str]:
        out = {REQUIRE_VAR: "1"}
        if self.verify:
            out[VERIFY_VAR] = self.verify
        return out

    def generic_resource(self) -> dict[str, Any]:
        """The reservation as a stack file writes it (deploy.resources.reservations.generic_resources[]);
        `docker service create --generic-resource KIND=COUNT` is the same."""
        return {"discrete_resource_spec": {"kind": self.kind, "value": self.count}}

    def __repr__(self) -> str:
        return f"Reservation({self.kind}={self.count})"
