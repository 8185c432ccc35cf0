"""Whether gpupin-entrypoint proved a container's cards, read from what the container says of itself (its
`docker inspect` data): the ledger shows it beside each holder, and the resident agent's metrics export it."""

from __future__ import annotations

from gpupin.core.contract import EXPECT_VAR
from gpupin.core.errors import EX_MISALIGNED, EX_UNAVAILABLE, EX_USAGE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# The entrypoint's refusals: it stops before the workload with one of these (docs/exit-codes.md).
_REFUSALS = frozenset({EX_MISALIGNED, EX_UNAVAILABLE, EX_USAGE})


def verified(inspect: Mapping[str, Any]) -> bool | None:
    """Whether gpupin-entrypoint proved the container's cards, where the container says so: its process is
    gpupin-entrypoint and its environment names an expectation (GPUPIN_EXPECT). The entrypoint starts the workload
    only once every card is proven, and otherwise exits with a refusal: so True once the container runs or has ended
    otherwise, False when it ended with a refusal; None when the container does not say (another entrypoint, or no
    expectation)."""
    path = str(inspect.get("Path") or "")
    env = (inspect.get("Config") or {}).get("Env") or ()
    if path.rsplit("/", 1)[-1] != "gpupin-entrypoint" or not any(e.startswith(EXPECT_VAR + "=") for e in env):
        return None
    st = inspect.get("State") or {}
    if str(st.get("Status") or "") == "exited":
        return int(st.get("ExitCode") or 0) not in _REFUSALS
    return True
