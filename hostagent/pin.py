"""The pin: what ties a container to its cards, built once here for `run`, `--dry-run` and compose rendering: the
device request by UUID (through the nvidia driver or CDI: `via`), GPUPIN_EXPECT for the entrypoint, and the
ledger's labels. A request that sets any of these by hand would defeat the pin, so they are owned here (OWNED_VARS,
OWNED_LABELS). A Swarm service's part, `Reservation`, names no card: Swarm picks them. docs/design.md, "Pinning".
"""

from __future__ import annotations

from gpupin.core.contract import EXPECT_VAR, LABEL, LEVELS, NVD_VAR, REQUIRE_VAR, SHARED_LABEL, VERIFY_VAR
from gpupin.core.errors import UsageError
from gpupin.hostagent.engine.cdi import CDI, NVIDIA, VIAS
from gpupin.hostagent.engine.cdi import name as cdi_name

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.core.resolve import Target
    from gpupin.hostagent.yamlfile import YAMLMapping

VERIFY_LEVELS = LEVELS
OWNED_VARS = (EXPECT_VAR, NVD_VAR)
OWNED_LABELS = (LABEL, SHARED_LABEL)


def check_via(via: str, capabilities: Sequence[str] = ()) -> None:
    """A way to pin, and driver capabilities that it can carry (UsageError, 64, otherwise)."""
    if via not in VIAS:
        raise UsageError(
            f"--via {via!r}: not a way to pin",
            f"use --via {' or --via '.join(VIAS)}, or leave it out to let hostagent ask the daemon",
        )
    if via == CDI and capabilities:
        # The CDI spec decides which driver libraries a container gets: a CDI request has nowhere to carry them.
        raise UsageError(
            f"--gpu-capabilities {','.join(capabilities)} with --via cdi: a CDI device's spec decides "
            "the driver's capabilities, a CDI request carries none",
            "drop --gpu-capabilities, or pin with --via nvidia (the nvidia driver's request carries them)",
        )


class Pin:
    """The pin of one container (or compose service) to its cards, in local-rank order, by the nvidia driver or
    by CDI (`via`)."""

    __slots__ = ("capabilities", "share", "targets", "verify", "via")

    def __init__(
        self,
        targets: Sequence[Target],
        share: bool = False,
        verify: str | None = None,
        capabilities: Sequence[str] = (),
        via: str = NVIDIA,
    ) -> None:
        check_via(via, capabilities)
        self.targets = list(targets)
        self.share = share
        self.verify = verify
        # NVIDIA driver capabilities (compute, utility, ...): the daemon turns them into NVIDIA_DRIVER_CAPABILITIES.
        self.capabilities = list(capabilities)
        self.via = via

    @property
    def uuids(self) -> list[str]:
        return [t.uuid for t in self.targets]

    @property
    def device_ids(self) -> list[str]:
        """The request's device ids: the UUIDs, as CDI names for a CDI pin."""
        return [cdi_name(u) for u in self.uuids] if self.via == CDI else self.uuids

    def env(self) -> dict[str, str]:
        out = {EXPECT_VAR: ",".join(t.expect_entry() for t in self.targets)}
        if self.via == NVIDIA:
            out = {NVD_VAR: ",".join(self.uuids), **out}
        if self.verify:
            out[VERIFY_VAR] = self.verify
        return out

    def labels(self) -> dict[str, str]:
        return {LABEL: ",".join(self.uuids), SHARED_LABEL: "true" if self.share else "false"}

    def _capabilities(self) -> list[list[str]]:
        # The CLI sends a CDI request with no capabilities (measured: `docker run --device nvidia.com/gpu=1` on
        # Engine 26 creates {"Driver": "cdi", "DeviceIDs": [...], "Capabilities": null}).
        return [["gpu", *self.capabilities]] if self.via == NVIDIA else []

    def device_request(self) -> JSONObject:
        """The Engine API's DeviceRequest (HostConfig.DeviceRequests[0])."""
        return {
            "Driver": self.via,
            "Count": 0,
            "DeviceIDs": self.device_ids,
            "Capabilities": self._capabilities(),
            "Options": {},
        }

    def sdk_device_request(self) -> Any:
        """The same request as the docker SDK's own type, which validates itself."""
        from docker.types import DeviceRequest

        return DeviceRequest(driver=self.via, device_ids=self.device_ids, capabilities=self._capabilities())

    def compose_device(self) -> YAMLMapping:
        """The same request as a compose file writes it (deploy.resources.reservations.devices[]), by UUID. The
        compose specification requires `capabilities` in every device entry, CDI's too (compose v2 passes them
        on, and the CDI driver ignores them)."""
        return {"driver": self.via, "device_ids": self.device_ids, "capabilities": ["gpu", *self.capabilities]}

    def docker_run_args(self) -> list[str]:
        """The same request as `docker run` options: one `--device nvidia.com/gpu=UUID` per card, or `--gpus`,
        which reads CSV, so that a list of ids is quoted inside."""
        if self.via == CDI:
            return [arg for d in self.device_ids for arg in ("--device", d)]
        value = '"device=' + ",".join(self.uuids) + '"'
        if self.capabilities:
            value += ',"capabilities=' + ",".join(self.capabilities) + '"'
        return ["--gpus", value]

    def __repr__(self) -> str:
        return f"Pin({', '.join(self.uuids)}{', shared' if self.share else ''}, via {self.via})"


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

    def generic_resource(self) -> YAMLMapping:
        """The reservation as a stack file writes it (deploy.resources.reservations.generic_resources[]);
        `docker service create --generic-resource KIND=COUNT` is the same."""
        return {"discrete_resource_spec": {"kind": self.kind, "value": self.count}}

    def __repr__(self) -> str:
        return f"Reservation({self.kind}={self.count})"
