"""The ledger's rows for cards a runtime picks from the container's environment: the nvidia runtime reading
NVIDIA_VISIBLE_DEVICES (ids, or CDI names in its CDI modes), and DOCKER_RESOURCE_<KIND> (Swarm's generic
resources, which the toolkit reads before NVIDIA_VISIBLE_DEVICES when its swarm-resource setting names them)."""

from __future__ import annotations

from gpupin.core.contract import NONE, NVD_VAR, SWARM_PREFIX, VOID, nvd_keyword
from gpupin.core.identity import is_uuid_like
from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger.grant import Grant, Host, cdi_gpus, environment, ids, nvidia_requests, runtime

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def runtime_env(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """The nvidia runtime reading NVIDIA_VISIBLE_DEVICES (the image's own value counts: CUDA images set `all`):
    ids, or nvidia.com/gpu CDI names (`nvidia.com/gpu=1`, which its CDI modes read). A device request's value comes
    last in the process environment and wins, and an nvidia.com/gpu CDI spec sets it to `void`, so then this form
    gives nothing."""
    name = runtime(c)
    if not host.is_nvidia_runtime(name) or nvidia_requests(c) or cdi_gpus(c):
        return []
    value = environment(c).get(NVD_VAR)
    if value is None or nvd_keyword(value) in ("", VOID, NONE):
        return []
    uuids, unknown = ids(value.split(","), host)
    return [Grant("nvidia-runtime", f"--runtime {name} {NVD_VAR}={value}", uuids, unknown)]


def swarm_resources(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """DOCKER_RESOURCE_<KIND>=<UUID>[,...] in any container, under any runtime, beside any device request: the
    toolkit reads the variable its swarm-resource setting names before NVIDIA_VISIBLE_DEVICES, whether Swarm or a
    user set it, and the ledger does not read the node's toolkit config (nor which runtime the node's default
    hooks), so every such variable counts. Only values that name cards do (UUIDs, or nvidia.com/gpu CDI names): a
    discrete resource (DOCKER_RESOURCE_SSD=1) is a count, no index."""
    grants = []
    for key, value in environment(c).items():
        if not key.startswith(SWARM_PREFIX):
            continue
        values = [v.strip() for v in value.split(",")]
        if values and all(is_uuid_like(v) or cdi.gpu_device(v) is not None for v in values):
            uuids, unknown = ids(values, host)
            grants.append(Grant("swarm-resource", f"{key}={value}", uuids, unknown))
    return grants
