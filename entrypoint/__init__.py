"""gpupin's in-container side.

`gpupin-entrypoint` (gpupin.entrypoint.cli) proves that every `cuda:k` a workload will see is the physical card that was
asked for, then execs the workload. `assert_pinned` (gpupin.entrypoint.api) does the same check from inside a running
Python workload. Both this side and the host
side (`hostagent`) import the GPU-identity core, gpupin.core, and never each other.

Importing this package is cheap on purpose: it is the first thing the entrypoint's hot path does.
"""

# No `from __future__ import annotations`: see gpupin.core.errors (imported before the workload's paths leave
# sys.path).

# Not `from typing import TYPE_CHECKING`: importing typing alone costs ~2 ms of every container start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.entrypoint.api import assert_pinned as assert_pinned

__all__ = ["assert_pinned"]


def __getattr__(name: str) -> "Any":
    # Lazy, so that `import gpupin.entrypoint` costs nothing on the entrypoint's start-up path.
    if name == "assert_pinned":
        from gpupin.entrypoint.api import assert_pinned

        return assert_pinned
    raise AttributeError(name)
