"""The one table of the ways a container can hold a card (FORMS), each row read from the container's
`docker inspect` data by a reader of its family: requests an engine hands out (requests), a runtime's reading of
the environment (environment), device nodes (devices). `hostagent run`'s conflict check, `hostagent ls` and
compose all read holders through it. A new way is one reader function and one row."""

from __future__ import annotations

from gpupin.hostagent.ledger import devices, environment, requests

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from gpupin.hostagent.ledger.grant import Grant, Host


class Form:
    """One row of the table: a name, the way in a word (what `ls` says of a pinned holder), and how the cards
    given that way are read from `docker inspect` data."""

    __slots__ = ("name", "read", "way")

    def __init__(self, name: str, way: str, read: Callable[[Mapping[str, Any], Host], list[Grant]]) -> None:
        self.name = name
        self.way = way
        self.read = read


FORMS: tuple[Form, ...] = (
    Form("device-request", "--gpus", requests.device_requests),
    Form("cdi", "CDI", requests.cdi_devices),
    Form("cdi-annotation", "a CDI annotation", requests.cdi_annotations),
    Form("nvidia-runtime", "--runtime nvidia", environment.runtime_env),
    Form("swarm-resource", "DOCKER_RESOURCE_*", environment.swarm_resources),
    Form("device-file", "device file", devices.device_files),
    Form("bind-mount", "a bind mount of device files", devices.bind_mounts),
    Form("device-cgroup", "--device-cgroup-rule", devices.device_cgroup),
    Form("privileged", "--privileged", devices.privileged),
)
WAY = {f.name: f.way for f in FORMS}


def grants(inspect: Mapping[str, Any], host: Host) -> list[Grant]:
    """Every way the engine gives this container cards, in FORMS order."""
    return [g for form in FORMS for g in form.read(inspect, host)]
