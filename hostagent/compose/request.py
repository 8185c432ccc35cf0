"""What one compose service asks for: its GPU request, read by one small reader per form it can be written in.

    x-gpupin: {gpus: [SPEC, ...] | count: N, share: BOOL, verify: LEVEL}     gpupin's own (compose ignores x- keys)
    deploy.resources.reservations.devices: [{driver: nvidia, device_ids: [...] | count: N|all, capabilities: [gpu]}]
    deploy.resources.reservations.devices: [{driver: cdi, device_ids: [nvidia.com/gpu=ID, ...], capabilities: [gpu]}]
    gpus: all | [{driver: nvidia, device_ids: [...] | count: N}]             compose v2.30+, as `docker run --gpus`
    devices: [nvidia.com/gpu=ID, ...]                                         CDI names, compose v2.30+
    runtime: nvidia + environment NVIDIA_VISIBLE_DEVICES=...                  the legacy nvidia-docker form

Each form is a `Form`: `read` turns a service into a GpuRequest (or None), `write` puts the pin's device request
where the form was (a `deploy` device entry, which every compose version reads); `older_compose` says what a
compose older than the form does with it. A CDI name is read as NVIDIA's spec names the cards (engine.cdi:
index, UUID, MIG device, `all`); other CDI kinds are no GPU. The service's other parts that the rules read
(environment, labels, replicas) are read here too, in both of compose's spellings (list or mapping).
"""

from __future__ import annotations

from gpupin.core.contract import ALL as ALL_KEYWORD
from gpupin.core.contract import LEVELS as VERIFY_LEVELS
from gpupin.core.contract import NONE, NVD_VAR, SHARED_LABEL, VOID, nvd_keyword
from gpupin.hostagent.compose.problems import ServiceError, quoted
from gpupin.hostagent.engine import cdi

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

    __slots__ = ("capabilities", "count", "device_index", "form", "service", "share", "specs", "verify")

    def __init__(self, service: str, form: Form, specs: Sequence[str] = (), count: int | None = None,
                 share: bool = False, verify: str | None = None, device_index: int | None = None,
                 capabilities: Sequence[str] = ()) -> None:
        self.service = service
        self.form = form
        self.specs = list(specs)
        self.count = count  # None: the cards are named in specs; ALL: every card
        self.share = share
        self.verify = verify
        self.device_index = device_index  # deploy: which device entry is the GPU one
        # NVIDIA driver capabilities asked beside `gpu` (utility, ...): only the nvidia driver's request carries them
        self.capabilities = list(capabilities)

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
        raise ServiceError(service, f"`{where}` is not a mapping (it is {quoted(value, 30)})",
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
                raise ServiceError(service, f"environment entry {quoted(item)} is not KEY=VALUE",
                                   "write environment entries as KEY=VALUE strings, or as a mapping")
            key, eq, value = item.partition("=")
            out[key] = value if eq else None
        return out
    raise ServiceError(service, f"`environment` is neither a list nor a mapping (it is {quoted(env, 30)})",
                       "write it as a list of KEY=VALUE, or as a mapping of KEY: VALUE")


def label_entries(svc: Mapping[str, Any], service: str) -> dict[str, str]:
    labels = svc.get("labels")
    if labels is None:
        return {}
    if isinstance(labels, dict):
        return {str(k): "" if v is None else str(v) for k, v in labels.items()}
    if isinstance(labels, list):
        return dict(str(item).partition("=")[::2] for item in labels)
    raise ServiceError(service, f"`labels` is neither a list nor a mapping (it is {quoted(labels, 30)})",
                       "write it as a list of KEY=VALUE, or as a mapping of KEY: VALUE")


def replicas(svc: Mapping[str, Any], service: str) -> int:
    """How many containers compose starts for the service: `deploy.replicas`, else `scale`, else 1."""
    deploy = mapping(svc.get("deploy"), service, "deploy")
    for key, value in (("deploy.replicas", deploy.get("replicas")), ("scale", svc.get("scale"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServiceError(service, f"`{key}: {quoted(value)}` is not a number of containers",
                               "give a whole number >= 0")
        return value
    return 1


def _spec_list(value: Any, service: str, key: str) -> list[str]:
    """A list of GPU specs (or one, or a comma-separated string of them), as text."""
    out: list[str] = []
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, bool) or not isinstance(item, (str, int)):
            raise ServiceError(service, f"{key}: {quoted(item)} is not a GPU spec", _SPEC_HINT)
        out.extend(p.strip() for p in str(item).split(","))
    if not out:
        raise ServiceError(service, f"{key} is empty", "list one spec per card")
    if any(not s for s in out):
        raise ServiceError(service, f"{key} has an empty entry", "list one spec per card")
    return out


def _count(value: Any, service: str, key: str, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServiceError(service, f"{key}: {quoted(value)} is not a number of cards >= 1", hint)
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
    # What the NVIDIA stack does with a spec that is not a full UUID, an index or `i:j` (a prefix, a short bus id).
    not_taken = "which the NVIDIA container runtime does not accept"
    # What compose before the version that reads the form does with it (None: every compose version reads it).
    older_compose: str | None = None

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


def reservations(svc: Mapping[str, Any], service: str) -> dict[Any, Any]:
    """deploy.resources.reservations as written: each level a mapping (absent: empty), or ServiceError."""
    deploy = mapping(svc.get("deploy"), service, "deploy")
    resources = mapping(deploy.get("resources"), service, "deploy.resources")
    return mapping(resources.get("reservations"), service, "deploy.resources.reservations")


def reserved_list(svc: dict[str, Any], key: str, create: bool = False) -> list[Any]:
    """deploy.resources.reservations.KEY (devices, generic_resources) for writing, created on the way when asked
    (a level that is not a mapping is replaced: the rules refused such a service before anything is written)."""
    node = svc
    for level in ("deploy", "resources", "reservations"):
        if not isinstance(node.get(level), dict):
            if not create:
                return []
            node[level] = {}
        node = node[level]
    if not isinstance(node.get(key), list):
        if not create:
            return []
        node[key] = []
    found: list[Any] = node[key]
    return found


def device_list(svc: dict[str, Any], create: bool = False) -> list[Any]:
    """deploy.resources.reservations.devices, created on the way when asked."""
    return reserved_list(svc, "devices", create)


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
            raise ServiceError(service, f"{KEY}.verify: unknown level {quoted(verify)}",
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
        _write_device(svc, req, pin)


def _capabilities(entry: Mapping[str, Any]) -> list[str]:
    caps = entry.get("capabilities")
    return [str(c) for c in caps if c != "gpu"] if isinstance(caps, list) else []


def _device_entry(form: Form, service: str, entry: Mapping[str, Any], where: str, share: bool,
                  index: int | None = None) -> GpuRequest:
    """One nvidia device request (a deploy device entry, or a `gpus:` entry): ids or a count, not both; neither
    is every card, as `--gpus all` (the compose specification's default)."""
    ids, count = entry.get("device_ids"), entry.get("count")
    if ids is not None and count is not None:
        raise ServiceError(service, f"a GPU {where} has both `count` and `device_ids`",
                           "Docker refuses that: keep device_ids (by UUID), or better, use x-gpupin and render")
    caps = _capabilities(entry)
    if ids is not None:
        return GpuRequest(service, form, _spec_list(ids, service, "device_ids"), share=share, device_index=index,
                          capabilities=caps)
    if count is None or count == "all" or count == ALL:
        return GpuRequest(service, form, count=ALL, share=share, device_index=index, capabilities=caps)
    return GpuRequest(service, form, count=_count(count, service, f"{where} count", "give a whole number or `all`"),
                      share=share, device_index=index, capabilities=caps)


def _cdi_gpu_names(service: str, names: Sequence[str], where: str) -> list[str]:
    """The nvidia.com/gpu device names of a list of CDI names (each in NVIDIA's spec naming, as specs)."""
    devices = [cdi.gpu_device(n) for n in names]
    if any(d is None for d in devices):
        other = next(n for n, d in zip(names, devices) if d is None)
        raise ServiceError(service, f"{where} mixes {quoted(other)} with {cdi.KIND} devices",
                           "give other CDI kinds a device request of their own; this one is the GPUs'")
    return [cdi.as_spec(d) for d in devices if d is not None]


def _cdi_request(form: Form, service: str, names: Sequence[str], where: str, share: bool,
                 index: int | None = None) -> GpuRequest:
    specs = _cdi_gpu_names(service, names, where)
    if "all" in specs:
        if len(specs) > 1:
            raise ServiceError(service, f"{where} names {cdi.name('all')} beside other cards",
                               f"keep {cdi.name('all')} alone, or name the cards")
        return GpuRequest(service, form, count=ALL, share=share, device_index=index)
    if not specs:
        raise ServiceError(service, f"{where} is empty", f"name the cards, e.g. {cdi.name('GPU-...')}")
    return GpuRequest(service, form, specs, share=share, device_index=index)


def _write_device(svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
    """The pin's device entry in place of the request's own (deploy), else added (every other form)."""
    devices = device_list(svc, create=True)
    entry = pin.compose_device()
    if req.device_index is None:
        devices.append(entry)
        return
    old = devices[req.device_index]
    caps = old.get("capabilities")
    if isinstance(caps, list) and "gpu" in caps:
        entry["capabilities"] = caps  # keep e.g. [gpu, utility] as the user wrote it
    if old.get("options"):
        entry["options"] = old["options"]
    devices[req.device_index] = entry


class DeployDevices(Form):
    """`deploy.resources.reservations.devices` entries of the nvidia driver (or of none, asking for `gpu`)."""

    name = "deploy device request"

    def is_gpu(self, entry: Mapping[str, Any]) -> bool:
        caps = entry.get("capabilities")
        return entry.get("driver") == "nvidia" or (entry.get("driver") != cdi.CDI and isinstance(caps, list)
                                                   and "gpu" in caps)

    def entries(self, svc: Mapping[str, Any], service: str) -> list[tuple[int, dict[str, Any]]]:
        devices = reservations(svc, service).get("devices")
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
        return self.request(service, entry, index, self.shared(svc, service))

    def request(self, service: str, entry: Mapping[str, Any], index: int, share: bool) -> GpuRequest:
        return _device_entry(self, service, entry, "device request", share, index)

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        _write_device(svc, req, pin)


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
            raise ServiceError(service, "a CDI device request has a `count`: the CDI driver hands out the devices "
                               "it is given by name, never a number of them", "name the cards in device_ids, "
                               "or use x-gpupin: {count: N} and render")
        ids = [str(i) for i in entry.get("device_ids") or []]
        return _cdi_request(self, service, ids, "the CDI device request", share, index)


class GpusKey(Form):
    """Service-level `gpus:` (compose v2.30, docker/compose#12197: as `docker run --gpus`): `all`, or a list of
    device requests with the `gpu` capability implied."""

    name = "service-level `gpus:`"
    spec_name = "gpus device id"
    older_compose = ("compose before v2.30 does not read it: measured, compose v2.26 starts the service without "
                     "any GPU and docker-compose 1.29 refuses the file")

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
            raise ServiceError(service, f"`gpus:` has {len(value)} requests", "put every card in one request's "
                               "device_ids, in local-rank order" if value else hint)
        entry = value[0]
        if entry.get("driver") not in (None, "nvidia"):
            raise ServiceError(service, f"`gpus:` asks the driver {quoted(entry.get('driver'))}, not nvidia's",
                               f"use `driver: nvidia` (or none); CDI devices go in {_DEVICES} with driver: cdi")
        return _device_entry(self, service, entry, "`gpus:` request", share)

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        svc.pop("gpus", None)  # the deploy device entry replaces it: every compose version reads that
        _write_device(svc, req, pin)


class CdiNames(Form):
    """CDI names of nvidia.com/gpu in the service's `devices:` (compose v2.30, docker/compose#12184, turns them
    into a CDI device request, as `docker run --device` does)."""

    name = "CDI names in `devices:`"
    spec_name = "CDI device"
    not_taken = CdiDeployDevices.not_taken
    older_compose = ("compose before v2.30 passes a CDI name to the daemon as a device file: measured, compose v2.26 "
                     "and docker-compose 1.29 fail with \"error gathering device information while adding custom "
                     "device\"")

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
        return _cdi_request(self, service, gpus, "`devices:`", self.shared(svc, service))

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        gone = {i for i, n in self.names(svc) if cdi.gpu_device(n) is not None}
        kept = [d for i, d in enumerate(svc["devices"]) if i not in gone]
        if kept:
            svc["devices"] = kept
        else:
            svc.pop("devices")
        _write_device(svc, req, pin)


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
        keyword = nvd_keyword(nvd) if nvd else ""
        if keyword in ("", VOID, NONE):
            return None
        share = self.shared(svc, service)
        if keyword == ALL_KEYWORD:
            return GpuRequest(service, self, count=ALL, share=share)
        return GpuRequest(service, self, _spec_list(nvd, service, NVD_VAR), share=share)

    def write(self, svc: dict[str, Any], req: GpuRequest, pin: Pin) -> None:
        svc.pop("runtime", None)  # the device request replaces `runtime: nvidia`
        _write_device(svc, req, pin)


# In the order they are read; the legacy runtime form last (it yields to the others).
FORMS: tuple[Form, ...] = (XGpupin(), DeployDevices(), CdiDeployDevices(), GpusKey(), CdiNames(), RuntimeEnv())


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
