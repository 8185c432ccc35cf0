"""The Docker Engine adapter, by responsibility: where the daemon is (address), its failures as hostagent's errors
(failures), the SDK's client (client), reads with the daemon's clock (reader), what the daemon says of itself (info),
how it serves CDI (cdi) and its event stream (events). The ledger read from the daemon is gpupin.hostagent.ledger.read.

Callers write `engine.connect()`, `engine.fetch(...)`: the names below are the adapter's surface.
"""

from gpupin.hostagent.engine.address import DAEMON_HINT, DEFAULT_HOST, Endpoint, docker_host, endpoint
from gpupin.hostagent.engine.client import MIN_API, connect
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
from gpupin.hostagent.engine.info import NO_CDI, cdi_detection, daemon_view, info, may_serve_cdi, runtimes
from gpupin.hostagent.engine.reader import EngineReader, created_time, fetch, http_date, reader

__all__ = [
    "DAEMON_HINT",
    "DEFAULT_HOST",
    "MIN_API",
    "NO_CDI",
    "Endpoint",
    "EngineNotFound",
    "EngineReader",
    "EventStream",
    "cdi_detection",
    "connect",
    "created_time",
    "daemon_view",
    "docker_host",
    "endpoint",
    "failure",
    "fetch",
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
]
