"""gpupin's core: what the in-container side (gpupin.entrypoint) and the host side (gpupin.hostagent) must agree
on, each written once (card identity, the NVML adapter, the expectation, the error tree, the contract's names).
Both import it and never each other. It needs the standard library and nvidia-ml-py only, and its import is
cheap on purpose: it is on the entrypoint's start-up path.
"""

# No `from __future__ import annotations` in this package's modules that the entrypoint imports before it takes the
# workload's paths out of sys.path (this one, errors, shown, contract): `__future__` is a module like any other.
# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.3.0"

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeAlias

    # An edge: a JSON object on the wire (a request body, an answer, a hook's payload), as parsed before it is read
    # into types, or as a serializer wrote it.
    JSONObject: TypeAlias = dict[str, Any]
