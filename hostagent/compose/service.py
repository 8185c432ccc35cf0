"""The parts of one compose service that the rules read beside its GPU request: its environment, labels, replicas
and `deploy.resources.reservations`, each in both of compose's spellings (list or mapping) where it has two.

A part written in a shape compose does not take is a ServiceError naming the service and the key.
"""

from __future__ import annotations

from gpupin.hostagent.compose.problems import ServiceError, quoted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from gpupin.hostagent.yamlfile import YAMLMapping


def mapping(value: Any, service: str, where: str) -> dict[Any, Any]:
    """A part that compose takes as a mapping: {} when absent, a ServiceError naming `where` when it is not one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceError(
            service,
            f"`{where}` is not a mapping (it is {quoted(value, 30)})",
            f"write {where} as a mapping of keys, as the compose specification has it",
        )
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
                raise ServiceError(
                    service,
                    f"environment entry {quoted(item)} is not KEY=VALUE",
                    "write environment entries as KEY=VALUE strings, or as a mapping",
                )
            key, eq, value = item.partition("=")
            out[key] = value if eq else None
        return out
    raise ServiceError(
        service,
        f"`environment` is neither a list nor a mapping (it is {quoted(env, 30)})",
        "write it as a list of KEY=VALUE, or as a mapping of KEY: VALUE",
    )


def with_file_env(svc: Any, from_files: Mapping[str, str | None] | None, service: str) -> Any:
    """The service as compose hands it to the container: the variables of its `env_file:` files under its
    `environment` (which wins), so that every rule and request form reads one environment, whichever model
    (compose v2's, which merges them itself, or hostagent's) read the files."""
    if not from_files or not isinstance(svc, dict):
        return svc
    return {**svc, "environment": {**from_files, **env_entries(svc, service)}}


def label_entries(svc: Mapping[str, Any], service: str) -> dict[str, str]:
    labels = svc.get("labels")
    if labels is None:
        return {}
    if isinstance(labels, dict):
        return {str(k): "" if v is None else str(v) for k, v in labels.items()}
    if isinstance(labels, list):
        return dict(str(item).partition("=")[::2] for item in labels)
    raise ServiceError(
        service,
        f"`labels` is neither a list nor a mapping (it is {quoted(labels, 30)})",
        "write it as a list of KEY=VALUE, or as a mapping of KEY: VALUE",
    )


def replicas(svc: Mapping[str, Any], service: str) -> int:
    """How many containers compose starts for the service: `deploy.replicas`, else `scale`, else 1."""
    deploy = mapping(svc.get("deploy"), service, "deploy")
    for key, value in (("deploy.replicas", deploy.get("replicas")), ("scale", svc.get("scale"))):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServiceError(
                service, f"`{key}: {quoted(value)}` is not a number of containers", "give a whole number >= 0"
            )
        return value
    return 1


def reservations(svc: Mapping[str, Any], service: str) -> dict[Any, Any]:
    """deploy.resources.reservations as written: each level a mapping (absent: empty), or ServiceError."""
    deploy = mapping(svc.get("deploy"), service, "deploy")
    resources = mapping(deploy.get("resources"), service, "deploy.resources")
    return mapping(resources.get("reservations"), service, "deploy.resources.reservations")


def reserved_list(svc: YAMLMapping, key: str, create: bool = False) -> list[Any]:
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


def device_list(svc: YAMLMapping, create: bool = False) -> list[Any]:
    """deploy.resources.reservations.devices, created on the way when asked."""
    return reserved_list(svc, "devices", create)
