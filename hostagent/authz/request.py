"""What the daemon sends its authorization plugin about one request (AuthZReq: method, URI, headers, and the body
as base64 when the daemon forwards it), read into what the judge asks: which API call it is, and for a container's
create the container it would make, in the shape `docker inspect` gives it, which the ledger's holding forms read.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from urllib.parse import parse_qs, unquote, urlsplit

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
_GENERIC = {"DiscreteResourceSpec": {"Kind": None}, "NamedResourceSpec": {"Kind": None}}
SERVICE_SCHEMA: Schema = {
    "TaskTemplate": {"Resources": {"Reservations": {"GenericResources": [_GENERIC]}}},
}


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
