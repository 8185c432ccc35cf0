"""The ledger's rows for cards an engine hands out on request: the nvidia driver's device requests (`--gpus`),
CDI device requests (`--device nvidia.com/gpu=...`) and CDI annotations (`cdi.k8s.io/*`, which the toolkit's
CDI modes inject from the OCI spec whatever the engine does with them)."""

from __future__ import annotations

from gpupin.hostagent.engine import cdi
from gpupin.hostagent.ledger.grant import Grant, Host, cdi_gpus, host_config, ids, nvidia_requests

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


def device_requests(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`--gpus` / DeviceRequests for the nvidia driver: ids, a count (the daemon hands out indices 0..N-1,
    daemon/nvidia_linux.go), or all (count -1)."""
    grants = []
    for req in nvidia_requests(c):
        asked = [str(i) for i in req.get("DeviceIDs") or []]
        count = int(req.get("Count") or 0)
        if asked:
            uuids, unknown = ids(asked, host)
            how = "--gpus device=" + ",".join(asked)
        elif count < 0:
            uuids, unknown, how = host.every_card(), [], "--gpus all"
        elif count > 0:
            uuids, unknown = ids([str(i) for i in range(count)], host)
            how = f"--gpus {count}"
        else:
            continue
        grants.append(Grant("device-request", how, uuids, unknown))
    return grants


def cdi_devices(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """CDI device requests of NVIDIA's kind (`docker run --device nvidia.com/gpu=...`, compose `driver: cdi`):
    each name as NVIDIA's spec names a card (index, UUID, MIG UUID, `i:j`, `gpuN`/`migI:J`, `all`), read as the
    identity core reads specs. Other kinds name no GPU."""
    grants = []
    for devices in cdi_gpus(c):
        uuids, unknown = ids([cdi.as_spec(d) for d in devices], host)
        grants.append(Grant("cdi", " ".join(f"--device {cdi.name(d)}" for d in devices), uuids, unknown))
    return grants


def oci_annotations(c: Mapping[str, Any]) -> dict[str, str]:
    """The container's OCI annotations (HostConfig.Annotations: `docker run --annotation`, Engine API 1.43)."""
    found = host_config(c).get("Annotations") or {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def cdi_annotations(c: Mapping[str, Any], host: Host) -> list[Grant]:
    """`cdi.k8s.io/<key>=nvidia.com/gpu=NAME[,...]`: the CDI devices an annotation asks for, which the toolkit's
    runtime (in its CDI and auto modes) injects from the OCI spec; names of other kinds name no GPU."""
    grants = []
    for key, value in sorted(oci_annotations(c).items()):
        if not key.startswith(CDI_ANNOTATION_PREFIX):
            continue
        names = [n.strip() for n in value.split(",") if cdi.gpu_device(n.strip()) is not None]
        if names:
            uuids, unknown = ids(names, host)
            grants.append(Grant("cdi-annotation", f"--annotation {key}={value}", uuids, unknown))
    return grants
