"""Where `hostagent run`'s time goes: phase marks for `make bench`'s breakdown, written only when GPUPIN_TRACE
names a file (one `PHASE WALLCLOCK` line per mark, appended); otherwise a mark costs one global lookup.

The phases, in order: main (the interpreter is up and hostagent's CLI imported), parsed, cards (NVML), connected
(docker SDK imported, API negotiated), locked (the ledger's lock taken), looked (the ledger read), attributed (the
cards' processes attributed), created, attached, started, exited (the container's exit learned), done.
"""

from __future__ import annotations

import os
import time

_PATH = os.environ.get("GPUPIN_TRACE") or None


def mark(phase: str) -> None:
    if _PATH is None:
        return
    with open(_PATH, "a", encoding="utf-8") as fh:
        fh.write(f"{phase} {time.time():.6f}\n")
