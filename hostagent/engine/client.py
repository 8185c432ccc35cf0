"""The one client per transport: the hand-made one for a local unix socket (gpupin.hostagent.engine.unix), the docker
SDK's low-level client (docker.APIClient) for tcp, TLS and ssh, and for what needs the SDK's own knowledge (a pull:
its registry credentials). The SDK is imported only then: with requests under it, it costs 60 to 90 ms on a
2-core machine, more than `docker ps` takes to list 500 containers."""

from __future__ import annotations

from gpupin.core.errors import DockerUnavailableError
from gpupin.hostagent.engine.address import DAEMON_HINT, PODMAN_HEADER, docker_host, endpoint, sdk_missing
from gpupin.hostagent.engine.failures import unavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Device requests (--gpus) arrived in Engine API 1.40 (Docker 19.03).
MIN_API = "1.40"
# The newest API version hostagent speaks (the docker SDK 7.1's default; the create body's fields are all older).
MAX_API = "1.45"


def version_lt(a: str, b: str) -> bool:
    """Whether API version `a` is older than `b` (docker.utils.version_lt, without the SDK)."""
    return tuple(int(p) for p in a.split(".")) < tuple(int(p) for p in b.split("."))


def _keep_daemon_ca(api: Any) -> None:
    """The daemon's CA (DOCKER_CERT_PATH, or a context's) is the one to verify it with, as in the docker CLI.
    requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE replace a session's `verify` (psf/requests#3829, open since
    2017), which would check the daemon against the system's CAs instead."""
    merge = api.merge_environment_settings

    def merged(url: Any, proxies: Any, stream: Any, verify: Any, cert: Any) -> Any:
        settings = merge(url, proxies, stream, verify, cert)
        if verify is None:  # nothing asked for this request: the session's setting, not the environment's
            settings["verify"] = api.verify
        return settings

    api.merge_environment_settings = merged


def connect(timeout: float | None = 60.0, version: str | None = None) -> Any:
    """A client of the daemon (UnixClient on a unix socket, else the SDK's), or DockerUnavailableError (69) with
    the address and a hint; `version`: that API version, else the one negotiated as the docker CLI does it, from
    `GET /_ping`'s API-Version header (the SDK's "auto" asks `GET /version`, which makes the daemon query containerd
    and runc and costs ~8 ms a call)."""
    path = endpoint().unix_path
    if path is None:
        return sdk(timeout, version)
    from gpupin.hostagent.engine.unix import UnixClient

    api = UnixClient(version, path, timeout)
    if version is not None:
        return api
    try:
        answer = api.open("GET", "/_ping", versioned=False)
        answer.body()
    except Exception as err:  # the socket's errors, a refusal
        raise unavailable(err) from None
    server = answer.headers.get("api-version") or ""
    _check(server, answer.status)
    api.api_version = MAX_API if version_lt(MAX_API, server) else server
    api.gpupin_server_version = server
    return api


def _check(server: str, status: int) -> None:
    if status != 200 or not server:
        raise DockerUnavailableError(
            f"the Docker daemon at {docker_host()} answered /_ping with {status} and no API version", DAEMON_HINT
        )
    if version_lt(server, MIN_API):
        raise DockerUnavailableError(
            f"the Docker daemon at {docker_host()} speaks API {server}; device requests "
            f"(--gpus) need {MIN_API} (Docker 19.03) or newer",
            "upgrade Docker",
        )


def sdk_of(api: Any) -> Any:
    """The SDK's client for the daemon `api` talks to, in its API version (`api` itself when it is one)."""
    from gpupin.hostagent.engine.unix import UnixClient

    return sdk(api.timeout, api.api_version) if isinstance(api, UnixClient) else api


def follower(version: str) -> Any:
    """The client that follows a created container (gpupin.hostagent.run.start), in the API version it was made in."""
    path = endpoint().unix_path
    if path is not None:
        from gpupin.hostagent.engine.unix import UnixClient

        return UnixClient(version, path)
    from gpupin.hostagent.engine.sdk_follow import SdkFollower

    return SdkFollower(sdk(60.0, version))


def sdk(timeout: float | None = 60.0, version: str | None = None) -> Any:
    """A docker.APIClient talking to the daemon, its version negotiated from `GET /_ping` (or `version`)."""
    ep = endpoint()
    try:
        import docker
        from docker.constants import DEFAULT_DOCKER_API_VERSION
    except ImportError:
        raise sdk_missing() from None

    def client(v: str) -> Any:
        # ssh:// as the docker CLI does it (the ssh binary, `docker system dial-stdio` on the far side).
        api = docker.APIClient(
            base_url=ep.url, tls=ep.tls or False, version=v, timeout=timeout, use_ssh_client=ep.url.startswith("ssh://")
        )
        if ep.tls:
            _keep_daemon_ca(api)
        return api

    try:
        api = client(version or MIN_API)
        if version is not None:
            return api
        ping = api.get(api.base_url + "/_ping", timeout=timeout)  # APIClient is a requests.Session
    except Exception as err:  # the SDK's, requests' and the socket's errors alike
        raise unavailable(err) from None
    server = ping.headers.get("Api-Version") or ""
    _check(server, ping.status_code)
    agreed = DEFAULT_DOCKER_API_VERSION if version_lt(DEFAULT_DOCKER_API_VERSION, server) else server
    api = client(agreed)
    api.gpupin_server_version = server  # the daemon's own API version (the agreed one may be the SDK's, lower)
    api.gpupin_podman = ping.headers.get(PODMAN_HEADER)  # podman's version (gpupin.hostagent.engine.podman)
    return api
