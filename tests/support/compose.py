"""Compose files as the compose tests write and read them (unit and docker tiers), and the compose tools that read
them too (compose v2 from the unpacked Engine 26, docker-compose 1.29 from Debian) to compare with."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.support.host import REPO, required

# The corpus of compose files every reader must agree on, and the tools that read them.
CORPUS = REPO / "tests" / "data" / "compose-corpus"
FILES = sorted(CORPUS.glob("*.yml"))
V2 = REPO / "build" / "engines" / "26" / "root" / "usr" / "libexec" / "docker" / "cli-plugins" / "docker-compose"
V1 = Path(shutil.which("docker-compose") or "/usr/bin/docker-compose")
GPU_ENV = re.compile(r"GPUPIN_\w*|NVIDIA_VISIBLE_DEVICES")

# A service's CDI device request, in compose v2's long form (%s: the device_ids).
CDI_DEPLOY = (
    "    deploy: {resources: {reservations: {devices: [{driver: cdi, device_ids: [%s], capabilities: [gpu]}]}}}"
)


def devices(svc: dict[str, Any]) -> list[dict[str, Any]]:
    """The device requests of a rendered service (deploy.resources.reservations.devices)."""
    out: list[dict[str, Any]] = svc["deploy"]["resources"]["reservations"]["devices"]
    return out


def tool(path: Path) -> list[str]:
    if not path.exists():
        if required():
            pytest.fail(
                f"{path} is needed here (CI): `make engine26` unpacks compose v2, docker-compose is Debian's package",
                pytrace=False,
            )
        pytest.skip(f"{path} is not installed")
    return [str(path)]


def strip_gpu(model: Any) -> Any:
    """compose's model of a file without the parts the pin owns: device requests, `runtime: nvidia`, the pin's
    environment and labels, x-gpupin (levels left empty go too)."""
    model.pop("x-gpupin", None)
    for svc in (model.get("services") or {}).values():
        svc.pop("x-gpupin", None)
        svc.pop("gpus", None)
        if svc.get("runtime") == "nvidia":
            del svc["runtime"]
        for key, drop in (("environment", GPU_ENV.fullmatch), ("labels", re.compile(r"gpupin\..*").fullmatch)):
            entries = svc.get(key)
            if isinstance(entries, dict):
                svc[key] = {k: v for k, v in entries.items() if not drop(k)}
            elif isinstance(entries, list):
                svc[key] = [e for e in entries if not drop(str(e).partition("=")[0])]
            if not svc.get(key):
                svc.pop(key, None)
        reservations = ((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}
        reservations.pop("devices", None)
        if (svc.get("deploy") or {}).get("placement") == {}:  # v2 adds it to any deploy
            del svc["deploy"]["placement"]
        for path in (("deploy", "resources", "reservations"), ("deploy", "resources"), ("deploy",)):
            node = svc
            for level in path[:-1]:
                node = node.get(level) or {}
            if path[-1] in node and not node[path[-1]]:
                del node[path[-1]]
    return model
