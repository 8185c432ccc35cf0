"""The Docker Engine adapter: the docker SDK's low-level client, and its errors turned into hostagent's.

The SDK is imported lazily (it costs ~0.1 s), so that `hostagent --help` and the NVML half of `hostagent ls` work
without it. The address is the SDK's: DOCKER_HOST, else the default socket.
"""

from __future__ import annotations

import os

from hostagent.errors import (
    EX_CANNOT_INVOKE,
    EX_NOT_FOUND,
    DockerRefusedError,
    DockerUnavailableError,
)
from hostagent.ledger import LABEL, Holder, foreign_holder, pinned_holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from entrypoint.nvml import Card

DEFAULT_HOST = "unix:///var/run/docker.sock"


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def connect(timeout: float | None = 60.0, version: str = "auto") -> Any:
    """A docker.APIClient talking to the daemon, or DockerUnavailableError (69) with the address and a hint."""
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        raise DockerUnavailableError(
            "the docker SDK is not installed", "install the host side: pip install 'gpupin[host]'") from None
    try:
        return docker.APIClient(base_url=docker_host(), version=version, timeout=timeout)
    except DockerException as err:
        raise DockerUnavailableError(
            f"the Docker daemon at {docker_host()} does not answer: {_short(err)}",
            "start dockerd, or point DOCKER_HOST at a running one (`make sandbox-up` prints the sandbox's)",
        ) from None


def _short(err: BaseException) -> str:
    text = str(getattr(err, "explanation", None) or err)
    return text.strip().splitlines()[-1] if text.strip() else type(err).__name__


def refused(err: BaseException, doing: str) -> DockerRefusedError:
    """A daemon refusal, coded as `docker run` codes it: 127 command not found, 126 not runnable, else 125."""
    text = _short(err)
    code = 125
    low = text.lower()
    if "executable file not found" in low or ("no such file or directory" in low and "exec" in low):
        code = EX_NOT_FOUND
    elif "permission denied" in low and "exec" in low:
        code = EX_CANNOT_INVOKE
    return DockerRefusedError(f"{doing}: {text}", None, code)


def is_api_error(err: BaseException) -> bool:
    try:
        from docker.errors import APIError
    except ImportError:
        return False
    return isinstance(err, APIError)


def is_sdk_error(err: BaseException) -> bool:
    try:
        from docker.errors import DockerException
    except ImportError:
        return False
    return isinstance(err, DockerException)


def is_not_found(err: BaseException) -> bool:
    try:
        from docker.errors import NotFound
    except ImportError:
        return False
    return isinstance(err, NotFound)


def read_holders(api: Any, cards: Sequence[Card], include_foreign: bool = True) -> list[Holder]:
    """Every pinned container (any state) and every running container given GPUs by other means."""
    holders: list[Holder] = []
    for summary in api.containers(all=True, filters={"label": LABEL}):
        h = pinned_holder(summary)
        if h is not None:
            holders.append(h)
    if include_foreign:
        pinned_ids = {h.id for h in holders}
        # Device requests are not in the list summary: inspect the running containers that are not ours.
        for summary in api.containers():
            if summary["Id"] in pinned_ids:
                continue
            try:
                f = foreign_holder(api.inspect_container(summary["Id"]), cards)
            except Exception as err:
                if is_not_found(err):
                    continue  # it went away between the list and the inspect
                raise
            if f is not None:
                holders.append(f)
    return holders
