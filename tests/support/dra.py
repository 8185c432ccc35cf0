"""Kubernetes DRA device metadata (KEP-5304) as the kubelet plugin framework writes it, for planting in tests.

The shape is the one of k8s.io/dynamic-resource-allocation/api/metadata (v1beta1, v1alpha1) and of the file NVIDIA's
DRA driver produced in kubernetes-sigs/dra-driver-nvidia-gpu#1000 (docs/kubernetes.md cites both): a stream of
DeviceMetadata objects, one per API version, attributes in ResourceSlice's typed wrappers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = "/var/run/kubernetes.io/dra-device-attributes"
VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")


def gpu(uuid: str | None = None, bus: str | None = None, name: str = "gpu-0", driver: str = "gpu.nvidia.com") -> Any:
    """One allocated device, with the attributes NVIDIA's driver publishes for a GPU (those given)."""
    attrs: dict[str, Any] = {"type": {"string": "gpu"}, "productName": {"string": "NVIDIA A800-SXM4-80GB"}}
    if uuid is not None:
        attrs["uuid"] = {"string": uuid}
    if bus is not None:
        attrs["resource.kubernetes.io/pciBusID"] = {"string": bus}
    return {"driver": driver, "pool": "node-1", "name": name, "attributes": attrs}


def record(
    devices: list[Any], claim: str = "gpu-claim", request: str = "gpu", versions: tuple[str, ...] = VERSIONS
) -> str:
    """The file's text: the same DeviceMetadata once per version, as a stream (the framework's encoding)."""
    objs = [
        {
            "kind": "DeviceMetadata",
            "apiVersion": v,
            "metadata": {
                "name": claim,
                "namespace": "default",
                "uid": "c7e7b22e-239b-4498-b27c-7f1344481e14",
                "generation": 1,
            },
            "requests": [{"name": request, "devices": devices}],
        }
        for v in versions
    ]
    return "".join(json.dumps(o, indent=2) + "\n" for o in objs)


def path(
    root: Path | str,
    claim: str = "gpu-claim",
    request: str = "gpu",
    driver: str = "gpu.nvidia.com",
    kind: str = "resourceclaims",
) -> Path:
    """Where the file of a claim's request appears in the container (under `root`)."""
    return Path(root, kind, claim, request, f"{driver}-metadata.json")


def plant(root: Path, text: str, **where: str) -> Path:
    p = path(root, **where)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p
