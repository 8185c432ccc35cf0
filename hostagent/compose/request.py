"""What one compose service asks for: its GPU request, read by one small reader per form it can be written in.

    x-gpupin: {gpus: [SPEC, ...] | count: N, share: BOOL, verify: LEVEL}     gpupin's own (compose ignores x- keys)
    deploy.resources.reservations.devices: [{driver: nvidia, device_ids: [...] | count: N|all, capabilities: [gpu]}]
    runtime: nvidia + environment NVIDIA_VISIBLE_DEVICES=...                  the legacy nvidia-docker form

Each form is a `Form`: `read` turns a service into a GpuRequest (or None), `write` puts the pin's device request
where the form was. Compose v2's service-level `gpus:` and CDI requests are not read yet: NotReadYet refuses
them by name (a service that asks for GPUs is never taken for one that does not). Reading one is one more class
in FORMS, and one fewer case in NotReadYet. The service's other parts that the rules read (environment, labels,
replicas) are read here too, in both of compose's spellings (list or mapping).
"""

from __future__ import annotations

from gpupin.entrypoint.sources import NVD_VAR
from gpupin.hostagent.compose.problems import ServiceError, shown
from gpupin.hostagent.pin import SHARED_LABEL, VERIFY_LEVELS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.hostagent.pin import Pin

KEY = "x-gpupin"
ALL = -1  # a count of every card: `count: all`, `count: -1`, a device entry with neither count nor ids
_X_KEYS = ("gpus", "count", "share", "verify")
X_HINT = f"write `{KEY}: {{gpus: [UUID-or-SPEC, ...]}}` or `{KEY}: {{count: N}}`, optionally with share: true " \
         "and verify: nvml|cuda|torch"
_SPEC_HINT = "give UUIDs (GPU-1c5e...), unique prefixes, NVML indices or bus ids (quoted: '3b:00.0')"
_DEVICES = "deploy.resources.reservations.devices"


class GpuRequest:
    """What one service asks for: cards by spec (in local-rank order) or a count, and how it was written."""

    __slots__ = ("count", "device_index", "form", "service", "share", "specs", "verify")

    def __init__(self, service: str, form: Form, specs: Sequence[str] = (), count: int | None = None,
                 share: bool = False, verify: str | None = None, device_index: int | None = None) -> None:
        self.service = service
        self.form = form
        self.specs = list(specs)
        self.count = count  # None: the cards are named in specs; ALL: every card
        self.share = share
        self.verify = verify
        self.device_index = device_index  # deploy: which device entry is the GPU one

    def describe_count(self) -> str:
        return "every card" if self.count == ALL else f"count: {self.count}"

    def __repr__(self) -> str:
        what = f"count={self.count}" if self.count is not None else f"gpus={self.specs}"
        return f"GpuRequest({self.service}, {self.form.name}, {what}, share={self.share})"


# --- the parts of a service the rules read ---------------------------------------------------------------------

def mapping(value: Any, service: str, where: str) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceError(service, f"`{where}` is not a mapping (it is {shown(value, 30)})",
                           f"write {where} as a mapping of keys, as the compose specification has it")
    return value


def env_entries(svc: Mapping[str, Any], service: str) -> dict[str, str | None]:
    """The service's `environment` (list or mapping form) as KEY -> value (None: passed from the shell)."""
    env = svc.get("environment")
    if env is None:
        return {}
    if isinstance(env, dict):
        return {str(k): None if v is None else str(v) for k, v in env.items()}
    if isinstance(env, list):
        out: dict[str, str | None] = {}
        for item in env:
            if not isinstance(item, str):
                raise ServiceError(service, f"environment entry {shown(item)} is not KEY=VALUE",
                                   "write environment entries as KEY=VALUE strings, or as a mapping")
            key, eq, value = item.partition("=")
            out[key] = value if eq else None
        return out
    raise ServiceError(service, f"`environment` is neither a list nor a mapping (it is {shown(env, 30)})",
                       "write it as a list of KEY=VALUE, or as a mapping of KEY: VALUE")


def label_entries(svc: Mapping[str, Any], service: str) -> dict[str, str]:
    labels = svc.get("labels")
    if labels is None:
        return {}
    if isinstance(labels, dict):
        return {str(k): "" if v is None else str(v) for k, v in labels.items()}
    if isinstance(labels, list):
        return dict(str(item).partition("=")[::2] for item in labels)
    raise ServiceError(service, f"`labels` is neither a list nor a mapping (it is {shown(labels, 30)})",
                       "write it as a list of KEY=VALUE, or as a mapping of KEY: VALUE")


def replicas(svc: Mapping[str, Any], service: str) -> int:
    """How many containers compose starts for the service: `deploy.replicas`, else `scale`, else 1."""
    deploy = mapping(svc.get("deploy"), service, "deploy")
    for key, value in (("deploy.replicas", deploy.get("replicas")), ("scale", svc.get("scale"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServiceError(service, f"`{key}: {shown(value)}` is not a number of containers",
                               "give a whole number >= 0")
        return value
    return 1


def _spec_list(value: Any, service: str, key: str) -> list[str]:
    """A list of GPU specs (or one, or a comma-separated string of them), as text."""
    out: list[str] = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ServiceError(service, f"{key}: {shown(item)} is not a GPU spec", _SPEC_HINT)
        out.extend(p.strip() for p in str(item).split(","))
    if not out:
        raise ServiceError(service, f"{key} is empty", "list one spec per card")
    if any(not s for s in out):
        raise ServiceError(service, f"{key} has an empty entry", "list one spec per card")
    return out


def _count(value: Any, service: str, key: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServiceError(service, f"{key}: {shown(value)} is not a number of cards >= 1", hint)
    return value


# --- the forms -------------------------------------------------------------------------------------------------

class Form:
    """One way a compose service can ask for GPUs."""

    name = ""  # how messages name the form
    standard = True  # docker compose acts on it as written (not so x-gpupin, an extension key it ignores)
    fallback = False  # read only when no other form asks (the legacy runtime form yields to a device request)
    share_how = f"the label {SHARED_LABEL}=true"  # how a service in this form says it shares its cards
    spec_name = "device id"  # how a message names one of its specs
    env_var: str | None = None  # the variable the request is read from, if any

    def by_uuid(self, uuid: str) -> str:
        """How this form names a card by UUID, for a hint."""
        return f"device_ids: [{uuid}]"

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        raise NotImplementedError

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        """Put the pin's device request in place of what the form asked."""
        raise NotImplementedError

    def shared(self, svc: Mapping[str, Any], service: str) -> bool:
        """Standard forms say "shared" with the ledger's own label (gpupin.shared=true)."""
        return label_entries(svc, service).get(SHARED_LABEL, "").lower() == "true"


def device_list(svc: dict[str, Any], create: bool = False) -> list[Any]:
    """deploy.resources.reservations.devices, created on the way when asked."""
    node = svc
    for key in ("deploy", "resources", "reservations"):
        if not isinstance(node.get(key), dict):
            if not create:
                return []
            node[key] = {}
        node = node[key]
    if not isinstance(node.get("devices"), list):
        if not create:
            return []
        node["devices"] = []
    devices: list[Any] = node["devices"]
    return devices


class XGpupin(Form):
    name = KEY
    standard = False
    share_how = f"`{KEY}: {{share: true}}`"
    spec_name = f"{KEY}.gpus entry"

    def by_uuid(self, uuid: str) -> str:
        return f"{KEY}: {{gpus: [{uuid}]}}"

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        x = svc.get(KEY)
        if x is None:
            return None
        if not isinstance(x, dict):
            raise ServiceError(service, f"`{KEY}` is not a mapping", X_HINT)
        unknown = [shown(k) for k in x if k not in _X_KEYS]
        if unknown:
            raise ServiceError(service, f"`{KEY}` has unknown key(s) {', '.join(unknown)}", X_HINT)
        has_gpus, has_count = x.get("gpus") is not None, x.get("count") is not None
        if has_gpus == has_count:
            raise ServiceError(service, f"`{KEY}` needs `gpus` or `count`, not both and not neither", X_HINT)
        share = x.get("share", False)
        if not isinstance(share, bool):
            raise ServiceError(service, f"{KEY}.share: {shown(share)} is not true or false", X_HINT)
        verify = x.get("verify")
        if verify is not None and verify not in VERIFY_LEVELS:
            raise ServiceError(service, f"{KEY}.verify: unknown level {shown(verify)}",
                               f"use {', '.join(VERIFY_LEVELS)}")
        if has_count:
            return GpuRequest(service, self, count=_count(x["count"], service, f"{KEY}.count", X_HINT), share=share,
                              verify=verify)
        return GpuRequest(service, self, _spec_list(x["gpus"], service, f"{KEY}.gpus"), share=share, verify=verify)

    def shared(self, svc: Mapping[str, Any], service: str) -> bool:
        x = svc.get(KEY)
        return isinstance(x, dict) and x.get("share") is True

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        svc.pop(KEY, None)
        device_list(svc, create=True).append(pin.compose_device())


class DeployDevices(Form):
    name = "deploy device request"

    @staticmethod
    def is_gpu(entry: Mapping[str, Any]) -> bool:
        caps = entry.get("capabilities")
        return entry.get("driver") == "nvidia" or (entry.get("driver") != "cdi" and isinstance(caps, list)
                                                   and "gpu" in caps)

    def entries(self, svc: Mapping[str, Any], service: str) -> list[tuple[int, dict[str, Any]]]:
        deploy = mapping(svc.get("deploy"), service, "deploy")
        resources = mapping(deploy.get("resources"), service, "deploy.resources")
        reservations = mapping(resources.get("reservations"), service, "deploy.resources.reservations")
        devices = reservations.get("devices")
        if devices is None:
            return []
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise ServiceError(service, f"`{_DEVICES}` is not a list of mappings",
                               "each device request is a mapping: {driver: nvidia, device_ids: [...], "
                               "capabilities: [gpu]}")
        return [(i, d) for i, d in enumerate(devices) if self.is_gpu(d)]

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        entries = self.entries(svc, service)
        if not entries:
            return None
        if len(entries) > 1:
            raise ServiceError(service, f"has {len(entries)} GPU device requests",
                               "put every card in one request's device_ids, in local-rank order")
        index, entry = entries[0]
        share = self.shared(svc, service)
        ids, count = entry.get("device_ids"), entry.get("count")
        if ids is not None and count is not None:
            raise ServiceError(service, "a GPU device request has both `count` and `device_ids`",
                               "Docker refuses that: keep device_ids (by UUID), or better, use x-gpupin and render")
        if ids is not None:
            return GpuRequest(service, self, _spec_list(ids, service, "device_ids"), share=share, device_index=index)
        if count is None or count == "all" or count == ALL:
            # No count and no ids is every card, as `--gpus all` (the compose specification's default).
            return GpuRequest(service, self, count=ALL, share=share, device_index=index)
        return GpuRequest(service, self, count=_count(count, service, "device request count", "give a whole number "
                                                      "or `all`"), share=share, device_index=index)

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        devices = device_list(svc)
        assert req.device_index is not None
        old = devices[req.device_index]
        entry = pin.compose_device()
        caps = old.get("capabilities")
        if isinstance(caps, list) and "gpu" in caps:
            entry["capabilities"] = caps  # keep e.g. [gpu, utility] as the user wrote it
        if old.get("options"):
            entry["options"] = old["options"]
        devices[req.device_index] = entry


class RuntimeEnv(Form):
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
        if not nvd or nvd.strip().lower() in ("void", "none"):
            return None
        share = self.shared(svc, service)
        if nvd.strip().lower() == "all":
            return GpuRequest(service, self, count=ALL, share=share)
        return GpuRequest(service, self, _spec_list(nvd, service, NVD_VAR), share=share)

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        svc.pop("runtime", None)  # the device request replaces `runtime: nvidia`
        device_list(svc, create=True).append(pin.compose_device())


class NotReadYet(Form):
    """The GPU forms compose v2 takes that hostagent compose does not read yet: service-level `gpus:`, CDI device
    requests (`driver: cdi`) and CDI names in `devices:`. Refused by name, never passed as "no GPU"."""

    name = "a compose v2 GPU form"

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        raise AssertionError("never read, so never written")

    def read(self, service: str, svc: Mapping[str, Any]) -> GpuRequest | None:
        found = []
        if svc.get("gpus") is not None:
            found.append("service-level `gpus:`")
        if any(isinstance(d, dict) and d.get("driver") == "cdi" for d in device_list(dict(svc))):
            found.append("a CDI device request (`driver: cdi`)")
        devices = svc.get("devices")
        if isinstance(devices, list) and any(isinstance(d, str) and d.startswith(_CDI_GPU) for d in devices):
            found.append(f"a CDI device name in `devices:` ({_CDI_GPU}...)")
        if found:
            raise ServiceError(service, f"asks for GPUs with {' and '.join(found)}, which hostagent compose does not "
                               "read yet", f"write the request as `{KEY}` (or a deploy device request with driver: "
                               "nvidia) and let render pin it")
        return None


_CDI_GPU = "nvidia.com/gpu="
# In the order they are read: what is refused first, the legacy runtime form last (it yields to the others).
FORMS: tuple[Form, ...] = (NotReadYet(), XGpupin(), DeployDevices(), RuntimeEnv())


def gpu_request(service: str, svc: Any) -> GpuRequest | None:
    """The service's GPU request, None when it asks for none, or ServiceError when it is malformed or asks twice."""
    if not isinstance(svc, dict):
        raise ServiceError(service, "the service is not a mapping", "a service is a mapping with `image:` etc.")
    found = [r for r in (f.read(service, svc) for f in FORMS if not f.fallback) if r is not None]
    if len(found) > 1:
        raise ServiceError(service, f"asks for GPUs twice: {' and '.join(r.form.name for r in found)}",
                           f"keep one (`{KEY}`, which render turns into the device request)")
    if not found:
        found = [r for r in (f.read(service, svc) for f in FORMS if f.fallback) if r is not None][:1]
    return found[0] if found else None
