"""The Docker Engine adapter: where the daemon is, the docker SDK's low-level client, the ledger read from the
daemon, and the daemon's failures turned into hostagent's one-line errors.

Where the daemon is (`endpoint`) is read once, the way every Docker tool reads it: DOCKER_HOST with
DOCKER_TLS_VERIFY/DOCKER_CERT_PATH (the SDK's `kwargs_from_env`), else the Docker context that DOCKER_CONTEXT or
the config file's `currentContext` names (the SDK's `ContextAPI`), else the default socket. The SDK is imported
lazily: with requests under it, it costs 60 to 90 ms on a 2-core machine, more than `docker ps` takes to list 500
containers. So a plain unix socket is read without it: the ledger's reads (list, inspect) go through
`EngineReader`, a few lines of the standard library; every other transport (tcp, TLS, ssh) goes through the SDK.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from gpupin.entrypoint.errors import GpupinError
from gpupin.hostagent import cdi, lease, ledger
from gpupin.hostagent.errors import (
    EX_CANNOT_INVOKE,
    EX_NOT_FOUND,
    DockerRefusedError,
    DockerUnavailableError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card

DEFAULT_HOST = "unix:///var/run/docker.sock"
# Device requests (--gpus) arrived in Engine API 1.40 (Docker 19.03).
MIN_API = "1.40"
DAEMON_HINT = "start dockerd, or point DOCKER_HOST (or `docker context use`) at a running one"


# --- where the daemon is ---------------------------------------------------------------------------------------

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
        path = self.url[len("unix://"):]
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
            data = json.load(fh)
    except (OSError, ValueError):
        return "default"
    value = data.get("currentContext") if isinstance(data, dict) else None
    return str(value) if value else "default"


def _from_sdk(environ: Mapping[str, str], context: str | None) -> Endpoint:
    try:
        from docker.context import ContextAPI
        from docker.utils import kwargs_from_env
    except ImportError:
        raise DockerUnavailableError("the docker SDK is not installed",
                                     "install the host side: pip install 'gpupin[host]'") from None
    if context is None:
        try:
            params = kwargs_from_env(environment=dict(environ))
        except Exception as err:  # docker.errors.TLSParameterError: missing certificate files
            raise DockerUnavailableError(
                f"DOCKER_TLS_VERIFY/DOCKER_CERT_PATH ({environ.get('DOCKER_CERT_PATH') or '~/.docker'}): {err}",
                "DOCKER_CERT_PATH must hold ca.pem, cert.pem and key.pem, as for the docker CLI") from None
        return Endpoint(str(params.get("base_url") or DEFAULT_HOST), params.get("tls"), "DOCKER_HOST")
    try:
        ctx = ContextAPI.get_context(context)
    except Exception as err:  # docker.errors.ContextException: an unreadable context store
        raise DockerUnavailableError(f"the Docker context {context!r} cannot be read: {err}",
                                     "`docker context ls` lists the contexts") from None
    if ctx is None:
        raise DockerUnavailableError(f"the Docker context {context!r} does not exist",
                                     "`docker context ls` lists the contexts; `docker context use NAME` picks one")
    return Endpoint(str(ctx.Host or DEFAULT_HOST), ctx.TLSConfig, f"context {context}")


_ENDPOINT: Endpoint | None = None


def endpoint() -> Endpoint:
    """Where the daemon is: read once per process, in one place, as the docker CLI and SDK read it."""
    global _ENDPOINT
    if _ENDPOINT is None:
        env = os.environ
        host = env.get("DOCKER_HOST")
        if host:
            # TLS settings mean nothing on a unix socket (the SDK ignores them there too).
            _ENDPOINT = Endpoint(host, None, "DOCKER_HOST") if host.startswith("unix://") else _from_sdk(env, None)
        else:
            name = _context_name(env)
            _ENDPOINT = Endpoint(DEFAULT_HOST) if name == "default" else _from_sdk(env, name)
    return _ENDPOINT


def docker_host() -> str:
    """The daemon's address, for messages."""
    ep = endpoint()
    return ep.url if ep.origin in ("default", "DOCKER_HOST") else f"{ep.url} ({ep.origin})"


# --- errors ----------------------------------------------------------------------------------------------------

def _short(err: BaseException) -> str:
    text = str(getattr(err, "explanation", None) or err)
    return text.strip().splitlines()[-1] if text.strip() else type(err).__name__


def _unavailable(err: BaseException) -> DockerUnavailableError:
    return DockerUnavailableError(f"the Docker daemon at {docker_host()} does not answer: {_short(err)}",
                                  DAEMON_HINT + " (`make sandbox-up` prints the sandbox's)")


def refused(err: BaseException, doing: str) -> DockerRefusedError:
    """A daemon refusal, coded as `docker run` codes it: 127 command not found, 126 not runnable, else 125."""
    text = _short(err)
    code = 125
    low = text.lower()
    if "executable file not found" in low or ("no such file or directory" in low and "exec" in low):
        code = EX_NOT_FOUND
    elif "permission denied" in low and "exec" in low:
        code = EX_CANNOT_INVOKE
    hint = {EX_NOT_FOUND: "check the command's name (or --entrypoint), or give its full path",
            EX_CANNOT_INVOKE: "the command must be an executable file in the image"}.get(
        code, "fix what the daemon names above; `hostagent run --dry-run` prints the equivalent docker run line")
    return DockerRefusedError(f"{doing}: {text}", hint, code)


def _status(err: BaseException) -> int | None:
    code = getattr(err, "status_code", None)
    if code is None:
        code = getattr(getattr(err, "response", None), "status_code", None)
    return int(code) if isinstance(code, int) else None


def failure(err: BaseException, doing: str) -> GpupinError:
    """Any failure of a daemon call as one line: the daemon's own errors (5xx) and a daemon that cannot be
    reached or drops the connection are 69; what it refuses (4xx) is 125, as `docker run` has it."""
    if isinstance(err, GpupinError):
        return err
    status = _status(err)
    if status is not None and status < 500:
        return refused(err, doing)
    if status is not None:
        return DockerUnavailableError(f"{doing}: the Docker daemon at {docker_host()} failed ({status}): "
                                      f"{_short(err)}", "see the daemon's log (journalctl -u docker), then retry")
    return _unavailable(err)


def is_daemon_failure(err: BaseException) -> bool:
    """An error of the daemon or of the way to it (the SDK's, requests', urllib3's, a socket's), not a bug here."""
    return isinstance(err, OSError) or type(err).__module__.split(".")[0] in ("docker", "requests", "urllib3")


def is_api_error(err: BaseException) -> bool:
    errors = sys.modules.get("docker.errors")
    return errors is not None and isinstance(err, errors.APIError)


def is_sdk_error(err: BaseException) -> bool:
    errors = sys.modules.get("docker.errors")
    return errors is not None and isinstance(err, errors.DockerException)


class EngineNotFound(Exception):
    """A 404 from a read (the SDK raises docker.errors.NotFound)."""


def is_not_found(err: BaseException) -> bool:
    if isinstance(err, EngineNotFound):
        return True
    errors = sys.modules.get("docker.errors")  # never import the SDK just to classify an error
    return errors is not None and isinstance(err, errors.NotFound)


def is_conflict(err: BaseException) -> bool:
    return _status(err) == 409


# --- the SDK client --------------------------------------------------------------------------------------------

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
    """A docker.APIClient talking to the daemon, or DockerUnavailableError (69) with the address and a hint.

    The API version is negotiated as the docker CLI does it, from `GET /_ping`'s API-Version header: the SDK's
    "auto" asks `GET /version`, which makes the daemon query containerd and runc and costs ~8 ms a call.
    """
    ep = endpoint()
    try:
        import docker
        from docker.constants import DEFAULT_DOCKER_API_VERSION
        from docker.utils import version_lt
    except ImportError:
        raise DockerUnavailableError(
            "the docker SDK is not installed", "install the host side: pip install 'gpupin[host]'") from None

    def client(v: str) -> Any:
        # ssh:// as the docker CLI does it (the ssh binary, `docker system dial-stdio` on the far side).
        api = docker.APIClient(base_url=ep.url, tls=ep.tls or False, version=v, timeout=timeout,
                               use_ssh_client=ep.url.startswith("ssh://"))
        if ep.tls:
            _keep_daemon_ca(api)
        return api

    try:
        api = client(version or MIN_API)
        if version is not None:
            return api
        ping = api.get(api.base_url + "/_ping", timeout=timeout)  # APIClient is a requests.Session
    except Exception as err:  # the SDK's, requests' and the socket's errors alike
        raise _unavailable(err) from None
    server = ping.headers.get("Api-Version") or ""
    if ping.status_code != 200 or not server:
        raise DockerUnavailableError(f"the Docker daemon at {docker_host()} answered /_ping with "
                                     f"{ping.status_code} and no API version", DAEMON_HINT)
    if version_lt(server, MIN_API):
        raise DockerUnavailableError(f"the Docker daemon at {docker_host()} speaks API {server}; device requests "
                                     f"(--gpus) need {MIN_API} (Docker 19.03) or newer", "upgrade Docker")
    agreed = DEFAULT_DOCKER_API_VERSION if version_lt(DEFAULT_DOCKER_API_VERSION, server) else server
    api = client(agreed)
    api.gpupin_server_version = server  # the daemon's own API version (the agreed one may be the SDK's, lower)
    return api


# --- reads, with the daemon's clock ----------------------------------------------------------------------------

def _quote(text: str, safe: str = "") -> str:
    """Percent-encode for a URL (what urllib.parse.quote does, without its ~2 ms import)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.~" + safe) else
                   "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def _query(path: str, params: Mapping[str, str] | None) -> str:
    return _quote(path, "/") + ("?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in params.items())
                                if params else "")


def _decode(path: str, status: int, body: bytes) -> Any:
    if status == 404:
        raise EngineNotFound(body.decode(errors="replace"))
    if status != 200:
        raise DockerUnavailableError(f"GET {path} on {docker_host()} answered {status or 'nonsense'}: "
                                     f"{body.decode(errors='replace').strip()[:200]}",
                                     "see the daemon's log (journalctl -u docker), then retry")
    try:
        return json.loads(body)
    except ValueError:
        raise DockerUnavailableError(f"GET {path} on {docker_host()}: the answer was cut off or is not JSON "
                                     f"({len(body)} bytes)", "retry; see the daemon's log if it persists") from None


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(text: str | None) -> float | None:
    """An HTTP Date header (`Mon, 30 Nov 2026 10:45:01 GMT`, what the daemon's Go server sends) in seconds."""
    import datetime

    try:
        _, day, month, year, clock, _zone = (text or "").split()
        h, m, s = (int(x) for x in clock.split(":"))
        when = datetime.datetime(int(year), _MONTHS.index(month) + 1, int(day), h, m, s,
                                 tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    return when.timestamp()


def created_time(text: str) -> float:
    """The Engine's RFC 3339 `Created` (nanoseconds, `Z` or an offset) in seconds since the epoch."""
    import datetime

    date, _, rest = text.partition("T")
    clock = rest[:8]
    frac = ""
    tail = rest[8:]
    if tail.startswith("."):
        digits = len(tail) - len(tail[1:].lstrip("0123456789"))
        frac, tail = tail[1:digits], tail[digits:]
    offset = 0
    if tail not in ("", "Z") and tail[0] in "+-":
        sign = -1 if tail[0] == "+" else 1
        offset = sign * (int(tail[1:3]) * 3600 + int(tail[4:6]) * 60)
    y, mo, d = (int(x) for x in date.split("-"))
    h, m, s = (int(x) for x in clock.split(":"))
    when = datetime.datetime(y, mo, d, h, m, s, tzinfo=datetime.timezone.utc).timestamp()
    return when + offset + (float("0." + frac) if frac else 0.0)


class EngineReader:
    """Read-only Engine API calls over a unix socket, with the method names of docker.APIClient that the ledger
    uses (`containers`, `inspect_container`, `info`). Plain HTTP/1.0 on a socket: the daemon then closes the
    connection after an unchunked body, so no HTTP library (http.client alone costs ~15 ms to import) is needed.
    Unversioned paths: the daemon answers in its own API version."""

    def __init__(self, path: str, timeout: float | None = 60.0) -> None:
        self.path = path
        self.timeout = timeout

    def get(self, path: str, params: Mapping[str, str] | None = None) -> tuple[Any, float | None]:
        """The JSON answer and the daemon's clock (its Date header)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.path)
                sock.sendall(f"GET {_query(path, params)} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
                chunks = []
                while chunk := sock.recv(1 << 16):
                    chunks.append(chunk)
        except OSError as err:
            raise _unavailable(err) from None
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split()
        status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
        date = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln[:5].lower() == "date:"), None)
        return _decode(path, status, body), http_date(date)

    def containers(self, all: bool = False, filters: dict[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"all": "1" if all else "0"}
        if filters:
            params["filters"] = json.dumps({k: [v] for k, v in filters.items()})
        result: list[dict[str, Any]] = self.get("/containers/json", params)[0]
        return result

    def inspect_container(self, cid: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/containers/{cid}/json")[0]
        return result

    def info(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/info")[0]
        return result


def fetch(api: Any, path: str, params: Mapping[str, str] | None = None,
          versioned: bool = True) -> tuple[Any, float | None]:
    """GET an Engine path through either client: (JSON, the daemon's clock); 404 is EngineNotFound, any other
    failure a one-line DockerUnavailableError. `versioned=False` asks in the daemon's own API version (EngineReader
    always does), so that fields newer than the client's version are there too."""
    if isinstance(api, EngineReader):
        return api.get(path, params)
    prefix = f"/v{api.api_version}" if versioned else ""
    try:
        res = api.get(f"{api.base_url}{prefix}{_query(path, None)}", params=dict(params or {}),
                      timeout=api.timeout)
        body = res.content
    except Exception as err:
        raise _unavailable(err) from None
    return _decode(path, res.status_code, body), http_date(res.headers.get("Date"))


def reader(timeout: float | None = 60.0) -> Any:
    """A client for ledger reads: EngineReader on a unix socket, else the SDK."""
    path = endpoint().unix_path
    return EngineReader(path, timeout) if path is not None else connect(timeout)


# --- the ledger, as the daemon has it --------------------------------------------------------------------------

class Book:
    """One reading of the ledger: the holders, the abandoned containers (created by a hostagent whose lease is
    dead or expired, never started), and the daemon's clock at the reading."""

    __slots__ = ("holders", "now", "orphans")

    def __init__(self, holders: list[ledger.Holder], orphans: list[dict[str, Any]], now: float) -> None:
        self.holders = holders
        self.orphans = orphans
        self.now = now


def info(api: Any) -> dict[str, Any]:
    """The daemon's `GET /info`, in its own API version (CDISpecDirs, DiscoveredDevices and Runtimes included)."""
    data: dict[str, Any] = fetch(api, "/info", versioned=False)[0]
    return data


def _runtimes(data: Mapping[str, Any]) -> dict[str, str]:
    return {str(k): str((v or {}).get("path") or "") for k, v in (data.get("Runtimes") or {}).items()}


def cdi_detection(data: Mapping[str, Any]) -> cdi.Detection:
    """Whether the daemon whose /info this is serves nvidia.com/gpu CDI devices (gpupin.hostagent.cdi); its spec
    folders are read only when it runs on this host (a unix socket)."""
    return cdi.detect(data, local=endpoint().unix_path is not None)


def may_serve_cdi(api: Any) -> bool:
    """False for a daemon whose API predates CDI (1.44, Engine 25: CDISpecDirs): its /info (7 ms) need not be
    asked whether it serves CDI devices. True where unknown."""
    server = getattr(api, "gpupin_server_version", None)
    if not server:
        return True
    from docker.utils import version_lt

    return not version_lt(server, cdi.MIN_API)


def read_ledger(api: Any, cards: Sequence[Card], daemon_info: Mapping[str, Any] | None = None) -> Book:
    """Every container that holds a card (ledger.FORMS, ledger.holding), every pinned container that does not
    (for `ls`), and the abandoned ones. One list; an inspect for each container that may hold. `daemon_info`: the
    daemon's /info when the caller has it (else it is asked only if a container names a runtime)."""
    import time

    summaries, now = fetch(api, "/containers/json", {"all": "1"})
    now = now if now is not None else time.time()  # the Go server always sends Date; just in case
    host = ledger.Host(cards, lambda: _runtimes(daemon_info if daemon_info is not None else info(api)))
    holders: list[ledger.Holder] = []
    orphans: list[dict[str, Any]] = []
    for s in summaries:
        state = str(s.get("State") or "")
        labels = s.get("Labels") or {}
        lease_state = None
        if state == "created" and lease.OWNER_LABEL in labels:
            lease_state = lease.state(labels, float(s.get("Created") or 0), now)
            if lease_state != lease.LIVE:
                orphans.append(s)
        h: ledger.Holder | None
        if ledger.worth_inspecting(state, lease_state):
            try:
                h = ledger.holder(fetch(api, f"/containers/{s['Id']}/json")[0], host, lease_state)
            except EngineNotFound:
                continue  # it went away between the list and the inspect
        else:
            h = ledger.label_holder(s, cards)
        if h is not None:
            holders.append(h)
    return Book(holders, orphans, now)


def read_holders(api: Any, cards: Sequence[Card], daemon_info: Mapping[str, Any] | None = None
                 ) -> list[ledger.Holder]:
    """The holders of read_ledger (what `run --dry-run`, `ls` and compose read)."""
    return read_ledger(api, cards, daemon_info).holders
