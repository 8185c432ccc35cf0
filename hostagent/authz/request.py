"""What the daemon sends its authorization plugin about one request (AuthZReq: method, URI, headers, and the body
as base64 when the daemon forwards it), read into what the judge asks: which API call it is, and for a container's
create the container it would make, in the shape `docker inspect` gives it, which the ledger's holding forms read.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from urllib.parse import parse_qs, quote, unquote, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TypeAlias

    from gpupin.hostagent.engine.answer import DaemonAnswer

    Schema: TypeAlias = dict[str, Any]  # the daemon's struct: field name -> its value's schema (normal())

_VERSION = re.compile(r"^/v[0-9]+(?:\.[0-9]+)?(?=/)")
_UPDATE = re.compile(r"^/containers/[^/]+/update$")
_SERVICE = re.compile(r"^/services/(?:create|[^/]+/update)$")
CREATE = "create"
UPDATE = "update"
SERVICE = "service"


class Asked:
    """One request as the plugin judges it: `kind` (CREATE, UPDATE, SERVICE, or None: a call that gives no
    container devices), the container's name (a create's `?name=`), and `body` (None: the daemon sent none)."""

    __slots__ = ("body", "kind", "method", "name", "path", "user")

    def __init__(self, method: str, path: str, name: str, body: Any, user: str = "") -> None:
        self.method = method
        self.path = path
        self.name = name
        self.body = body
        self.user = user  # the daemon's authenticated user: a TLS client's certificate name; "" on the unix socket
        self.kind = _kind(method, path)


def _kind(method: str, path: str) -> str | None:
    if method != "POST":
        return None
    if path == "/containers/create":
        return CREATE
    if _UPDATE.match(path):
        return UPDATE
    if _SERVICE.match(path):
        return SERVICE
    return None


class Unreadable(ValueError):
    """A body whose fields the judge reads are not of the types the daemon decodes them into: the daemon refuses
    such a request itself, and the plugin refuses it first."""


def read(msg: Mapping[str, Any]) -> Asked:
    """The AuthZReq message, read. A body that is not a JSON object is None: the judge refuses what it cannot read
    when it matters (a create), and never looks at other bodies."""
    method = str(msg.get("RequestMethod") or "").upper()
    uri = urlsplit(str(msg.get("RequestUri") or msg.get("RequestURI") or ""))  # moby's JSON name: RequestUri
    path = _VERSION.sub("", unquote(uri.path), count=1).rstrip("/") or "/"
    names = parse_qs(uri.query).get("name") or [""]
    body: Any = None
    raw = msg.get("RequestBody")
    if isinstance(raw, str) and raw:
        try:
            body = json.loads(base64.b64decode(raw, validate=True), object_pairs_hook=_Pairs)
        except (binascii.Error, ValueError, RecursionError):
            body = None
    if not isinstance(body, _Pairs):
        body = None
    return Asked(method, path, names[0].lstrip("/"), body, str(msg.get("User") or ""))


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as sent: every key in order, repeats and all (the daemon's decoder reads each in turn)."""


# The fields the holding forms and the escape baseline read, by the daemon's (Go's) names. Go's decoder matches a
# key to a field ignoring case, and decodes a repeated key again into the same struct, merging: `{"HostConfig":
# {...}, "hostconfig": {"Privileged": true}}` is one privileged HostConfig to the daemon, so it is to the judge.
# A value: None (a scalar or a list of scalars), MAP (an object whose keys are data), a schema (a struct), or a
# one-item list of a schema (a list of structs).
MAP = "map"
_DEVICE = {"PathOnHost": None, "PathInContainer": None, "CgroupPermissions": None}
_REQUEST = {"Driver": None, "Count": None, "DeviceIDs": None, "Capabilities": None, "Options": MAP}
_MOUNT = {"Type": None, "Source": None, "Target": None}
_RESOURCES: Schema = {"Devices": [_DEVICE], "DeviceRequests": [_REQUEST], "DeviceCgroupRules": None}
_HOST: Schema = {
    **_RESOURCES,
    "Runtime": None,
    "Privileged": None,
    "Binds": None,
    "Mounts": [_MOUNT],
    "CapAdd": None,
    "CapDrop": None,
    "PidMode": None,
    "Annotations": MAP,
}
CREATE_SCHEMA: Schema = {"Image": None, "Env": None, "Labels": MAP, "HostConfig": _HOST}
UPDATE_SCHEMA = _RESOURCES
_GENERIC = {"DiscreteResourceSpec": {"Kind": None, "Value": None}, "NamedResourceSpec": {"Kind": None}}
# A service's spec (`docker service create`, `docker stack deploy`: POST /services/create and /services/ID/update
# send the whole spec): its name, its labels (the stack's namespace, a grant: deploy.labels), how many tasks, and
# what each task reserves.
SERVICE_SCHEMA: Schema = {
    "Name": None,
    "Labels": MAP,
    "Mode": {
        "Replicated": {"Replicas": None},
        "Global": {},
        "ReplicatedJob": {"MaxConcurrent": None},
        "GlobalJob": {},
    },
    "TaskTemplate": {
        "ContainerSpec": {"Env": None, "Mounts": [_MOUNT], "CapabilityAdd": None},
        "Resources": {"Reservations": {"GenericResources": [_GENERIC]}},
    },
}
STACK_LABEL = "com.docker.stack.namespace"  # docker stack deploy's on every service: the stack's name


class Reserved:
    """What a service reserves of GPU kinds: `kinds` (kind -> cards per task) and `tasks` (a number of replicas, or
    "global", "replicated-job", "global-job"). Its `text()` is what a service grant binds, kinds quoted so that no
    two reservations read alike."""

    __slots__ = ("kinds", "tasks")

    def __init__(self, kinds: Mapping[str, int], tasks: int | str) -> None:
        self.kinds = dict(sorted(kinds.items()))
        self.tasks = tasks

    def text(self) -> str:
        return f"{self.tasks}*" + ",".join(f"{quote(k, safe='')}={n}" for k, n in self.kinds.items())

    @classmethod
    def parse(cls, text: str) -> Reserved | None:
        """The reservation of `text()`, or None."""
        tasks, star, rest = text.partition("*")
        kinds: dict[str, int] = {}
        for item in rest.split(",") if rest else []:
            kind, eq, n = item.rpartition("=")
            if not eq or not n.isdigit():
                return None
            kinds[unquote(kind)] = int(n)
        if not star or not kinds:
            return None
        return cls(kinds, int(tasks) if tasks.isdigit() else tasks)

    def __str__(self) -> str:
        per_task = " + ".join(f"{n} {k}" for k, n in self.kinds.items())
        tasks = f"{self.tasks} task(s)" if isinstance(self.tasks, int) else f"{self.tasks} tasks"
        return f"{tasks} x {per_task}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reserved) and (self.kinds, self.tasks) == (other.kinds, other.tasks)

    def __hash__(self) -> int:
        return hash(self.text())


def gpu_kind(kind: str) -> bool:
    """Whether a generic resource's kind is a GPU's (GPU, NVIDIA-GPU, gpu-a100: what `hostagent swarm node-config`
    advertises and `--kind` names)."""
    return "GPU" in kind.upper()


def service(body: Any) -> DaemonAnswer:
    """A service's spec as the daemon decodes it (the fields SERVICE_SCHEMA reads); Unreadable: it would refuse."""
    spec: DaemonAnswer = normal(body, SERVICE_SCHEMA) or {}
    if not isinstance(spec.get("Name") or "", str):
        raise Unreadable("the service's Name is not a string")
    for r in _generic(spec):
        for key in ("DiscreteResourceSpec", "NamedResourceSpec"):
            if not isinstance((r.get(key) or {}).get("Kind") or "", str):
                raise Unreadable(f"a generic resource's {key}.Kind is not a string")
        value = (r.get("DiscreteResourceSpec") or {}).get("Value") or 0
        if not isinstance(value, int) or isinstance(value, bool):
            raise Unreadable("a generic resource's DiscreteResourceSpec.Value is not an integer")
    replicas = ((spec.get("Mode") or {}).get("Replicated") or {}).get("Replicas")
    if replicas is not None and (not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0):
        raise Unreadable("the service's Mode.Replicated.Replicas is not a number")
    return spec


def reserved(spec: Mapping[str, Any]) -> Reserved | None:
    """The GPUs a service's spec (service()) reserves per task, and its tasks; None: no GPU kind, or no replica (a
    service scaled to 0, as the agent does when its booking ends, takes no card)."""
    kinds: dict[str, int] = {}
    for r in _generic(spec):
        discrete, named = r.get("DiscreteResourceSpec") or {}, r.get("NamedResourceSpec") or {}
        kind = str(discrete.get("Kind") or named.get("Kind") or "")
        if gpu_kind(kind):  # a named resource is one card; a discrete one, its value
            kinds[kind] = kinds.get(kind, 0) + (int(discrete.get("Value") or 0) if discrete else 1)
    if not kinds:
        return None
    mode = spec.get("Mode") or {}
    # The daemon's default mode is one replica; of the modes given, the daemon takes the first it knows.
    tasks: int | str = 1
    if "Global" in mode:
        tasks = "global"
    elif "ReplicatedJob" in mode:
        tasks = "replicated-job"
    elif "GlobalJob" in mode:
        tasks = "global-job"
    elif (mode.get("Replicated") or {}).get("Replicas") is not None:
        tasks = int(mode["Replicated"]["Replicas"])
    return Reserved(kinds, tasks) if tasks != 0 else None


def service_container(spec: Mapping[str, Any]) -> DaemonAnswer:
    """The container each task of a service's spec (service()) would be, as far as the escape baseline and the
    device variables read it: its environment, its binds, its added capabilities (services have no --privileged, no
    host pid, no devices)."""
    task = (spec.get("TaskTemplate") or {}).get("ContainerSpec") or {}
    binds = [
        {"Type": "bind", "Source": str(m.get("Source") or ""), "Destination": str(m.get("Target") or "")}
        for m in task.get("Mounts") or []
        if str(m.get("Type") or "") == "bind"
    ]
    env = _strings(task.get("Env"), "ContainerSpec.Env")
    caps = _strings(task.get("CapabilityAdd"), "ContainerSpec.CapabilityAdd")
    return {"Config": {"Env": env}, "HostConfig": {"CapAdd": caps}, "Mounts": binds}


def _generic(spec: Mapping[str, Any]) -> list[Any]:
    task = spec.get("TaskTemplate") or {}
    return ((task.get("Resources") or {}).get("Reservations") or {}).get("GenericResources") or []


def service_key(spec: Mapping[str, Any]) -> str:
    """The service's name as its compose file names it: a stack's service STACK_KEY (its stack label STACK) is
    KEY; any other service, its name. A service grant binds this, as render cannot know the stack's name."""
    name = str(spec.get("Name") or "")
    stack = str((spec.get("Labels") or {}).get(STACK_LABEL) or "")
    return name[len(stack) + 1 :] if stack and name.startswith(stack + "_") else name


def _fold(key: str) -> str:
    return key.casefold()  # Go's EqualFold folds the Kelvin sign and the long s too; casefold folds a superset


def normal(value: Any, schema: Any, where: str = "the body") -> Any:
    """`value` (a _Pairs tree) as the daemon decodes it into `schema`, with the schema's own key names. Unread keys
    are dropped; a read key of the wrong type is Unreadable."""
    if value is None:
        return None
    if schema is None:
        if isinstance(value, _Pairs):
            raise Unreadable(f"{where} is an object")
        if isinstance(value, list):
            return [normal(v, None, where) for v in value]
        return value
    if schema == MAP:
        if not isinstance(value, _Pairs):
            raise Unreadable(f"{where} is not an object")
        return {str(k): normal(v, None, f"{where}.{k}") for k, v in value}
    if isinstance(schema, list):
        if not isinstance(value, list) or isinstance(value, _Pairs):
            raise Unreadable(f"{where} is not a list")
        # null in a list of structs is a zero struct to the daemon
        return [normal(v, schema[0], f"{where}[{i}]") or {} for i, v in enumerate(value)]
    if not isinstance(value, _Pairs):
        raise Unreadable(f"{where} is not an object")
    names = {_fold(k): k for k in schema}
    out: DaemonAnswer = {}
    for key, v in value:
        name = names.get(_fold(key))
        if name is None or v is None:
            continue  # null leaves a scalar or a struct as it was (and a list nil: keeping it shows the judge more)
        got = normal(v, schema[name], f"{where}.{name}")
        out[name] = _merge(out.get(name), got)
    return out


def _merge(old: Any, new: Any) -> Any:
    """A repeated key decoded again over the first: objects merge (a struct's fields, a map's keys), anything else
    is replaced; a list of objects merges item by item (Go's decoder reuses the slice's elements), which can only
    show the judge more than the daemon makes."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**old, **{k: _merge(old.get(k), v) for k, v in new.items()}}
    if isinstance(old, list) and isinstance(new, list) and all(isinstance(x, dict) for x in old + new):
        return [_merge(old[i], n) if i < len(old) else n for i, n in enumerate(new)]
    return new


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise Unreadable(f"{where} is not a list of strings")
    return value


def container(body: Any) -> DaemonAnswer:
    """A create's body as `docker inspect` shows the container: its config, its HostConfig, and its binds as the
    daemon records them in Mounts (`-v SRC:DST` and `--mount type=bind`). Unreadable: the daemon would refuse it."""
    c = normal(body, CREATE_SCHEMA)
    host = c.pop("HostConfig", None) or {}
    mounts = []
    for bind in _strings(host.get("Binds"), "HostConfig.Binds"):
        source, _, rest = bind.partition(":")
        if rest and source.startswith("/"):  # a named volume is not a bind
            mounts.append({"Type": "bind", "Source": source, "Destination": rest.split(":", 1)[0]})
    for m in host.get("Mounts") or []:
        if str(m.get("Type") or "") == "bind":
            mounts.append(
                {"Type": "bind", "Source": str(m.get("Source") or ""), "Destination": str(m.get("Target") or "")}
            )
    _strings(c.get("Env"), "Env")
    _types(host)
    return {"Config": c, "HostConfig": host, "Mounts": mounts}


def update_container(body: Any) -> DaemonAnswer:
    """An update's body (resources: Devices, DeviceRequests, DeviceCgroupRules) as the container those would give."""
    host = normal(body, UPDATE_SCHEMA)
    _types(host)
    return {"Config": {}, "HostConfig": host, "Mounts": []}


def _types(host: DaemonAnswer) -> None:
    """The daemon's types for what the holding forms read of a HostConfig (a count is an integer, ...)."""
    for r in host.get("DeviceRequests") or []:
        if not isinstance(r.get("Count") or 0, int) or isinstance(r.get("Count"), bool):
            raise Unreadable("a device request's Count is not an integer")
        _strings(r.get("DeviceIDs"), "DeviceIDs")
        for caps in r.get("Capabilities") or []:
            _strings(caps, "Capabilities")
    for key in ("CapAdd", "CapDrop", "DeviceCgroupRules"):
        _strings(host.get(key), key)
    for key in ("Runtime", "PidMode"):
        if not isinstance(host.get(key) or "", str):
            raise Unreadable(f"HostConfig.{key} is not a string")
    if not isinstance(host.get("Privileged") or False, bool):
        raise Unreadable("HostConfig.Privileged is not true or false")
    for d in host.get("Devices") or []:
        if not isinstance(d.get("PathOnHost") or "", str):
            raise Unreadable("a device's PathOnHost is not a string")


_ID = re.compile(r"^[0-9a-f]{64}$")


def created_id(answer: Mapping[str, Any]) -> str | None:
    """The id of the container a create made, from the daemon's answer (its AuthZRes: ResponseStatusCode and the
    body as base64); None when it made none, or the answer does not say."""
    if answer.get("ResponseStatusCode") != 201:
        return None
    raw = answer.get("ResponseBody")
    try:
        body = json.loads(base64.b64decode(raw, validate=True)) if isinstance(raw, str) else None
    except (binascii.Error, ValueError, RecursionError):
        return None
    cid = body.get("Id") if isinstance(body, dict) else None
    return cid if isinstance(cid, str) and _ID.match(cid) else None
