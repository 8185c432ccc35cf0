"""The forms in which a compose service can ask for GPUs (`x-gpupin`, deploy devices for the nvidia or the CDI
driver, `gpus:`, CDI names in `devices:`, `runtime: nvidia`), one `GpuRequestForm` each: how it is read, where
the pin is written back, and what an older compose does with it. `gpu_request` reads a service through every
form and refuses one that asks twice. The table: docs/compose.md.
"""

from __future__ import annotations

from gpupin.core.contract import ALL as ALL_KEYWORD
from gpupin.core.contract import LEVELS as VERIFY_LEVELS
from gpupin.core.contract import NONE, NVD_VAR, VOID, nvd_keyword
from gpupin.hostagent.compose import devicerequest
from gpupin.hostagent.compose.gpurequest import (
    ALL,
    KEY,
    LOOKALIKE_HINT,
    RESERVATIONS_AT,
    GpuRequest,
    GpuRequestForm,
    cdi_request,
    count_of,
    device_entry,
    lookalike,
    spec_list,
    write_device,
)
from gpupin.hostagent.compose.problems import ServiceError, printable, quoted
from gpupin.hostagent.compose.service import env_entries, reservations
from gpupin.hostagent.engine import cdi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpupin.hostagent.pin import Pin
    from gpupin.hostagent.yamlfile import YAMLMapping

_X_KEYS = ("gpus", "count", "share", "verify", "for")
X_HINT = (
    f"write `{KEY}: {{gpus: [UUID-or-SPEC, ...]}}` or `{KEY}: {{count: N}}`, optionally with share: true, "
    f"verify: {'|'.join(VERIFY_LEVELS)} and for: 4h"
)
_DEVICES = "deploy.resources.reservations.devices"


class XGpupin(GpuRequestForm):
    name = KEY
    standard = False
    share_how = f"`{KEY}: {{share: true}}`"
    spec_name = f"{KEY}.gpus entry"

    def by_uuid(self, uuid: str) -> str:
        return f"{KEY}: {{gpus: [{uuid}]}}"

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        misspelt = next((k for k in svc if lookalike(k)), None)
        if misspelt is not None:  # quietly no card at all, which is never what was meant: an error
            raise ServiceError(
                service,
                f"`{printable(misspelt)}` is not gpupin's `{KEY}`: the service asks for no card by it",
                LOOKALIKE_HINT,
            )
        x = svc.get(KEY)
        if x is None:
            return None
        if not isinstance(x, dict):
            raise ServiceError(service, f"`{KEY}` is not a mapping", X_HINT)
        unknown = [quoted(k) for k in x if k not in _X_KEYS]
        if unknown:
            raise ServiceError(service, f"`{KEY}` has unknown key(s) {', '.join(unknown)}", X_HINT)
        has_gpus, has_count = x.get("gpus") is not None, x.get("count") is not None
        if has_gpus == has_count:
            raise ServiceError(service, f"`{KEY}` needs `gpus` or `count`, not both and not neither", X_HINT)
        share = x.get("share", False)
        if not isinstance(share, bool):
            raise ServiceError(service, f"{KEY}.share: {quoted(share)} is not true or false", X_HINT)
        verify = x.get("verify")
        if verify is not None and verify not in VERIFY_LEVELS:
            raise ServiceError(
                service, f"{KEY}.verify: unknown level {quoted(verify)}", f"use {', '.join(VERIFY_LEVELS)}"
            )
        if has_count:
            return GpuRequest(
                service, self, count=count_of(x["count"], service, f"{KEY}.count", X_HINT), share=share, verify=verify
            )
        return GpuRequest(service, self, spec_list(x["gpus"], service, f"{KEY}.gpus"), share=share, verify=verify)

    def shared(self, svc: Mapping[str, Any], service: str) -> bool:
        x = svc.get(KEY)
        return isinstance(x, dict) and x.get("share") is True

    def write(self, svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
        svc.pop(KEY, None)
        write_device(svc, req, pin)


class DeployDevices(GpuRequestForm):
    """`deploy.resources.reservations.devices` entries of the nvidia driver (or of none, asking for `gpu`)."""

    name = "deploy device request"

    def is_gpu(self, entry: Mapping[str, Any]) -> bool:
        caps = entry.get("capabilities")
        return entry.get("driver") == "nvidia" or (
            entry.get("driver") != cdi.CDI and isinstance(caps, list) and "gpu" in caps
        )

    def entries(self, svc: Mapping[str, Any], service: str) -> list[tuple[int, YAMLMapping]]:
        devices = reservations(svc, service).get("devices")
        if devices is None:
            return []
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise ServiceError(
                service,
                f"`{_DEVICES}` is not a list of mappings",
                "each device request is a mapping: {driver: nvidia, device_ids: [...], capabilities: [gpu]}",
            )
        for i, d in enumerate(devices):  # compose refuses the whole file for any malformed entry, GPU or not
            devicerequest.schema(d, service, f"{RESERVATIONS_AT.format(service=service)}.{i}", needs_capabilities=True)
        return [(i, d) for i, d in enumerate(devices) if self.is_gpu(d)]

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        entries = self.entries(svc, service)
        if not entries:
            return None
        if len(entries) > 1:
            raise ServiceError(
                service,
                f"has {len(entries)} GPU device requests",
                "put every card in one request's device_ids, in local-rank order",
            )
        index, entry = entries[0]
        return self.request(service, entry, index, self.shared(svc, service))

    def request(self, service: str, entry: Mapping[str, Any], index: int, share: bool) -> GpuRequest:
        return device_entry(self, service, entry, share, index)

    def write(self, svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
        write_device(svc, req, pin)


class CdiDeployDevices(DeployDevices):
    """`deploy.resources.reservations.devices` entries of the CDI driver naming nvidia.com/gpu devices (compose v2
    passes them on as the daemon's CDI request; measured on v2.26)."""

    name = "CDI device request (driver: cdi)"
    spec_name = "CDI device"
    not_taken = "which NVIDIA's CDI spec does not name (it names cards by index, UUID and MIG device)"

    def by_uuid(self, uuid: str) -> str:
        return f"device_ids: [{cdi.name(uuid)}]"

    def is_gpu(self, entry: Mapping[str, Any]) -> bool:
        """An nvidia.com/gpu name among its ids, or no ids and the `gpu` capability (malformed, but meant so)."""
        ids, caps = entry.get("device_ids"), entry.get("capabilities")
        if entry.get("driver") != cdi.CDI:
            return False
        if isinstance(ids, list) and ids:
            return any(cdi.gpu_device(str(i)) is not None for i in ids)
        return isinstance(caps, list) and "gpu" in caps

    def request(self, service: str, entry: Mapping[str, Any], index: int, share: bool) -> GpuRequest:
        if entry.get("count") is not None:
            raise ServiceError(
                service,
                "a CDI device request has a `count`: the CDI driver hands out the devices "
                "it is given by name, never a number of them",
                "name the cards in device_ids, or use x-gpupin: {count: N} and render",
            )
        ids = [str(i) for i in entry.get("device_ids") or []]
        return cdi_request(self, service, ids, "the CDI device request", share, index)


class GpusKey(GpuRequestForm):
    """Service-level `gpus:` (compose v2.30, docker/compose#12197: as `docker run --gpus`): `all`, or a list of
    device requests with the `gpu` capability implied."""

    name = "service-level `gpus:`"
    spec_name = "gpus device id"
    older_compose = (
        "compose before v2.30 does not read it: measured, compose v2.26 starts the service without "
        "any GPU and docker-compose 1.29 refuses the file"
    )

    def by_uuid(self, uuid: str) -> str:
        return f"gpus: [{{device_ids: [{uuid}]}}]"

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        value = svc.get("gpus")
        if value is None:
            return None
        share = self.shared(svc, service)
        if value == "all":
            return GpuRequest(service, self, count=ALL, share=share)
        hint = "write `gpus: all`, or a list of one request: gpus: [{device_ids: [UUID, ...]}] (or {count: N})"
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise ServiceError(service, f"`gpus: {quoted(value, 40)}` is neither `all` nor a list of requests", hint)
        if len(value) != 1:
            raise ServiceError(
                service,
                f"`gpus:` has {len(value)} requests",
                "put every card in one request's device_ids, in local-rank order" if value else hint,
            )
        entry = value[0]
        if entry.get("driver") not in (None, "nvidia"):
            raise ServiceError(
                service,
                f"`gpus:` asks the driver {quoted(entry.get('driver'))}, not nvidia's",
                f"use `driver: nvidia` (or none); CDI devices go in {_DEVICES} with driver: cdi",
            )
        return device_entry(self, service, entry, share)

    def write(self, svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
        svc.pop("gpus", None)  # the deploy device entry replaces it: every compose version reads that
        write_device(svc, req, pin)


class CdiNames(GpuRequestForm):
    """CDI names of nvidia.com/gpu in the service's `devices:` (compose v2.30, docker/compose#12184, turns them
    into a CDI device request, as `docker run --device` does)."""

    name = "CDI names in `devices:`"
    spec_name = "CDI device"
    not_taken = CdiDeployDevices.not_taken
    older_compose = (
        "compose before v2.30 passes a CDI name to the daemon as a device file: measured, compose v2.26 "
        'and docker-compose 1.29 fail with "error gathering device information while adding custom '
        'device"'
    )

    def by_uuid(self, uuid: str) -> str:
        return f"devices: [{cdi.name(uuid)}]"

    @staticmethod
    def names(svc: Mapping[str, Any]) -> list[tuple[int, str]]:
        """(position, CDI name) of every CDI name in `devices:` (short syntax, or the long one's `source`)."""
        devices = svc.get("devices")
        out = []
        for i, item in enumerate(devices if isinstance(devices, list) else []):
            text = item.get("source") if isinstance(item, dict) else item
            if isinstance(text, str) and cdi.parse(text) is not None:
                out.append((i, text))
        return out

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        gpus = [n for _, n in self.names(svc) if cdi.gpu_device(n) is not None]
        if not gpus:
            return None
        return cdi_request(self, service, gpus, "`devices:`", self.shared(svc, service))

    def write(self, svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
        gone = {i for i, n in self.names(svc) if cdi.gpu_device(n) is not None}
        kept = [d for i, d in enumerate(svc["devices"]) if i not in gone]
        if kept:
            svc["devices"] = kept
        else:
            svc.pop("devices")
        write_device(svc, req, pin)


class RuntimeEnv(GpuRequestForm):
    name = "runtime: nvidia"
    fallback = True
    spec_name = NVD_VAR
    env_var = NVD_VAR

    def by_uuid(self, uuid: str) -> str:
        return f"{NVD_VAR}={uuid}"

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        if svc.get("runtime") != "nvidia":
            return None
        nvd = env_entries(svc, service).get(NVD_VAR)
        keyword = nvd_keyword(nvd) if nvd else ""
        if keyword in ("", VOID, NONE):
            return None
        share = self.shared(svc, service)
        if keyword == ALL_KEYWORD:
            return GpuRequest(service, self, count=ALL, share=share)
        return GpuRequest(service, self, spec_list(nvd, service, NVD_VAR), share=share)

    def write(self, svc: YAMLMapping, req: GpuRequest, pin: Pin) -> None:
        svc.pop("runtime", None)  # the device request replaces `runtime: nvidia`
        write_device(svc, req, pin)


# In the order they are read; the legacy runtime form last (it yields to the others).
FORMS: tuple[GpuRequestForm, ...] = (
    XGpupin(),
    DeployDevices(),
    CdiDeployDevices(),
    GpusKey(),
    CdiNames(),
    RuntimeEnv(),
)


def gpu_request(service: str, svc: Any) -> GpuRequest | None:
    """The service's GPU request, None when it asks for none, or ServiceError when it is malformed or asks twice."""
    if not isinstance(svc, dict):
        raise ServiceError(service, "the service is not a mapping", "a service is a mapping with `image:` etc.")
    found = [r for r in (f.read(service, svc) for f in FORMS if not f.fallback) if r is not None]
    if len(found) > 1:
        raise ServiceError(
            service,
            f"asks for GPUs twice: {' and '.join(r.form.name for r in found)}",
            f"keep one (`{KEY}`, which render turns into the device request)",
        )
    if not found:
        found = [r for r in (f.read(service, svc) for f in FORMS if f.fallback) if r is not None][:1]
    return found[0] if found else None
