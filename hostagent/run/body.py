"""The create body (`POST /containers/create`) of a run, built here from the options as converted
(gpupin.hostagent.run.options): the same dict, key for key and in the same order, as the docker SDK's
HostConfig and ContainerConfig build from the same keywords (tests/unit/test_run_body.py compares them option by
option), without importing the SDK, which is 60 to 130 ms of a run's start-up. --publish and a --device given as
text borrow the SDK's helpers, imported only when those options are given.

MIN_API (1.40) is newer than every version check of the SDK's for these keywords, so none is made here.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpupin.core import JSONObject


class BodyError(ValueError):
    """A value the Engine cannot take (what the SDK's types refuse before sending)."""


# HostConfig keywords set when given (not None) and those set when truthy, as the SDK sets them, in its order.
_NOT_NONE, _TRUTHY = 0, 1
_HOST_FIELDS: tuple[tuple[str, str, int], ...] = (
    ("mem_limit", "Memory", _NOT_NONE),
    ("memswap_limit", "MemorySwap", _NOT_NONE),
    ("mem_reservation", "MemoryReservation", _TRUTHY),
    ("mem_swappiness", "MemorySwappiness", _NOT_NONE),
    ("shm_size", "ShmSize", _NOT_NONE),
    ("pid_mode", "PidMode", _TRUTHY),
    ("ipc_mode", "IpcMode", _TRUTHY),
    ("privileged", "Privileged", _TRUTHY),
    ("oom_kill_disable", "OomKillDisable", _TRUTHY),
    ("oom_score_adj", "OomScoreAdj", _TRUTHY),
    ("publish_all_ports", "PublishAllPorts", _TRUTHY),
    ("read_only", "ReadonlyRootfs", _NOT_NONE),
    ("dns_search", "DnsSearch", _TRUTHY),
    ("network_mode", "NetworkMode", -1),  # always: "default" when not given
    ("restart_policy", "RestartPolicy", _TRUTHY),
    ("cap_add", "CapAdd", _TRUTHY),
    ("cap_drop", "CapDrop", _TRUTHY),
    ("devices", "Devices", _TRUTHY),
    ("group_add", "GroupAdd", _TRUTHY),
    ("dns", "Dns", _NOT_NONE),
    ("dns_opt", "DnsOptions", _NOT_NONE),
    ("security_opt", "SecurityOpt", _NOT_NONE),
    ("sysctls", "Sysctls", _TRUTHY),
    ("binds", "Binds", _NOT_NONE),
    ("port_bindings", "PortBindings", _NOT_NONE),
    ("extra_hosts", "ExtraHosts", _NOT_NONE),
    ("cgroup_parent", "CgroupParent", _NOT_NONE),
    ("ulimits", "Ulimits", _NOT_NONE),
    ("log_config", "LogConfig", _NOT_NONE),
    ("cpu_quota", "CpuQuota", _TRUTHY),
    ("cpu_period", "CpuPeriod", _TRUTHY),
    ("cpu_shares", "CpuShares", _TRUTHY),
    ("cpuset_cpus", "CpusetCpus", _TRUTHY),
    ("cpuset_mems", "CpusetMems", _TRUTHY),
    ("tmpfs", "Tmpfs", _TRUTHY),
    ("userns_mode", "UsernsMode", _TRUTHY),
    ("uts_mode", "UTSMode", _TRUTHY),
    ("pids_limit", "PidsLimit", _TRUTHY),
    ("auto_remove", "AutoRemove", _TRUTHY),
    ("storage_opt", "StorageOpt", _NOT_NONE),
    ("init", "Init", _NOT_NONE),
    ("nano_cpus", "NanoCpus", _TRUTHY),
    ("runtime", "Runtime", _TRUTHY),
    ("mounts", "Mounts", _NOT_NONE),
    ("device_requests", "DeviceRequests", _NOT_NONE),
    ("cgroupns", "CgroupnsMode", _TRUTHY),
)
HOST_KEYWORDS = frozenset(k for k, _, _ in _HOST_FIELDS)


def _convert(keyword: str, value: Any) -> Any:
    if keyword == "devices":
        from docker.utils import parse_devices

        return parse_devices(value)
    if keyword == "port_bindings":
        from docker.utils import convert_port_bindings

        return convert_port_bindings(value)
    if keyword == "tmpfs" and not isinstance(value, dict):
        from docker.utils.utils import convert_tmpfs_mounts

        return convert_tmpfs_mounts(value)
    if keyword == "group_add":
        return [str(g) for g in value]
    if keyword == "sysctls":
        return {k: str(v) for k, v in value.items()}
    if keyword == "ulimits":
        return [dict(u) for u in value]
    if keyword == "log_config":
        return {"Type": value.get("type", value.get("Type")), "Config": value.get("config", value.get("Config")) or {}}
    if keyword in ("userns_mode", "uts_mode") and value != "host":
        raise BodyError(f"Invalid value for {keyword} param: {value}")
    return value


def host_config(**given: Any) -> JSONObject:
    """HostConfig's dict for these keywords (only those of _HOST_FIELDS: another is a bug, a TypeError)."""
    unknown = set(given) - HOST_KEYWORDS
    if unknown:
        raise TypeError(f"host_config() got unexpected keywords {sorted(unknown)}")
    if given.get("network_mode") == "host" and given.get("port_bindings"):
        raise BodyError('"host" network_mode is incompatible with port_bindings')
    out: JSONObject = {}
    for keyword, name, when in _HOST_FIELDS:
        value = given.get(keyword)
        if when == -1:
            out[name] = value or "default"
        elif (value is not None) if when == _NOT_NONE else bool(value):
            out[name] = _convert(keyword, value)
    return out


def container_config(
    image: str,
    command: list[str] | None,
    host: Mapping[str, Any],
    environment: list[str],
    labels: Mapping[str, str],
    detach: bool = False,
    hostname: str | None = None,
    user: str | None = None,
    stdin_open: bool = False,
    tty: bool = False,
    entrypoint: list[str] | None = None,
    working_dir: str | None = None,
    domainname: str | None = None,
    stop_signal: str | None = None,
    stop_timeout: int | None = None,
    ports: list[Any] | None = None,
    volumes: list[str] | None = None,
) -> JSONObject:
    """ContainerConfig's dict: the streams attached as a foreground run attaches them; `ports` (exposed: a port,
    or a (port, protocol) pair) and `volumes` (anonymous ones) as the API's mappings."""
    attach = not detach
    exposed: JSONObject | None = None
    if ports is not None:
        exposed = {}
        for port in ports:
            number, proto = (port, "tcp") if not isinstance(port, tuple) else (port[0], "tcp")
            if isinstance(port, tuple) and len(port) == 2:
                proto = port[1]
            exposed[f"{number}/{proto}"] = {}
    return {
        "Hostname": hostname,
        "Domainname": domainname,
        "ExposedPorts": exposed,
        "User": str(user) if user is not None else None,
        "Tty": tty,
        "OpenStdin": stdin_open,
        "StdinOnce": attach and stdin_open,
        "AttachStdin": attach and stdin_open,
        "AttachStdout": attach,
        "AttachStderr": attach,
        "Env": environment,
        "Cmd": command,
        "Image": image,
        "Volumes": None if volumes is None else {v: {} for v in volumes},
        "NetworkDisabled": False,
        "Entrypoint": entrypoint,
        "WorkingDir": working_dir,
        "HostConfig": dict(host),
        "NetworkingConfig": None,
        "MacAddress": None,
        "Labels": dict(labels),
        "StopSignal": stop_signal,
        "Healthcheck": None,
        "StopTimeout": stop_timeout,
        "Runtime": None,
    }
