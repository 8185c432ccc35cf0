"""gpupin's host side: resolve physical GPU requests through NVML and start pinned containers through the
Docker Engine, keeping a ledger (container labels) of who holds which card.

What every part of it says the same way is here: its name on stderr (`say`; an error's line is GpupinError.line's)
and how to install what the host side needs (INSTALL_HINT).
"""

import sys

PROG = "hostagent"
INSTALL_HINT = "install the host side: pip install 'gpupin[host]'"


def say(msg: str) -> None:
    """One line on stderr from hostagent (a warning, or what it is doing), beside the results on stdout."""
    sys.stderr.write(f"{PROG}: {msg}\n")
    sys.stderr.flush()
