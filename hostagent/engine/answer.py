"""The daemon's JSON answers, named once as the edge they are: the adapter passes them on as parsed, and the
ledger, the record and the agent read them into their own types."""

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    # An edge: the daemon's JSON answer (an inspect, /info, an event) as it came, before it is read.
    DaemonAnswer: TypeAlias = dict[str, Any]
