"""The Docker Engine adapter, by responsibility: where the daemon is (address), its failures as hostagent's errors
(failures), its clients, one per transport (client, unix), reads with the daemon's clock (reads), what the daemon
says of itself (daemon), how it serves CDI (cdi) and its event stream (events). The ledger read from the daemon is
gpupin.hostagent.ledger.read.

Callers write `engine.connect()`, `engine.fetch(...)`: the names below are the adapter's surface.
The names are loaded when first used (PEP 562): `hostagent run` through the agent uses the address, the failures
and the unix socket's client only, and its start-up is a headline figure (docs/benchmarks.md).
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.hostagent.engine.address import (
        DAEMON_HINT,
        DEFAULT_HOST,
        PODMAN_HEADER,
        Endpoint,
        docker_host,
        endpoint,
    )
    from gpupin.hostagent.engine.client import MIN_API, connect, follower, sdk_of
    from gpupin.hostagent.engine.daemon import NO_CDI, cdi_detection, daemon_view, info, may_serve_cdi, runtimes
    from gpupin.hostagent.engine.events import EventStream
    from gpupin.hostagent.engine.failures import (
        EngineNotFound,
        failure,
        is_api_error,
        is_conflict,
        is_daemon_failure,
        is_not_found,
        is_sdk_error,
        refused,
    )
    from gpupin.hostagent.engine.reads import created_time, fetch, http_date, reader

# Where each name lives (its module under this package).
_WHERE = {
    **dict.fromkeys(("DAEMON_HINT", "DEFAULT_HOST", "PODMAN_HEADER", "Endpoint", "docker_host", "endpoint"), "address"),
    **dict.fromkeys(("MIN_API", "connect", "follower", "sdk_of"), "client"),
    "EventStream": "events",
    **dict.fromkeys(
        ("EngineNotFound", "failure", "is_api_error", "is_conflict", "is_daemon_failure", "is_not_found"),
        "failures",
    ),
    **dict.fromkeys(("is_sdk_error", "refused"), "failures"),
    **dict.fromkeys(("NO_CDI", "cdi_detection", "daemon_view", "info", "may_serve_cdi", "runtimes"), "daemon"),
    **dict.fromkeys(("created_time", "fetch", "http_date", "reader"), "reads"),
}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        __import__(f"{__name__}.{module}")  # not importlib's import_module: importlib imports warnings
        value = getattr(sys.modules[f"{__name__}.{module}"], name)
        globals()[name] = value
        return value


__all__ = [
    "DAEMON_HINT",
    "DEFAULT_HOST",
    "MIN_API",
    "NO_CDI",
    "PODMAN_HEADER",
    "Endpoint",
    "EngineNotFound",
    "EventStream",
    "cdi_detection",
    "connect",
    "created_time",
    "daemon_view",
    "docker_host",
    "endpoint",
    "failure",
    "fetch",
    "follower",
    "http_date",
    "info",
    "is_api_error",
    "is_conflict",
    "is_daemon_failure",
    "is_not_found",
    "is_sdk_error",
    "may_serve_cdi",
    "reader",
    "refused",
    "runtimes",
    "sdk_of",
]
