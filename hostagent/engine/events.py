"""The daemon's event stream (`docker events`, a streaming GET /events), for the resident agent: it re-reads the
ledger when a container changes instead of polling the daemon."""

from __future__ import annotations

import contextlib
import threading

from gpupin.hostagent.engine.client import connect
from gpupin.hostagent.engine.failures import unavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer

CONNECT_TIMEOUT = 10.0  # seconds the daemon may take to answer the stream's opening ping


class EventStream:
    """Container events as the daemon sends them (decoded JSON objects), until the daemon ends the stream or
    `close()` is called from another thread. Opening it connects (DockerUnavailableError, 69, when it cannot)."""

    def __init__(self) -> None:
        # The ping that opens it has a timeout, so a wedged daemon is tried again rather than waited on forever;
        # the stream itself has none (the SDK reads events without one): it is silent while nothing changes.
        self._api = connect(timeout=CONNECT_TIMEOUT)
        self._lock = threading.Lock()
        self._closed = False
        try:
            self._stream: Any = self._api.events(decode=True, filters={"type": "container"})
        except Exception as err:
            raise unavailable(err) from None

    def __iter__(self) -> Iterator[DaemonAnswer]:
        try:
            for event in self._stream:
                if isinstance(event, dict):
                    yield event
        except Exception as err:  # the daemon went away mid-stream, or close() cut the socket
            if not self._closed:
                raise unavailable(err) from None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # The SDK's CancellableStream shuts the socket down, so a blocked read returns; it may be gone already.
        with contextlib.suppress(Exception):
            self._stream.close()
        self._api.close()
