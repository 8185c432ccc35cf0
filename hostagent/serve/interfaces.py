"""What the agent's parts see of one another, declared once: the caller (`Peer`, gpupin.hostagent.serve.api's),
the request being answered (`Handler`, api's), and the agent (`Agent`, gpupin.hostagent.serve.agent's, which makes
the parts: they cannot import it back without a cycle)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import threading
    from io import BufferedIOBase
    from typing import Any, Protocol

    from gpupin.core import JSONObject
    from gpupin.hostagent.ls.model import Listing
    from gpupin.hostagent.record.writer import RecordWriter
    from gpupin.hostagent.serve.hooks import Hooks
    from gpupin.hostagent.serve.owners import Owners
    from gpupin.hostagent.serve.policy_in_force import PolicyInForce

    class Peer(Protocol):
        """The caller on the unix socket, as the kernel named it at accept."""

        pid: int
        uid: int
        gid: int
        groups: frozenset[int]
        start: str
        pidns: str

        def user(self) -> str: ...

    class Handler(Protocol):
        """One request being answered: a JSON answer, or a stream (the queue's)."""

        @property
        def connection(self) -> Any: ...

        @property
        def wfile(self) -> BufferedIOBase: ...

        def answer(self, obj: Any) -> None: ...

        def stream_refused(self) -> bool: ...

        def send_response(self, code: int, message: str | None = None) -> None: ...

        def send_header(self, keyword: str, value: str) -> None: ...

        def end_headers(self) -> None: ...

    class Snapshot(Protocol):
        """The view at one refresh (None while NVML cannot be read), and its JSON form."""

        version: int
        listing: Listing | None
        error: str | None
        read_at: float

        def as_json(self) -> JSONObject | None: ...

    class Agent(Protocol):
        """The agent as its parts (bookings, queue, idle rule, services) use it."""

        in_force: PolicyInForce
        hooks: Hooks
        record: RecordWriter | None
        owners: Owners
        stopping: threading.Event
        started: float

        def snapshot(self) -> Snapshot: ...

        def wait_change(self, version: int, timeout: float) -> Snapshot: ...

        def container_changed(self) -> None: ...

        def end_reason(self, container_id: str, reason: str) -> None: ...

        def finished(self, uid: int, since: float) -> list[tuple[float, float]]: ...
