"""Who owns a container, as the resident agent can prove it: the uid it took at accept (SO_PEERCRED) for each
container it created, kept in `owners.json` in its folder (its socket's). Labels are the word of whoever created
the container, and anyone with the daemon's socket writes any label: a `gpupin.booking` that names a uid on a
container the agent did not create is a claim, counted for no one's quota and exempting nothing (docs/design.md,
"Who is trusted for what").

The file is written by the agent alone; a reader believes it only where no one but root (or the reader itself, for
an agent of its own) could have written it or its folder. Keyed by container id (a rename changes nothing; the
daemon makes ids, 256 random bits, never a caller); an entry whose container is gone is dropped by the agent.
"""

from __future__ import annotations

import json
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

STATE_FILE = "owners.json"
LIMIT = 1 << 22  # bytes of the file read at most: ~50,000 containers


def trusted(st: os.stat_result) -> bool:
    """Whether a file or folder could have been written only by root or this process's own uid."""
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def read(folder: str) -> dict[str, tuple[int, float]]:
    """The agent's owners (container id -> (uid, when it was noted)); {} when there is no file, it cannot be read,
    or it or its folder could have been written by someone else (nothing is then proven)."""
    return parse(_read(folder, STATE_FILE))


def _read(folder: str, name: str) -> object:
    """The agent's JSON file `name` in `folder`; None where it is absent, unreadable, or not trusted."""
    from gpupin.core.files import read_bounded

    path = os.path.join(folder, name)
    try:
        if not trusted(os.stat(folder)) or not trusted(os.lstat(path)):
            return None
        return json.loads(read_bounded(path, LIMIT))
    except Exception:  # absent, unreadable, not JSON: nothing proven
        return None


# What the authorization plugin let in under enforce mode `warn` that mode `on` would have refused: container id ->
# (the refusal's line, when it was noted), beside the owners, for `ls` and the page (docs/authz.md).
WARNED_FILE = "warned.json"


def read_warned(folder: str) -> dict[str, tuple[str, float]]:
    data = _read(folder, WARNED_FILE)
    if not isinstance(data, dict):
        return {}
    out: dict[str, tuple[str, float]] = {}
    for cid, entry in data.items():
        if isinstance(cid, str) and isinstance(entry, dict):
            line, at = entry.get("warned"), entry.get("at")
            if isinstance(line, str) and isinstance(at, (int, float)):
                out[cid] = (line, float(at))
    return out


def dump_warned(warned: Mapping[str, tuple[str, float]]) -> bytes:
    data = {c: {"warned": line, "at": round(t, 3)} for c, (line, t) in warned.items()}
    return (json.dumps(data, sort_keys=True) + "\n").encode()


def parse(data: object) -> dict[str, tuple[int, float]]:
    """The entries of the file's object ({id: {"uid": U, "at": T}}) that are of that form."""
    out: dict[str, tuple[int, float]] = {}
    if not isinstance(data, dict):
        return out
    for cid, entry in data.items():
        if not isinstance(cid, str) or not isinstance(entry, dict):
            continue
        uid, at = entry.get("uid"), entry.get("at")
        if isinstance(uid, int) and not isinstance(uid, bool) and uid >= 0 and isinstance(at, (int, float)):
            out[cid] = (uid, float(at))
    return out


def dump(owners: Mapping[str, tuple[int, float]]) -> bytes:
    data = {c: {"uid": u, "at": round(t, 3)} for c, (u, t) in owners.items()}
    return (json.dumps(data, sort_keys=True) + "\n").encode()


def uids(owners: Mapping[str, tuple[int, float]]) -> dict[str, int]:
    """Container id -> proven uid."""
    return {c: u for c, (u, _) in owners.items()}
