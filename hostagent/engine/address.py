"""Where the Docker daemon is, read once, the way every Docker tool reads it: DOCKER_HOST with
DOCKER_TLS_VERIFY/DOCKER_CERT_PATH (the SDK's `kwargs_from_env`), else the Docker context that DOCKER_CONTEXT or the
config file's `currentContext` names (the SDK's `ContextAPI`), else the default socket."""

from __future__ import annotations

import json
import os

from gpupin.core.errors import DockerUnavailableError
from gpupin.hostagent import INSTALL_HINT

# What answers there: podman says its version in this header on every answer (gpupin.hostagent.engine.podman);
# Docker does not.
PODMAN_HEADER = "Libpod-Api-Version"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

DEFAULT_HOST = "unix:///var/run/docker.sock"
DAEMON_HINT = "start dockerd, or point DOCKER_HOST (or `docker context use`) at a running one"


def sdk_missing() -> DockerUnavailableError:
    """The error when the docker SDK, which every talk with the daemon goes through, is not installed."""
    return DockerUnavailableError("the docker SDK is not installed", INSTALL_HINT)


class Endpoint:
    """The daemon's address as the SDK takes it (`url`), its TLS settings, and where they came from."""

    __slots__ = ("origin", "tls", "url")

    def __init__(self, url: str, tls: Any = None, origin: str = "default") -> None:
        self.url = url
        self.tls = tls
        self.origin = origin

    @property
    def unix_path(self) -> str | None:
        """The socket's path for a unix:// address (read without the SDK), else None."""
        if not self.url.startswith("unix://"):
            return None
        path = self.url[len("unix://") :]
        return path if path.startswith("/") else "/" + path if path else "/var/run/docker.sock"

    def lock_key(self) -> str:
        """One text per daemon for this machine's own lock: a unix socket by its real path (links resolved), so
        that unix:///var/run/docker.sock and unix:///run/docker.sock are one key, and a daemon restart keeps it."""
        path = self.unix_path
        return "unix:" + os.path.realpath(path) if path is not None else self.url.lower()


def _context_name(environ: Mapping[str, str]) -> str:
    """DOCKER_CONTEXT, else the config file's currentContext (as the docker CLI reads them), else "default"."""
    name = environ.get("DOCKER_CONTEXT")
    if name:
        return name
    config_dir = environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    try:
        with open(os.path.join(config_dir, "config.json"), encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return "default"
    value = data.get("currentContext") if isinstance(data, dict) else None
    return str(value) if value else "default"


def _from_sdk(environ: Mapping[str, str], context: str | None) -> Endpoint:
    try:
        from docker.context import ContextAPI
        from docker.utils import kwargs_from_env
    except ImportError:
        raise sdk_missing() from None
    if context is None:
        try:
            params = kwargs_from_env(environment=dict(environ))
        except Exception as err:  # docker.errors.TLSParameterError: missing certificate files
            raise DockerUnavailableError(
                f"DOCKER_TLS_VERIFY/DOCKER_CERT_PATH ({environ.get('DOCKER_CERT_PATH') or '~/.docker'}): {err}",
                "DOCKER_CERT_PATH must hold ca.pem, cert.pem and key.pem, as for the docker CLI",
            ) from None
        return Endpoint(str(params.get("base_url") or DEFAULT_HOST), params.get("tls"), "DOCKER_HOST")
    try:
        ctx = ContextAPI.get_context(context)
    except Exception as err:  # docker.errors.ContextException: an unreadable context store
        raise DockerUnavailableError(
            f"the Docker context {context!r} cannot be read: {err}", "`docker context ls` lists the contexts"
        ) from None
    if ctx is None:
        raise DockerUnavailableError(
            f"the Docker context {context!r} does not exist",
            "`docker context ls` lists the contexts; `docker context use NAME` picks one",
        )
    return Endpoint(str(ctx.Host or DEFAULT_HOST), ctx.TLSConfig, f"context {context}")


_ENDPOINT: Endpoint | None = None


def endpoint() -> Endpoint:
    """Where the daemon is: read once per process, in one place, as the docker CLI and SDK read it."""
    global _ENDPOINT
    if _ENDPOINT is None:
        env = os.environ
        host = env.get("DOCKER_HOST")
        if host:
            # TLS settings mean nothing on a unix socket (the SDK ignores them there too); plain tcp:// without them
            # is read as the SDK reads it, without its import.
            plain = host.startswith("unix://") or (
                host.startswith("tcp://") and not env.get("DOCKER_TLS_VERIFY") and not env.get("DOCKER_CERT_PATH")
            )
            _ENDPOINT = Endpoint(host, None, "DOCKER_HOST") if plain else _from_sdk(env, None)
        else:
            name = _context_name(env)
            _ENDPOINT = Endpoint(DEFAULT_HOST) if name == "default" else _from_sdk(env, name)
    return _ENDPOINT


def docker_host() -> str:
    """The daemon's address, for messages."""
    ep = endpoint()
    return ep.url if ep.origin in ("default", "DOCKER_HOST") else f"{ep.url} ({ep.origin})"
