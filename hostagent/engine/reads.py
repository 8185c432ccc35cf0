"""Reads from the daemon, with the daemon's clock, through either client (gpupin.hostagent.engine.client)."""

from __future__ import annotations

import json

from gpupin.core.errors import DockerUnavailableError
from gpupin.hostagent import http1
from gpupin.hostagent.engine.address import PODMAN_HEADER, docker_host, endpoint
from gpupin.hostagent.engine.client import connect
from gpupin.hostagent.engine.failures import LOG_HINT, EngineNotFound, unavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _decode(path: str, status: int, body: bytes) -> Any:
    if status == 404:
        raise EngineNotFound(body.decode(errors="replace"))
    if status != 200:
        raise DockerUnavailableError(
            f"GET {path} on {docker_host()} answered {status or 'nonsense'}: "
            f"{body.decode(errors='replace').strip()[:200]}",
            LOG_HINT,
        )
    try:
        return json.loads(body)
    except ValueError:
        raise DockerUnavailableError(
            f"GET {path} on {docker_host()}: the answer was cut off or is not JSON ({len(body)} bytes)",
            "retry; see the daemon's log if it persists",
        ) from None


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(text: str | None) -> float | None:
    """An HTTP Date header (`Mon, 30 Nov 2026 10:45:01 GMT`, what the daemon's Go server sends) in seconds."""
    import datetime

    try:
        _, day, month, year, clock, _zone = (text or "").split()
        h, m, s = (int(x) for x in clock.split(":"))
        when = datetime.datetime(int(year), _MONTHS.index(month) + 1, int(day), h, m, s, tzinfo=datetime.timezone.utc)
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


def fetch(
    api: Any, path: str, params: Mapping[str, str] | None = None, versioned: bool = True, timeout: float | None = None
) -> tuple[Any, float | None]:
    """GET an Engine path through either client: (JSON, the daemon's clock); 404 is EngineNotFound, any other
    failure a one-line DockerUnavailableError. `versioned=False` asks in the daemon's own API version, so that
    fields newer than the client's version are there too. `timeout`: for this call alone (else the client's)."""
    from gpupin.hostagent.engine.unix import UnixClient

    if isinstance(api, UnixClient):
        try:
            status, date, body = api.read(path, params, versioned, timeout)
        except OSError as err:
            raise unavailable(err) from None
        return _decode(path, status, body), http_date(date)
    prefix = f"/v{api.api_version}" if versioned else ""
    try:
        res = api.get(
            f"{api.base_url}{prefix}{http1.quote(path, '/:')}",
            params=dict(params or {}),
            timeout=timeout if timeout is not None else api.timeout,
        )
        body = res.content
    except Exception as err:
        raise unavailable(err) from None
    if res.headers.get(PODMAN_HEADER):  # podman says its version on every answer
        api.gpupin_podman = res.headers[PODMAN_HEADER]
    return _decode(path, res.status_code, body), http_date(res.headers.get("Date"))


def reader(timeout: float | None = 60.0) -> Any:
    """A client for ledger reads, in the daemon's own API version on a unix socket (no ping), else the SDK's."""
    path = endpoint().unix_path
    if path is None:
        return connect(timeout)
    from gpupin.hostagent.engine.unix import UnixClient

    return UnixClient(None, path, timeout)
