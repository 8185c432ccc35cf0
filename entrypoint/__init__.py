"""gpupin's in-container side and GPU-identity core.

`gpupin-entrypoint` (gpupin.entrypoint.cli) proves that every `cuda:k` a workload will see is the physical card that was
asked for, then execs the workload. `assert_pinned` (gpupin.entrypoint.api) does the same check from inside a running
Python workload. The host side (`hostagent`) imports the identity core from here, never the other way.

Importing this package is cheap on purpose: it is the first thing the entrypoint's hot path does.
"""

# No `from __future__ import annotations`: see gpupin.entrypoint.errors (imported before the workload's paths leave
# sys.path).
__version__ = "0.1.0"

# Not `from typing import TYPE_CHECKING`: importing typing alone costs ~2 ms of every container start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.entrypoint.api import assert_pinned as assert_pinned

__all__ = ["__version__", "assert_pinned"]


def __getattr__(name: str) -> "Any":
    # Lazy, so that `import gpupin.entrypoint` costs nothing on the entrypoint's start-up path.
    if name == "assert_pinned":
        from gpupin.entrypoint.api import assert_pinned

        return assert_pinned
    raise AttributeError(name)
