"""gpupin's GPU-identity core, shared by the in-container side (gpupin.entrypoint) and the host side
(gpupin.hostagent), which import it and never each other.

It holds what both sides must agree on, each written once: card identity and resolution (identity, resolve), the
NVML adapter (nvml, the one module that imports pynvml), the expectation grammar (expectation), the error tree and
its exit codes (errors), the contract's names and values (contract) and the rule for showing a user's value (shown).
Its dependencies are the standard library and nvidia-ml-py, as light as the entrypoint that loads it.

Importing this package is cheap on purpose: it is on the entrypoint's start-up path.
"""

# No `from __future__ import annotations` in this package's modules that the entrypoint imports before it takes the
# workload's paths out of sys.path (this one, errors, shown, contract): `__future__` is a module like any other.
# The one place the version is written: pyproject.toml reads it from here.
__version__ = "0.2.0"
