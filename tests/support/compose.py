"""Compose files as the compose tests write and read them (unit and docker tiers)."""

from __future__ import annotations

from typing import Any

# A service's CDI device request, in compose v2's long form (%s: the device_ids).
CDI_DEPLOY = ("    deploy: {resources: {reservations: {devices: [{driver: cdi, device_ids: [%s], "
              "capabilities: [gpu]}]}}}")


def devices(svc: dict[str, Any]) -> list[dict[str, Any]]:
    """The device requests of a rendered service (deploy.resources.reservations.devices)."""
    out: list[dict[str, Any]] = svc["deploy"]["resources"]["reservations"]["devices"]
    return out
