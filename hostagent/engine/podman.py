"""Podman behind its Docker-compatible API (`podman system service`): how it is told apart (its `Libpod-Api-Version`
header, kept as `api.gpupin_podman`), the pinned container's create through podman's own API (the compatible
create drops both forms of the pin; a field with no translation is refused, never dropped), and the ledger's read
of the card nodes in the OCI spec podman wrote, since its inspect shows no CDI device (docs/podman.md).
"""

from __future__ import annotations

import json

from gpupin.core.errors import UsageError, shown
from gpupin.hostagent.engine import cdi

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.engine.answer import DaemonAnswer

# The libpod API's path prefix; podman 4 and 5 serve it under any v4+ version.
LIBPOD = "/v4.0.0/libpod"
DETECTION = cdi.Detection(True, "podman resolves nvidia.com/gpu CDI names itself (podman 4.1+)")

# What the create payload may hold at its defaults (null, empty, false, or what the docker CLI sends anyway).
_IDLE: dict[str, tuple[object, ...]] = {
    "NetworkMode": ("default", ""),
    "RestartPolicy": ({"Name": "no", "MaximumRetryCount": 0}, {"Name": "", "MaximumRetryCount": 0}),
    "AttachStdout": (True,),
    "AttachStderr": (True,),
}


def version(api: Any) -> str | None:
    """The podman version of a daemon that is podman, None for Docker (from the /_ping the connect made)."""
    found = getattr(api, "gpupin_podman", None)
    return str(found) if found else None


def refuse_nvidia(via: str, podman: str) -> None:
    """The nvidia driver's request never pins on podman (its compatible API drops it): refused, not sent."""
    if via == cdi.NVIDIA:
        raise UsageError(
            f"--via nvidia on podman {podman}: podman drops the nvidia driver's device request (`--gpus`), and the "
            "container would start with no card pinned",
            "leave --via out (podman pins through CDI: --device nvidia.com/gpu=UUID); "
            "--gpu-capabilities has no CDI form either",
        )


def _idle(key: str, value: Any) -> bool:
    return value in (None, "", [], {}, False, 0) or value in _IDLE.get(key, ())


def _mount(bind: str) -> JSONObject:
    source, _, rest = bind.partition(":")
    dest, _, mode = rest.partition(":")
    if not source.startswith("/") or not dest:
        raise UsageError(
            f"-v {shown(bind)}: on podman, hostagent passes bind mounts of host paths only",
            "give the host path (/...), or create the volume's container with podman itself",
        )
    # Every option as given: podman refuses one it does not know (125), as Docker does; none is dropped here.
    options = ["rbind"] + [o for o in mode.split(",") if o]
    return {"destination": dest, "source": source, "type": "bind", "options": options}


def _namespace(mode: str) -> dict[str, str]:
    """A Docker namespace mode (`host`, `none`, `private`, `container:ID`...) as libpod's Namespace."""
    kind, _, value = mode.partition(":")
    return {"nsmode": kind, "value": value} if value else {"nsmode": kind}


# Docker's modes of --ipc and --network that libpod takes under the same name (a named network is not translated).
_IPC_MODES = ("host", "none", "private", "shareable", "container")
_NET_MODES = ("host", "none", "bridge", "container")


def spec_generator(config: Mapping[str, Any], name: str | None) -> JSONObject:
    """The SpecGenerator of a Docker create payload (as gpupin.hostagent.run.request builds it): the fields
    hostagent run sets for a pinned container, the CDI device requests as CDI devices. UsageError (64) for any
    other field that is set: podman would be asked something that is not translated."""
    host = dict(config.get("HostConfig") or {})
    conf = {k: v for k, v in config.items() if k != "HostConfig"}
    spec: JSONObject = {"image": conf.pop("Image")}
    if name:
        spec["name"] = name
    env = conf.pop("Env", None) or []
    # An entry without `=` is a variable that is not set (docker run -e KEY, KEY unset): none, as on Docker.
    spec["env"] = dict(e.partition("=")[::2] for e in env if "=" in e)
    spec["labels"] = dict(conf.pop("Labels", None) or {})
    for key, field in (("Cmd", "command"), ("Entrypoint", "entrypoint"), ("WorkingDir", "work_dir"), ("User", "user")):
        value = conf.pop(key, None)
        if value:
            spec[field] = [value] if key == "Entrypoint" and isinstance(value, str) else value
    spec["terminal"] = bool(conf.pop("Tty", False))
    spec["stdin"] = bool(conf.pop("OpenStdin", False))
    for key in ("AttachStdin", "AttachStdout", "AttachStderr", "StdinOnce"):
        conf.pop(key, None)  # the attach is the compatible API's, after the create
    devices: list[dict[str, str]] = []
    for req in host.pop("DeviceRequests", None) or []:
        if req.get("Driver") != cdi.CDI:
            raise UsageError(
                "podman drops device requests of the nvidia driver (`--gpus`): the container would start unpinned",
                "pin through CDI (leave --via out)",
            )
        devices += [{"path": str(d)} for d in req.get("DeviceIDs") or []]
    spec["devices"] = devices
    spec["remove"] = bool(host.pop("AutoRemove", False))
    binds = host.pop("Binds", None) or []
    if binds:
        spec["mounts"] = [_mount(b) for b in binds]
    limits = host.pop("Ulimits", None) or []
    if limits:
        spec["r_limits"] = [
            {"type": str(u["Name"]), "soft": _rlimit(u["Soft"]), "hard": _rlimit(u["Hard"])} for u in limits
        ]
    annotations = host.pop("Annotations", None)
    if annotations:
        spec["annotations"] = dict(annotations)
    stop_timeout = conf.pop("StopTimeout", None)
    if stop_timeout is not None:
        spec["stop_timeout"] = int(stop_timeout)
    shm = host.pop("ShmSize", None)
    if shm:
        spec["shm_size"] = int(shm)
    for key, field, modes in (("IpcMode", "ipcns", _IPC_MODES), ("NetworkMode", "netns", _NET_MODES)):
        mode = str(host.get(key) or "")
        if mode.partition(":")[0] in modes:
            spec[field] = _namespace(host.pop(key))
    left = [k for k, v in conf.items() if not _idle(k, v)] + [
        f"HostConfig.{k}" for k, v in host.items() if not _idle(k, v)
    ]
    if left:
        raise UsageError(
            f"on podman, hostagent run does not carry these options yet: {', '.join(sorted(left))}",
            "drop them, or see docs/podman.md for the options a run on podman takes",
        )
    return spec


def _rlimit(value: Any) -> int:
    """A --ulimit value as libpod's create takes it. libpod names a limit as the docker CLI does (`nofile`: it adds
    the RLIMIT_ itself, so RLIMIT_NOFILE reached runc as RLIMIT_RLIMIT_NOFILE) but reads the values unsigned:
    Docker's -1 (unlimited) is the largest, as podman's own CLI sends it."""
    n = int(value)
    return n if n >= 0 else 2**64 - 1


def create(api: Any, config: Mapping[str, Any], name: str | None) -> str:
    """Create the container through podman's own API; its ID (the compatible API's too)."""
    body = spec_generator(config, name)
    from gpupin.hostagent.engine.unix import UnixClient

    if isinstance(api, UnixClient):
        return str(api.call("POST", LIBPOD + "/containers/create", body=body, versioned=False)["Id"])
    res = api._post(
        api.base_url + LIBPOD + "/containers/create",
        data=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    api._raise_for_status(res)
    return str(res.json()["Id"])


OCI_KEY = "GpupinOciDevices"  # where the ledger puts the OCI spec's device nodes in a container's inspect data
OCI_LIMIT = 16 << 20  # an OCI spec is a few KiB; one larger than this is not podman's


def read_oci_spec(api: Any, cid: str, data: DaemonAnswer) -> None:
    """Complete a podman container's inspect `data` from the OCI spec podman wrote for it: its device nodes
    (linux.devices: path, type, major, minor) under OCI_KEY, and its annotations as HostConfig.Annotations, which
    podman's compatible inspect leaves out (a `cdi.k8s.io/*` annotation asks the toolkit's CDI mode for cards).
    Nothing when it has no spec yet (created, never started) or the spec cannot be read here."""
    from gpupin.core.errors import GpupinError
    from gpupin.core.files import read_bounded
    from gpupin.hostagent.engine.failures import EngineNotFound
    from gpupin.hostagent.engine.reads import fetch

    try:
        found = fetch(api, f"{LIBPOD}/containers/{cid}/json", versioned=False)[0]
    except EngineNotFound:
        return
    path = str(found.get("OCIConfigPath") or "")
    if not path.startswith("/"):
        return
    try:
        spec = json.loads(read_bounded(path, OCI_LIMIT))
    except (GpupinError, ValueError):
        return
    if not isinstance(spec, dict):
        return
    devices = (spec.get("linux") or {}).get("devices") or []
    data[OCI_KEY] = [d for d in devices if isinstance(d, dict)]
    annotations = spec.get("annotations")
    host = data.setdefault("HostConfig", {})
    if isinstance(annotations, dict) and isinstance(host, dict) and not host.get("Annotations"):
        host["Annotations"] = {str(k): str(v) for k, v in annotations.items()}
