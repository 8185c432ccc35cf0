"""Sizes as the docker CLI reads them: go-units' RAMInBytes, which every size option of `docker run` goes through
(--memory, --memory-reservation, --memory-swap, --shm-size, --mount's tmpfs-size). Sizes docker passes on as text
(--log-opt max-size, --storage-opt size, --tmpfs size=) are the daemon's to read, and hostagent passes them so too.

The grammar is that of the go-units both engines' CLIs vendor (v0.4, seen the same in Docker 20.10's and Engine
26's): digits with optional `.digits` groups, one optional space, then an optional unit letter k, m, g, t or p,
an optional `i` and an optional `b`, in any case; the unit is binary (k = 1024) whatever the spelling (16g, 16GB,
16GiB are all 16 x 2^30). The number is read as a float64 and truncated to whole bytes.
"""

from __future__ import annotations

import re

_SIZE = re.compile(r"(\d+(?:\.\d+)*) ?([kmgtp])?i?b?", re.ASCII | re.IGNORECASE)
_BINARY = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
_MAX = 2**63  # an int64: past it the CLI's conversion overflows; refused here


def ram_in_bytes(text: str) -> int:
    """The bytes of a size as `docker run --memory` reads it; ValueError on text the docker CLI refuses."""
    m = _SIZE.fullmatch(text)
    try:
        number = float(m.group(1)) if m else None  # "1.5.5" passes the pattern, not the float (as in Go)
    except ValueError:
        number = None
    if m is None or number is None:
        raise ValueError("not a size: give a number with an optional unit (b, k, m, g, t, p; 16g = 16GB = 16GiB)")
    unit = (m.group(2) or "").lower()
    size = int(number * _BINARY.get(unit, 1))
    if size >= _MAX:
        raise ValueError("more bytes than docker can take (an int64)")
    return size
